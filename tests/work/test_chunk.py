"""WorkChunk: pointer arrays per component, Zephon's list view, read order, row view, versioned state."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_columnar.errors import CheckpointError, ConfigError
from zephon_columnar.work import WorkChunk
from zephon_columnar.work.chunk import WORK_CHUNK_VERSION
from zephon_columnar.work.mixture import interleave_order

from ._helpers import json_round_trip


def pointers(d: int, n: int, start: int = 0) -> np.ndarray:
    return np.stack([np.full(n, d), np.zeros(n, int), np.arange(start, start + n)], axis=1).astype(np.int64)


def test_accepts_lists_of_tuples_and_arrays():
    c = WorkChunk({"a": [(0, 1, 2), (0, 1, 3)], "b": pointers(1, 3), "c": []})
    for name, n in (("a", 2), ("b", 3), ("c", 0)):
        arr = c.component_arrays[name]
        assert arr.dtype == np.int64 and arr.shape == (n, 3)
    assert len(c) == 5
    assert c.component_names == ("a", "b", "c")
    assert c.component_arrays["a"].tolist() == [[0, 1, 2], [0, 1, 3]]


def test_components_is_zephons_view_of_the_arrays():
    mine = pointers(1, 2, start=4)
    c = WorkChunk({"a": [(0, 1, 2)], "b": mine, "c": []})
    assert c.components == {"a": [(0, 1, 2)], "b": [(1, 0, 4), (1, 0, 5)], "c": []}
    assert all(type(v) is int for sid in c.components["b"] for v in sid)
    assert c.component_arrays["b"] is mine            # the engine's arrays are not copied
    c.components["b"].append((9, 9, 9))               # a view: editing it changes nothing
    assert len(c) == 3
    c.components = {"z": [(5, 0, 0)]}                 # assigning replaces the pointers
    assert c.component_names == ("z",) and list(c) == [((5, 0, 0), "z")]


def test_iterating_a_chunk_yields_the_engine_read_order():
    c = WorkChunk({"a": pointers(0, 3), "b": pointers(1, 1)})
    assert list(c) == list(c.iter_samples())
    assert [name for _, name in c] == ["a", "a", "b", "a"]  # interleave_order([3, 1])
    assert list(WorkChunk({})) == []


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


def test_state_is_zephons_version_3_schema():
    c = WorkChunk({"b": [(1, 0, 0)], "a": [(0, 0, 2), (0, 0, 3)]}, seed=9, source_exhausted=["z", "b"])
    assert c.state_dict() == {
        "version": WORK_CHUNK_VERSION,
        "seed": 9,
        "components": [("b", [[1, 0, 0]]), ("a", [[0, 0, 2], [0, 0, 3]])],
        "component_order": ["b", "a"],
        "total_samples": 3,
        "target_mixture": None,
        "source_exhausted": ["b", "z"],
    }
    assert WORK_CHUNK_VERSION == 3
    assert WorkChunk({}, global_index=4).state_dict()["global_index"] == 4  # ours, when known


@pytest.mark.parametrize("version", [1, 2])
def test_older_versions_restore(version):
    state = WorkChunk({"a": pointers(0, 2)}, target_mixture={"a": 2.0}).state_dict()
    state["version"] = version
    del state["source_exhausted"]
    back = WorkChunk.from_state(state)
    assert back.source_exhausted == () and back.component_arrays["a"].tolist() == pointers(0, 2).tolist()
    assert back.target_mixture == (None if version == 1 else {"a": 1.0})
    no_version = {"components": [["a", [[0, 0, 0]]]], "component_order": ["a"]}  # version 1, no total
    assert len(WorkChunk.from_state(no_version)) == 1


def test_component_order_reorders_the_components():
    state = {"version": 3, "components": [["b", [[1, 0, 0]]], ["a", [[0, 0, 0]]]], "component_order": ["a", "b"],
             "total_samples": 2, "target_mixture": None, "source_exhausted": []}
    assert WorkChunk.from_state(state).component_names == ("a", "b")


def test_construction_normalizes_target_and_sorts_exhaustion():
    c = WorkChunk({"a": [(0, 0, 0)]}, target_mixture={"a": 3, "b": 1}, source_exhausted=["z", "b"])
    assert c.target_mixture == {"a": 0.75, "b": 0.25}
    assert c.source_exhausted == ("b", "z")


@pytest.mark.parametrize("bad", [{}, {"a": 0.0}, {"a": -1.0}, {"a": float("nan")}])
def test_invalid_target_mixture_raises_naming_the_field(bad):
    with pytest.raises(ConfigError, match="target_mixture"):
        WorkChunk({"a": [(0, 0, 0)]}, target_mixture=bad)


@pytest.mark.parametrize("bad", [None, "a", [0], ["", "a"], ["a", "a"], {"a"}])
def test_invalid_source_exhausted_raises_naming_the_field(bad):
    with pytest.raises(ConfigError, match="source_exhausted"):
        WorkChunk({}, source_exhausted=bad)


def _state(**changes):
    state = WorkChunk({"a": [(0, 0, 0), (0, 0, 1)]}, seed=1).state_dict()
    state.update(changes)
    return {k: v for k, v in state.items() if v is not _DROP}


_DROP = object()


@pytest.mark.parametrize("state, fragment", [
    ({}, "components: missing"),
    ({"version": 1, "seed": 7}, "component_order: missing"),
    (_state(version=99), "newer than the supported version 3"),
    (_state(version=0), "not a version"),
    (_state(version="3"), "not a version"),
    (_state(source_exhausted=_DROP), "source_exhausted: missing"),
    (_state(version=2, target_mixture=_DROP, source_exhausted=_DROP), "target_mixture: missing"),
    (_state(source_exhausted=["b", "a"]), "source_exhausted: must be sorted"),
    (_state(source_exhausted=["a", "a"]), "source_exhausted: names a component twice"),
    (_state(source_exhausted="a"), "source_exhausted: must be a list"),
    (_state(components={"a": [[0, 0, 0]]}), "components: must be a list"),
    (_state(components=[["a", [[0, 0]]]]), "Bad SampleId for component a"),
    (_state(components=[["a", [[0, 0, 1.5]]]]), "Bad SampleId for component a"),
    (_state(components=[["a", [[0, 0, 0]]], ["a", []]]), "'a' appears twice"),
    (_state(component_order=["b"]), "component_order: \\['b'\\] does not name"),
    (_state(total_samples=99), "total_samples mismatch: payload=99, computed=2"),
    (_state(target_mixture={"a": -1}), "target_mixture"),
    (_state(seed="7"), "seed: must be an int"),
    ("not a dict", "a chunk state is a dict"),
])
def test_malformed_state_raises_checkpoint_error(state, fragment):
    with pytest.raises(CheckpointError, match=fragment):
        WorkChunk.from_state(state)


def test_state_of_a_full_size_chunk_round_trips_exactly():
    c = WorkChunk({"a": pointers(0, 9000), "b": pointers(1, 7384, start=2**40)})
    back = WorkChunk.from_state(json_round_trip(c.state_dict()))
    assert back == c and back.component_arrays["b"].dtype == np.int64
