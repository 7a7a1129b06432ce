"""Lanes: every lane enumerates the global stream and keeps only its own chunks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_columnar.errors import CheckpointError, ConfigError
from zephon_columnar.work.order import DatasetOrder

from ._helpers import drain, json_round_trip, make_ds, same_chunks, source, take


def build(mode="permute", **kw):
    dss = [make_ds("a", [17, 9]), make_ds("b", [23]), make_ds("c", [5, 5, 2])]
    args = dict(chunk_size=5, seed=11, lane_assignment=mode, shuffle_within_shard=True)
    args.update(kw)
    return source(dss, {"a": 0.5, "b": 0.3, "c": 0.2}, **args)


@given(replicas=st.integers(1, 8), mode=st.sampled_from(["permute", "modulo"]),
       passes=st.integers(1, 2))
@settings(max_examples=40, deadline=None)
def test_union_of_lanes_is_the_base_stream(replicas, mode, passes):
    base = drain(build(mode, stop_after_passes=passes))
    lanes = [drain(build(mode, stop_after_passes=passes).clone_for_lane(i, replicas)) for i in range(replicas)]
    merged = sorted((c for lane in lanes for c in lane), key=lambda c: c.global_index)
    assert same_chunks(merged, base)            # disjoint, complete, identical chunks
    for lane in lanes:
        assert [c.global_index for c in lane] == sorted(c.global_index for c in lane)


@pytest.mark.parametrize("replicas", [2, 3, 5, 8])
def test_permute_deals_one_chunk_per_lane_per_block(replicas):
    owners = {}
    for lane in range(replicas):
        for c in take(build(exhausted_policy="repeat").clone_for_lane(lane, replicas), 12):
            owners[c.global_index] = lane
    for b in range(12):
        block = [owners[g] for g in range(b * replicas, (b + 1) * replicas)]
        assert sorted(block) == list(range(replicas))
        assert block == np.random.default_rng([11, b, 7]).permutation(replicas).tolist()
    assert any(owners[g] != g % replicas for g in owners)    # really permuted, not modulo


def test_modulo_assignment():
    lane = build("modulo", exhausted_policy="repeat").clone_for_lane(2, 3)
    assert [c.global_index for c in take(lane, 5)] == [2, 5, 8, 11, 14]


def test_lane_totals_add_up_to_the_base_total():
    base = build(stop_after_passes=2)
    lanes = [build(stop_after_passes=2).clone_for_lane(i, 3) for i in range(3)]
    assert sum(lane.total_samples for lane in lanes) == base.total_samples
    for lane in lanes:
        expected = lane.total_samples
        lane.next_chunk()
        remaining = lane.total_samples
        assert sum(map(len, drain(lane))) == remaining < expected


@given(replicas=st.integers(2, 5), lane=st.integers(0, 4), cut=st.integers(0, 8))
@settings(max_examples=30, deadline=None)
def test_lane_state_round_trip_equals_uninterrupted(replicas, lane, cut):
    lane %= replicas
    full = drain(build(stop_after_passes=2).clone_for_lane(lane, replicas))
    ws = build(stop_after_passes=2).clone_for_lane(lane, replicas)
    head = take(ws, cut)
    resumed = build(stop_after_passes=2).clone_for_lane(lane, replicas)
    resumed.load_state_dict(json_round_trip(ws.state_dict()))
    assert same_chunks(head + drain(resumed), full)


def test_state_of_another_lane_is_refused():
    state = json_round_trip(build().clone_for_lane(1, 4).state_dict())
    with pytest.raises(CheckpointError, match="lane_id=1, canonical_replicas=4"):
        build().clone_for_lane(2, 4).load_state_dict(state)
    with pytest.raises(CheckpointError, match="canonical_replicas"):
        build().load_state_dict(state)


def test_lanes_materialize_only_the_chunks_they_own(monkeypatch):
    calls = []
    real = DatasetOrder.take

    def counting(self, epoch, start, n, out=None):
        calls.append(n)
        return real(self, epoch, start, n, out=out)

    monkeypatch.setattr(DatasetOrder, "take", counting)
    take(build(exhausted_policy="repeat"), 40)
    base_calls = len(calls)
    calls.clear()
    lane = build(exhausted_policy="repeat").clone_for_lane(3, 8)
    got = take(lane, 5)                      # 5 of the first 40 global chunks
    assert max(c.global_index for c in got) < 40
    assert 0 < len(calls) <= base_calls / 8 * 1.5


def test_clones_are_independent():
    base = build(exhausted_policy="repeat")
    one, two = base.clone_for_lane(0, 2), base.clone_for_lane(0, 2)
    first = take(one, 3)
    assert same_chunks(take(two, 3), first)
    assert base.state_dict()["global_chunk_index"] == 0


@pytest.mark.parametrize("lane, replicas", [(2, 2), (-1, 2), (0, 0), (0.5, 2)])
def test_bad_lane_arguments(lane, replicas):
    with pytest.raises(ConfigError, match="lane_id|canonical_replicas"):
        build().clone_for_lane(lane, replicas)
