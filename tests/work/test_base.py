"""WorkSource defaults, exercised through a minimal subclass."""

from __future__ import annotations

import math

import pytest

from zephon_columnar.errors import ConfigError
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


def test_abstract_members_are_required():
    with pytest.raises(TypeError):
        WorkSource()  # type: ignore[abstract]


def test_defaults():
    ws = OneChunk()
    assert ws.total_samples == math.inf
    with pytest.raises(TypeError, match="unbounded"):
        len(ws)
    assert ws.chunk_size_hint() is None
    assert ws.continues_after_exhaustion() == frozenset()
    assert ws.recipe() == {"class": f"{__name__}.OneChunk"}


def test_default_clone_is_a_deep_copy_for_one_lane_only():
    ws = OneChunk()
    clone = ws.clone_for_lane(0, 1)
    assert clone is not ws and clone.ds is not ws.ds
    assert len(clone.next_chunk()) == 3 and ws.done is False
    with pytest.raises(ConfigError, match="cannot be split into 2 lanes"):
        ws.clone_for_lane(1, 2)
