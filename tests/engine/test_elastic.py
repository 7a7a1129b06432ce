"""Elasticity: lanes are the unit of data order; data-parallel groups only change ownership."""

from __future__ import annotations

import json
import threading
from collections import Counter

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.engine.ownership import owned_lanes
from zephon_columnar.errors import CheckpointError, ConfigError
from zephon_columnar.testing import collect, signature

DS = Dataset.from_tables("a", [pa.table({"id": list(range(s * 50, s * 50 + 50))}) for s in range(4)])
LANES = 4


def build(groups: int, group: int, **opts):
    ws = StaticMixtureWorkSource([DS], {"a": 1.0}, chunk_size=8, seed=11, shuffle_within_shard=True)
    return Pipeline(ws).batch(2).options(runner="inline", canonical_replicas=LANES, world_size=groups,
                                         global_rank=group, **opts)


def steps(per_group: list[list[tuple]], per_step: int) -> list[Counter]:
    """Global steps: each group contributes its next ``per_step`` batches."""
    n = min(len(g) for g in per_group) // per_step
    return [Counter(sig for g in per_group for sig in g[s * per_step:(s + 1) * per_step]) for s in range(n)]


@pytest.mark.parametrize("mapping", ["contiguous", "interleaved"])
@pytest.mark.parametrize("groups", [1, 2, 4])
def test_global_steps_equal_single_group(groups, mapping):
    single = collect(build(1, 0))
    parts = [collect(build(groups, g, mapping_strategy=mapping)) for g in range(groups)]
    ref = steps([single], LANES)
    got = steps(parts, LANES // groups)
    assert len(got) >= 5
    assert got == ref[:len(got)]
    assert sorted(s for p in parts for s in p) == sorted(single)  # same batches overall


def test_owned_lanes_partition():
    for mapping in ("contiguous", "interleaved"):
        for groups in (1, 2, 3, 4):
            owned = [owned_lanes(canonical_replicas=4, dp_degree=groups, dp_group_id=g, mapping=mapping)
                     for g in range(groups)]
            assert sorted(x for o in owned for x in o) == [0, 1, 2, 3]
    with pytest.raises(ConfigError, match="canonical_replicas"):
        owned_lanes(canonical_replicas=2, dp_degree=4, dp_group_id=0, mapping="contiguous")


def take(pipe, k):
    it = iter(pipe)
    head = [signature(next(it)) for _ in range(k)]
    return it, head


@pytest.mark.parametrize("resume_groups", [1, 2, 4])
def test_checkpoint_on_two_groups_resumes_on_n_without_skip_or_repeat(resume_groups):
    everything = Counter(collect(build(1, 0)))
    # Two groups each take 3 steps' worth (2 batches per step per group).
    heads, ckpts = [], []
    for g in range(2):
        pipe = build(2, g)
        it, head = take(pipe, 6)
        heads += head
        ckpts.append(json.loads(json.dumps(pipe.checkpoint())))
        it.close()
    merged = Pipeline.merge_checkpoints(ckpts)
    rest = []
    for g in range(resume_groups):
        pipe = build(resume_groups, g)
        pipe.restore(merged)
        rest += collect(pipe)
    assert Counter(heads) + Counter(rest) == everything


def test_restore_with_missing_lanes_names_them():
    pipe = build(2, 0)
    it, _ = take(pipe, 2)
    partial = pipe.checkpoint()
    it.close()
    with pytest.raises(CheckpointError, match="missing"):
        build(1, 0).restore(partial)


def by_lane(sigs: list[tuple]) -> dict[int, list[tuple]]:
    """Each lane's batches, in delivery order (sig[1] is the lane id)."""
    out: dict[int, list[tuple]] = {}
    for sig in sigs:
        out.setdefault(sig[1], []).append(sig)
    return out


def test_iteration_needs_no_aggregation_directory():
    # Without aggregate_dir, rank 1 of 2 iterates on its own: exactly the batches of the lanes it
    # owns (default mapping: contiguous), each lane in the order a single group delivers it.
    owned = owned_lanes(canonical_replicas=LANES, dp_degree=2, dp_group_id=1, mapping="contiguous")
    single = by_lane(collect(build(1, 0)))
    assert sorted(single) == list(range(LANES))
    assert by_lane(collect(build(2, 1))) == {lane: single[lane] for lane in owned}


def test_checkpoint_merges_through_a_shared_directory(tmp_path):
    results: dict[int, dict] = {}
    heads: dict[int, list[tuple]] = {}
    errors: list[BaseException] = []

    def rank(g):
        try:
            pipe = build(2, g, aggregate_dir=str(tmp_path), run_id="run-x", aggregate_timeout_s=30)
            it, heads[g] = take(pipe, 3)
            results[g] = pipe.checkpoint()
            it.close()
        except BaseException as err:  # pragma: no cover - surfaced below
            errors.append(err)

    threads = [threading.Thread(target=rank, args=(g,)) for g in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert results[0] == results[1]
    assert sorted(results[0]["lanes"]) == ["0", "1", "2", "3"]
    resumed = build(1, 0)
    resumed.restore(results[0])
    # The merged checkpoint resumes every lane right after what either rank delivered: per lane,
    # the ranks' batches then the resumed ones are the uninterrupted single-group stream.
    delivered, rest = by_lane(heads[0] + heads[1]), by_lane(collect(resumed))
    single = by_lane(collect(build(1, 0)))
    assert {lane: delivered.get(lane, []) + rest.get(lane, []) for lane in single} == single


def test_directory_aggregation_times_out_with_a_clear_error(tmp_path):
    pipe = build(2, 0, aggregate_dir=str(tmp_path), aggregate_timeout_s=0.3)
    it, _ = take(pipe, 1)
    with pytest.raises(CheckpointError, match="waited"):
        pipe.checkpoint()
    it.close()


@settings(max_examples=20, deadline=None)
@given(lanes=st.integers(1, 6), data=st.data(), batch=st.integers(1, 3), chunk=st.integers(1, 9),
       seed=st.integers(0, 50))
def test_n_groups_equal_one_group_property(lanes, data, batch, chunk, seed):
    groups = data.draw(st.sampled_from([g for g in range(1, lanes + 1) if lanes % g == 0]))
    mapping = data.draw(st.sampled_from(["contiguous", "interleaved"]))

    def make(g_count, g):
        ws = StaticMixtureWorkSource([DS], {"a": 1.0}, chunk_size=chunk, seed=seed)
        return Pipeline(ws).batch(batch).options(runner="inline", canonical_replicas=lanes, world_size=g_count,
                                                 global_rank=g, mapping_strategy=mapping)

    single = collect(make(1, 0))
    parts = [collect(make(groups, g)) for g in range(groups)]
    # Global steps agree while every lane still has batches; once lanes run out unevenly at the
    # end of the stream, which group serves the last batches depends on ownership.
    full_steps = min(Counter(sig[1] for sig in single).get(lane, 0) for lane in range(lanes))
    assert steps(parts, lanes // groups)[:full_steps] == steps([single], lanes)[:full_steps]
    assert Counter(s for p in parts for s in p) == Counter(single)


def test_directory_aggregation_ignores_an_earlier_jobs_files(tmp_path):
    import os
    import time

    # An earlier job with the same run_id left every rank's part of round 1 behind.
    old = tmp_path / "run-y" / "round-000001"
    old.mkdir(parents=True)
    for r in range(2):
        (old / f"rank-{r:05d}.json").write_text("{}")
        os.utime(old / f"rank-{r:05d}.json", (time.time() - 3600, time.time() - 3600))
    pipe = build(2, 0, aggregate_dir=str(tmp_path), run_id="run-y", aggregate_timeout_s=0.5)
    it, _ = take(pipe, 1)
    with pytest.raises(CheckpointError, match="waited"):  # rank 1 of this job never wrote its part
        pipe.checkpoint()
    it.close()
