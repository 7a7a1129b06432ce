"""Execution tracking (``enable_observability``): per-operator and per-stage counters on every
runner and in mtp mode, the fetch and prefetch timing snapshots, and nothing at all when off."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import zephon_columnar as zephon
from tests.engine.test_mtp import build, rows
from zephon_columnar.observability import FetchTimingSummary

SHARD_KEYS = {(0, s) for s in range(4)}  # build()'s one dataset of four in-memory shards


def ops_of(pipe) -> dict:
    return {(r["stage"], r["op"]): r for r in pipe.metrics_snapshot().to_records() if "op" in r}


def test_off_by_default_and_then_nothing_is_tracked():
    pipe = build("stateful", mtp=False)
    it = iter(pipe)
    next(it)
    assert pipe.session.run.metrics is None  # noqa: SLF001 - no tracking object: no tracking code runs
    assert pipe.fetch_timing_snapshot() is None and pipe.inflight_summary() is None
    assert all("op" not in r for r in pipe.metrics_snapshot().to_records())
    it.close()


@pytest.mark.parametrize("mtp", [False, True])
@pytest.mark.parametrize("runner", ["inline", "threads", "process"])
def test_counters_follow_every_operator_and_tracking_changes_no_data(runner, mtp):
    expected = [rows(b) for b in build("stateful", mtp=False)]
    pipe = build("stateful", mtp=mtp, runner=runner).enable_observability("stages")
    assert [rows(b) for b in pipe] == expected
    ops = ops_of(pipe)
    assert set(ops) == {(0, "fetch"), ("ordered", "shuffle"), ("ordered", "pack_flat")}
    assert ops[(0, "fetch")]["rows_out"] == 120 and ops[(0, "fetch")]["bytes_out"] > 0
    assert ops[("ordered", "shuffle")]["rows_in"] == ops[("ordered", "shuffle")]["rows_out"] == 120
    assert ops[("ordered", "pack_flat")]["rows_in"] == 120
    packed = ops[("ordered", "pack_flat")]["rows_out"]
    assert 0 <= packed - sum(len(b) for b in expected) < 3  # batch(3, drop_last=True) drops the rest
    assert all(r["busy_s"] > 0 and r["calls"] > 0 for r in ops.values())
    stages = [r for r in pipe.metrics_snapshot().to_records() if "wait_s" in r]
    assert [s["stage"] for s in stages] == [0] and stages[0]["max_in_flight"] >= 1
    fetch = pipe.fetch_timing_snapshot()
    assert isinstance(fetch, FetchTimingSummary) and list(fetch.stages) == [0]
    stage = fetch.stages[0]
    assert stage.totals.samples == 120 and stage.totals.read_ns > 0
    assert stage.totals.groups >= ops[(0, "fetch")]["calls"]  # a frame reads one group per shard in it
    assert sum(t.samples for t in stage.shard_totals.values()) == 120
    assert set(stage.shard_totals) == SHARD_KEYS  # every shard of the test data, by (dataset_id, shard_id)
    assert stage.totals.cache_hits == stage.totals.cache_misses == 0  # in-memory shards need no cache
    records = fetch.to_records()
    assert records[0]["shard_id"] is None and records[0]["samples"] == 120 and len(records) == 1 + len(SHARD_KEYS)


def test_in_flight_frames_are_reported_per_stage_and_lane_while_iterating():
    pipe = build("stateless", mtp=False, runner="threads").enable_observability("nodes")
    it = iter(pipe)
    next(it), next(it)  # one item of each lane
    summary = pipe.inflight_summary()
    assert set(summary) == {0} and set(summary[0]) == {0, 1}
    assert all(0 <= n <= pipe.spec.options.resolved_queue_capacity() for n in summary[0].values())  # noqa: SLF001
    it.close()


def test_bad_tracking_mode_is_a_value_error_naming_the_option():
    with pytest.raises(ValueError, match="execution_tracking"):
        build("stateless", mtp=False).enable_observability("everything")


def test_fetch_and_prefetch_timing_count_remote_shard_downloads(tmp_path, monkeypatch):
    import fsspec

    from zephon_columnar.io import fs

    monkeypatch.setenv("ZEPHON_COLUMNAR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(fs, "_default_cache", None)
    mem = fsspec.filesystem("memory")
    for s in range(3):
        pq.write_table(pa.table({"id": list(range(s * 10, s * 10 + 10))}), tmp_path / f"p{s}.parquet")
        mem.pipe(f"/zc-metrics/web/p{s}.parquet", (tmp_path / f"p{s}.parquet").read_bytes())
    ds = zephon.Dataset.from_path("web", "memory:///zc-metrics/web")
    pipe = (zephon.Pipeline(zephon.StaticMixtureWorkSource([ds], {"web": 1.0}, chunk_size=10)).prefetch(4, 2)
            .batch(5).options(runner="threads").enable_observability())
    assert sum(len(b) for b in pipe) == 30
    prefetch = pipe.prefetch_timing_snapshot().stages[0]
    assert prefetch.prefetch_requests == 3 and prefetch.prefetch_succeeded + prefetch.prefetch_failed <= 3
    assert prefetch.samples == 30 and prefetch.batches == 3  # three chunks of ten pointers
    fetch = pipe.fetch_timing_snapshot()
    assert fetch.cache["downloads"] == 3 and fetch.cache["evictions"] == 0
    # Each shard: downloaded once (by prefetch, or by fetch when it came first), then read from the copy.
    totals = fetch.stages[0].shard_totals
    assert set(totals) == {(0, 0), (0, 1), (0, 2)} and all(t.samples == 10 for t in totals.values())
    # A prefetch request that finds the shard fetch downloaded first succeeds too, but moved no
    # bytes (once counted as moved: the sum below then came to 4 on a loaded host): prefetch's
    # bytes are those of the shards fetch did not download.
    sizes = [(tmp_path / f"p{s}.parquet").stat().st_size for s in range(3)]
    prefetched = 3 - fetch.stages[0].totals.cache_misses
    assert prefetch.bytes in {sum(c) for c in itertools.combinations(sizes, prefetched)}
    mem.rm("/zc-metrics", recursive=True)


@pytest.mark.parametrize("mtp", [False, True])
def test_prefetch_timing_counts_what_the_running_engine_warmed_in_mtp_mode_too(tmp_path, mtp):
    # With mtp_mode the engine runs in a side process: the counters were read from the driver's
    # copy of the engine, which never runs, so they stayed at zero (found reading the code).
    for s in range(3):
        pq.write_table(pa.table({"id": list(range(s * 10, s * 10 + 10))}), tmp_path / f"p{s}.parquet")
    ds = zephon.Dataset.from_path("web", str(tmp_path))
    pipe = (zephon.Pipeline(zephon.StaticMixtureWorkSource([ds], {"web": 1.0}, chunk_size=10)).prefetch(4, 2)
            .batch(5).options(runner="threads", mtp_mode=mtp))
    it = iter(pipe)
    assert sum(len(next(it)) for _ in range(2)) == 10
    during = pipe.prefetch_timing_snapshot().stages[0]
    assert during.batches >= 1 and during.samples >= 10  # at least the chunk being read
    assert sum(len(b) for b in it) == 20
    after = pipe.prefetch_timing_snapshot().stages[0]  # kept once the pass is over
    assert after.samples == 30 and after.batches == 3  # three chunks of ten pointers
    assert after.prefetch_requests == 0  # local files are read in place: nothing to download
