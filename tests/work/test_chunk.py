"""WorkChunk: pointer arrays per component, read order, row view, JSON state."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_columnar.errors import CheckpointError, ConfigError
from zephon_columnar.work import WorkChunk
from zephon_columnar.work.mixture import interleave_order

from ._helpers import json_round_trip


def pointers(d: int, n: int, start: int = 0) -> np.ndarray:
    return np.stack([np.full(n, d), np.zeros(n, int), np.arange(start, start + n)], axis=1).astype(np.int64)


def test_accepts_lists_of_tuples_and_arrays():
    c = WorkChunk({"a": [(0, 1, 2), (0, 1, 3)], "b": pointers(1, 3), "c": []})
    for name, n in (("a", 2), ("b", 3), ("c", 0)):
        arr = c.components[name]
        assert arr.dtype == np.int64 and arr.shape == (n, 3)
    assert len(c) == 5
    assert c.component_names == ("a", "b", "c")
    assert c.components["a"].tolist() == [[0, 1, 2], [0, 1, 3]]


@pytest.mark.parametrize("bad", [[(0, 1)], [[0, 1, 2, 3]], np.zeros((2, 3, 1))])
def test_bad_pointer_shape_names_the_component(bad):
    with pytest.raises(ConfigError, match="'web'.*shape"):
        WorkChunk({"web": bad})


def test_mixture_is_the_composition_of_non_empty_components():
    c = WorkChunk({"a": pointers(0, 3), "empty": [], "b": pointers(1, 1)})
    assert c.mixture == {"a": 0.75, "b": 0.25}


@given(st.lists(st.integers(0, 12), min_size=1, max_size=5))
@settings(max_examples=60, deadline=None)
def test_ordered_interleaves_and_keeps_each_component_order(counts):
    comps = {f"c{k}": pointers(k, n, start=100 * k) for k, n in enumerate(counts)}
    c = WorkChunk(comps)
    ptrs, comp = c.ordered()
    assert ptrs.shape == (sum(counts), 3) and comp.dtype == np.int32
    assert comp.tolist() == interleave_order(counts).tolist()
    for k, name in enumerate(c.component_names):
        assert np.array_equal(ptrs[comp == k], comps[name])     # own order kept
    assert (ptrs[:, 0] == comp).all()                            # dataset id follows the component


def test_ordered_arrays_are_read_only_and_callers_arrays_untouched():
    mine = pointers(0, 4)
    c = WorkChunk({"a": mine})
    ptrs, comp = c.ordered()
    assert not ptrs.flags.writeable and not comp.flags.writeable
    assert mine.flags.writeable
    assert c.ordered()[0] is ptrs  # computed once


def test_iter_samples_is_the_row_view_of_ordered():
    c = WorkChunk({"a": pointers(0, 3), "b": pointers(1, 2, start=7)})
    rows = list(c.iter_samples())
    ptrs, comp = c.ordered()
    assert [sid for sid, _ in rows] == [tuple(p) for p in ptrs.tolist()]
    assert [name for _, name in rows] == [c.component_names[k] for k in comp.tolist()]
    assert all(type(v) is int for sid, _ in rows for v in sid)


def test_state_round_trips_through_json():
    c = WorkChunk({"a": pointers(0, 3), "b": [], "c": pointers(2, 2)}, seed=7,
                  target_mixture={"a": 0.6, "c": 0.4}, source_exhausted=("b",), global_index=12)
    back = WorkChunk.from_state(json_round_trip(c.state_dict()))
    assert back == c
    assert back.component_names == ("a", "b", "c")
    assert np.array_equal(back.ordered()[0], c.ordered()[0])
    assert (back.seed, back.target_mixture, back.source_exhausted, back.global_index) == (
        7, {"a": 0.6, "c": 0.4}, ("b",), 12)
    assert c != WorkChunk({"a": pointers(0, 3), "b": [], "c": pointers(2, 2)})


@pytest.mark.parametrize("state", [{}, {"version": 99, "components": {}},
                                   {"version": 1, "components": {"a": [[1, 2]]}}])
def test_malformed_state_raises_checkpoint_error(state):
    with pytest.raises(CheckpointError):
        WorkChunk.from_state(state)
