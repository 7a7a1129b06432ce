"""WorkSource defaults, exercised through a minimal subclass."""

from __future__ import annotations

import math
import warnings

import pytest

from zephon_columnar.errors import CheckpointError, ConfigError, ConfigurationWarning
from zephon_columnar.work import WorkChunk, WorkSource

from ._helpers import make_ds


class OneChunk(WorkSource):
    def __init__(self):
        self.ds = make_ds("toy", [3])
        self.done = False

    def next_chunk(self):
        if self.done:
            return None
        self.done = True
        return WorkChunk({"toy": [(0, 0, i) for i in range(3)]})

    def state_dict(self):
        return {"done": self.done}

    def load_state_dict(self, state):
        self.done = state["done"]

    def component_ids(self):
        return {"toy": 0}

    @property
    def datasets_by_id(self):
        return {0: self.ds}


def test_the_members_every_source_implements_raise_until_implemented():
    ws = WorkSource()  # Zephon's base is instantiable; its required members raise when called
    for call in (ws.next_chunk, ws.component_ids, lambda: ws.datasets_by_id):
        with pytest.raises(NotImplementedError, match="must implement"):
            call()
    assert ws.continues_after_exhaustion() == frozenset() and ws.requires_token_priming is False


def test_the_base_state_is_the_lane_identity_and_refuses_another_lane():
    clone = WorkSource().clone_for_lane(0, 1)
    assert clone.state_dict() == {"lane_id": 0, "canonical_replicas": 1, "chunk_size_hint": None}
    clone.load_state_dict(clone.state_dict())
    with pytest.raises(CheckpointError, match="lane 1 of 1"):
        clone.load_state_dict({"lane_id": 1, "canonical_replicas": 1})
    with pytest.raises(CheckpointError, match="no lane identity"):
        clone.load_state_dict({"pos": 3})


def test_defaults():
    ws = OneChunk()
    assert ws.total_samples == math.inf
    with pytest.raises(TypeError, match="unbounded"):
        len(ws)
    assert ws.chunk_size_hint() is None
    assert ws.continues_after_exhaustion() == frozenset()
    assert ws.recipe() == {"class": f"{__name__}.OneChunk"}


def test_default_clone_is_a_deep_copy_bound_to_its_lane():
    ws = OneChunk()
    clone = ws.clone_for_lane(0, 1)
    assert clone is not ws and clone.ds is not ws.ds
    assert len(clone.next_chunk()) == 3 and ws.done is False
    assert (clone._lane, clone._canon, ws._lane) == (0, 1, None)  # Zephon's base fields, read by subclasses
    with pytest.raises(ConfigError, match="already lane 0's clone"):
        clone.clone_for_lane(0, 1)


def test_default_clone_for_several_lanes_warns_that_the_subclass_must_split():
    # Zephon's default clones for any lane count; a next_chunk that ignores self._lane would give
    # every lane the same data, which this source does: the warning says so, once (lane 0).
    ws = OneChunk()
    with pytest.warns(ConfigurationWarning, match="every lane reads the same data"):
        first = ws.clone_for_lane(0, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second = ws.clone_for_lane(1, 2)
    assert (first._lane, second._lane, second._canon) == (0, 1, 2)


def test_the_base_state_check_refuses_another_lane():
    clone = OneChunk().clone_for_lane(0, 1)
    clone._verify_base_state(0, 1)
    with pytest.raises(CheckpointError, match="lane 1 of 2"):
        clone._verify_base_state(1, 2)


class Indexed(OneChunk):
    """Zephon's indexing API: supports_indexing, __len__, sample_id_at."""

    def supports_indexing(self):
        return True

    def __len__(self):
        return 3

    def sample_id_at(self, index):
        return (0, 0, 2 - index)


def test_default_positions_come_from_zephons_indexing_api():
    pos = Indexed().positions()
    assert len(pos) == 3
    assert pos.locate([0, 1, 2]).pointers.tolist() == [[0, 0, 2], [0, 0, 1], [0, 0, 0]]
    with pytest.raises(ConfigError, match="no sample positions"):
        OneChunk().positions()
