"""Storage options: Zephon's `StoreOptions` / `CacheOptions` shapes, and the shard cache's root
and ``limit_bytes`` taking effect (least recently used copies evicted) through ``io_options``."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import zephon_columnar as zephon
from tests.io.conftest import cache_files
from zephon_columnar.errors import ConfigError
from zephon_columnar.io import fs, locks
from zephon_columnar.io.options import CacheOptions, ParquetOptions, ParquetRGCacheOptions, StoreOptions, parse_bytes


def test_from_any_takes_none_an_instance_or_a_dict_with_nested_dicts():
    assert StoreOptions.from_any(None) == StoreOptions()
    opts = StoreOptions.from_any({"cache": {"enabled": True, "root": "/c", "limit_bytes": "50gb"},
                                  "parquet": {"rg_cache": {"enabled": True}}})
    assert opts.cache == CacheOptions(enabled=True, root="/c", limit_bytes=50 * 2**30)
    assert isinstance(opts.parquet, ParquetOptions) and opts.parquet.rg_cache.enabled
    assert StoreOptions.from_any(opts) is opts
    assert CacheOptions.from_any({"enabled": True, "root": "/d", "limit_bytes": 123}).limit_bytes == 123


def test_merge_sets_only_what_the_other_gives():
    base = StoreOptions(cache=CacheOptions(root="/a", limit_bytes=5))
    assert base.merge({"cache": {"enabled": True}}).cache == CacheOptions(enabled=True, root="/a", limit_bytes=5)
    assert base.merge(StoreOptions(cache=CacheOptions(limit_bytes="1kib"))).cache.limit_bytes == 1024
    assert base.merge(None) is base


@pytest.mark.parametrize("value, fragment", [
    ({"cache": {"size": 3}}, "size"),
    ({"caches": {}}, "caches"),
    ({"cache": {"limit_bytes": "lots"}}, "limit_bytes"),
    ({"cache": {"limit_bytes": -1}}, "limit_bytes"),
    ({"cache": {"download_retry": -2}}, "download_retry"),
    (42, "StoreOptions"),
])
def test_bad_io_options_raise_at_options_naming_the_key(web_dir, value, fragment):
    ds = zephon.Dataset.from_path("web", str(web_dir))
    pipe = zephon.Pipeline(zephon.StaticMixtureWorkSource([ds], {"web": 1.0}))
    with pytest.raises(ValueError, match=fragment):
        pipe.options(io_options=value)


def test_parse_bytes_units():
    assert [parse_bytes(v, what="x") for v in (0, "10", "2kb", "2KiB", "1.5mb", " 3 GB ")] == \
        [0, 10, 2048, 2048, 1_572_864, 3 * 2**30]


def test_shard_cache_evicts_the_least_recently_used_copies_past_its_limit(tmp_path, memfs):
    mem, root = memfs
    urls = [f"{root}/s{i}.bin" for i in range(4)]
    for u in urls:
        mem.pipe(u, b"x" * 1000)
    cache = fs.ShardCache(str(tmp_path / "cache"), limit_bytes=2500)
    a, b = cache.ensure_local(urls[0]), cache.ensure_local(urls[1])
    os.utime(a, ns=(1, 1)), os.utime(b, ns=(2, 2))  # a is the older
    assert cache.ensure_local(urls[0]) == a  # a hit makes a the most recent
    cache.ensure_local(urls[2])  # 3000 bytes > 2500: b goes
    assert sorted(cache_files(tmp_path / "cache")) == sorted(os.path.basename(p) for p in (a, cache.cached_path(
        urls[2], 1000)))
    assert (cache.downloads, cache.hits, cache.evictions) == (3, 1, 1)
    cache.ensure_local(urls[1])  # downloaded again
    assert cache.downloads == 4 and sum(os.path.getsize(tmp_path / "cache" / f)
                                        for f in cache_files(tmp_path / "cache")) <= 2500


def test_a_download_finished_by_another_process_while_the_limit_is_checked_still_counts(tmp_path, memfs,
                                                                                       monkeypatch):
    """Another rank's download of s1 (its claim held, its grant written, its temp file full) ends
    while this rank checks the limit for s2: its copy renamed into place, then its grant cleared,
    between the two listings the check makes. Counted either way, it makes s0 go."""
    mem, root = memfs
    urls = [f"{root}/s{i}.bin" for i in range(3)]
    for u in urls:
        mem.pipe(u, b"x" * 1000)
    folder = str(tmp_path / "cache")
    cache = fs.ShardCache(folder, limit_bytes=2500)
    cache.ensure_local(urls[0])
    theirs = cache.cached_path(urls[1], 1000)
    listed = os.scandir

    with locks.held(folder, os.path.basename(theirs)) as claim:
        assert claim is not None
        locks.grant(claim, 1000)
        with open(theirs + ".tmp-other", "wb") as f:
            f.write(b"x" * 1000)

        def scandir_then_theirs_ends(path):
            with listed(path) as it:
                entries = list(it)
            if sys._getframe(1).f_code.co_name == "_evict" and os.path.exists(theirs + ".tmp-other"):
                os.replace(theirs + ".tmp-other", theirs)
                locks.grant(claim, 0)
            return contextlib.nullcontext(entries)

        monkeypatch.setattr(os, "scandir", scandir_then_theirs_ends)
        cache.ensure_local(urls[2])
        monkeypatch.undo()
    on_disk = {f: os.path.getsize(os.path.join(folder, f)) for f in cache_files(tmp_path / "cache")}
    assert sum(on_disk.values()) <= 2500, on_disk
    assert sorted(on_disk) == sorted(os.path.basename(cache.cached_path(u, 1000)) for u in urls[1:])


@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_io_options_cache_root_and_limit_take_effect_in_a_pipeline(tmp_path, memfs, runner):
    mem, root = memfs
    for s in range(4):
        local = tmp_path / f"part-{s}.parquet"
        pq.write_table(pa.table({"id": list(range(s * 50, s * 50 + 50))}), local)
        mem.pipe(f"{root}/web/part-{s}.parquet", local.read_bytes())
    shard_bytes = max(mem.size(f"{root}/web/part-{s}.parquet") for s in range(4))
    ds = zephon.Dataset.from_path("web", f"{root}/web")
    cache_dir = tmp_path / "cache"
    pipe = (zephon.Pipeline(zephon.StaticMixtureWorkSource([ds], {"web": 1.0}, chunk_size=50, shuffle_shards=False))
            .batch(10).options(runner=runner, io_options={"cache": {"enabled": True, "root": str(cache_dir),
                                                                     "limit_bytes": int(shard_bytes * 2.5)}}))
    ids = [r.payload["id"] for b in pipe for r in b.records]
    assert sorted(ids) == list(range(200))  # nothing lost to an eviction
    copies = cache_files(cache_dir)
    assert 1 <= len(copies) <= 2  # four shards read, at most two kept
    assert sum(os.path.getsize(cache_dir / f) for f in copies) <= shard_bytes * 2.5


def _cache_settings(row: dict) -> dict:
    import time

    from zephon_columnar.io import fs as worker_fs

    time.sleep(0.01)  # long enough a job that the workers start before it ends
    cache = worker_fs.default_shard_cache()
    return {**row, "root": cache.root, "limit": cache.limit_bytes, "pid": os.getpid()}


def test_process_workers_read_through_the_cache_io_options_name(tmp_path, web_dir):
    import time

    ds = zephon.Dataset.from_path("web", str(web_dir))
    ws = zephon.StaticMixtureWorkSource([ds], {"web": 1.0}, chunk_size=40, exhausted_policy="repeat")
    pipe = (zephon.Pipeline(ws).fetch(max_batch=4).map_transform(_cache_settings).batch(8)
            .options(runner="process", max_workers=1,
                     io_options=StoreOptions(cache=CacheOptions(root=str(tmp_path / "c"), limit_bytes="3mb"))))
    rows, deadline = [], time.monotonic() + 60
    for batch in pipe:  # the driver runs the first frames itself while the worker starts
        rows += [r.payload for r in batch.records]
        if {r["pid"] for r in rows} - {os.getpid()} or time.monotonic() > deadline:
            break
    assert {r["pid"] for r in rows} - {os.getpid()}, "no frame reached the worker process"
    assert {(r["root"], r["limit"]) for r in rows} == {(str(tmp_path / "c"), 3 * 2**20)}


# Zephon's supplied-field contract: omitted fields never override in a merge; explicit None resets
# a field to its default (thread counts keep None: "leave the pool as it is").

def test_merge_takes_only_supplied_fields_and_explicit_none_resets():
    base = CacheOptions(enabled=True, root="/a", limit_bytes="1gb", download_retry=3, open_retry_max_backoff=5.0)
    assert base.supplied_fields() == {"enabled", "root", "limit_bytes", "download_retry", "open_retry_max_backoff"}
    assert base.merge(CacheOptions()) == base  # nothing supplied: nothing changes
    assert base.merge(CacheOptions.from_any({})) == base
    partial = base.merge(CacheOptions(download_retry=7))
    assert (partial.download_retry, partial.root, partial.limit_bytes) == (7, "/a", 1 << 30)
    for name in ("enabled", "root", "limit_bytes", "download_retry", "open_retry_max_backoff"):
        reset = base.merge(CacheOptions.from_any({name: None}))
        assert getattr(reset, name) == getattr(CacheOptions(), name)
        assert all(getattr(reset, other) == getattr(base, other) for other in base.supplied_fields() - {name})
    assert base.merge(CacheOptions.from_any(None)) == CacheOptions()  # from_any(None) supplies every default
    assert CacheOptions.from_any(None).supplied_fields() == {f.name for f in dataclasses.fields(CacheOptions)}


def test_new_cache_fields_have_zephons_defaults_and_feed_the_metadata_policy():
    c = CacheOptions()
    assert (c.open_retry_initial_backoff, c.open_retry_max_backoff, c.min_slack_bytes, c.max_slack_bytes) == \
        (0.1, 2.0, 512 << 10, 64 << 20)
    assert c.metadata_policy() == fs.METADATA_POLICY
    policy = CacheOptions(open_retry_attempts=2, open_retry_initial_backoff=0.5,
                          open_retry_max_backoff=4).metadata_policy()
    assert (policy.attempts, policy.first_delay_s, policy.max_delay_s) == (2, 0.5, 4)
    assert CacheOptions(min_slack_bytes="1kb").min_slack_bytes == 1024


@pytest.mark.parametrize("kind, field, default", [("arrow", "cpu_threads", 1), ("arrow", "io_threads", 1),
                                                  ("vortex", "worker_threads", 1), ("lance", "worker_threads", 2)])
def test_thread_counts_keep_explicit_none_and_reset_on_a_none_group(kind, field, default):
    get = lambda opts: getattr(getattr(opts, kind), field)  # noqa: E731
    assert get(StoreOptions()) == default
    base = StoreOptions.from_any({kind: {field: 3}})
    assert get(base.merge(StoreOptions())) == 3
    kept = base.merge({kind: {field: None}})
    assert get(kept) is None and get(kept.merge(StoreOptions())) is None
    assert get(base.merge({kind: None})) == default
    assert get(base.merge(StoreOptions.from_any(None))) == default


@pytest.mark.parametrize("value, fragment", [
    ({"arrow": {"cpu_threads": 0}}, "arrow.cpu_threads"),
    ({"arrow": {"io_threads": True}}, "arrow.io_threads"),
    ({"lance": {"worker_threads": 0}}, "lance.worker_threads"),
    ({"vortex": {"worker_threads": -1}}, "vortex.worker_threads"),
    ({"vortex": {"worker_threads": "2"}}, "vortex.worker_threads"),
    ({"vortex": {"segment_cache_bytes": ""}}, "must not be empty"),
    ({"vortex": {"segment_cache_bytes": 1.5}}, "vortex.segment_cache_bytes"),
    ({"parquet": {"use_threads": 1}}, "parquet.use_threads"),
    ({"parquet": {"rg_cache": {"limit_bytes": 0}}}, "parquet.rg_cache.limit_bytes"),
    ({"parquet": {"rg_cache": {"limit_bytes": " "}}}, "must not be empty"),
    ({"parquet": {"rg_cache": {"min_free_bytes": -1}}}, "min_free_bytes"),
    ({"metadata_cache_entries": "256"}, "metadata_cache_entries"),
    ({"metadata_cache_entries": -1}, "metadata_cache_entries"),
    ({"cache": {"open_retry_initial_backoff": -0.5}}, "cache.open_retry_initial_backoff"),
])
def test_bad_values_raise_value_errors_naming_the_option(value, fragment):
    with pytest.raises(ConfigError, match=fragment):
        StoreOptions.from_any(value)


def test_zero_is_a_value_where_zephon_allows_it():
    opts = StoreOptions.from_any({"vortex": {"worker_threads": 0, "segment_cache_bytes": 0},
                                  "metadata_cache_entries": 0,
                                  "parquet": {"rg_cache": {"enabled": False, "limit_bytes": 0}}})
    assert (opts.vortex.worker_threads, opts.vortex.segment_cache_bytes, opts.metadata_cache_entries) == (0, 0, 0)
    assert StoreOptions().metadata_cache_entries == 256
    assert StoreOptions.from_any({"metadata_cache_entries": 12}).merge({"metadata_cache_entries": None}) \
        .metadata_cache_entries == 256


def test_wrong_shapes_are_type_errors_and_value_errors():
    for bad in (lambda: StoreOptions.from_any(3.14), lambda: CacheOptions.from_any(123),
                lambda: StoreOptions.from_any({"cache": {"metadata_cache_entries": 12}}),
                lambda: CacheOptions.from_any(True)):
        with pytest.raises(TypeError) as info:
            bad()
        assert isinstance(info.value, ValueError)
    with pytest.raises(TypeError, match="has moved to parquet.rg_cache"):
        StoreOptions.from_any({"parquet_rg_cache": {"enabled": False}})
    with pytest.raises(TypeError, match="metadata_cache_entries"):
        StoreOptions.from_any({"cache": {"metadata_cache_entries": 12}})


def test_from_any_booleans_and_sizes_in_nested_dicts(tmp_path):
    assert CacheOptions.from_any(False) == CacheOptions()
    assert ParquetRGCacheOptions.from_any(True).enabled is True
    assert ParquetRGCacheOptions.from_any(False).supplied_fields() == {"enabled"}
    rg_dict = {"root": tmp_path, "limit_bytes": "8gb", "min_free_bytes": "2gb"}
    opts = StoreOptions.from_any({"parquet": {"rg_cache": rg_dict},
                                  "vortex": {"segment_cache_bytes": "8mb"}})
    rg = opts.parquet.rg_cache
    assert (rg.root, rg.limit_bytes, rg.min_free_bytes) == (tmp_path, 8 << 30, 2 << 30)  # a Path stays a Path
    assert opts.vortex.segment_cache_bytes == 8 << 20
    assert opts.parquet.use_threads is False and StoreOptions().parquet.rg_cache.enabled is None
    merged = opts.merge({"parquet": {"rg_cache": {"limit_bytes": "4gb"}}})
    assert (merged.parquet.rg_cache.root, merged.parquet.rg_cache.limit_bytes) == (tmp_path, 4 << 30)
    assert opts.merge({"parquet": {"rg_cache": None}}).parquet.rg_cache == ParquetRGCacheOptions()


def test_supplied_fields_survive_pickling():
    import pickle

    opts = StoreOptions.from_any({"arrow": {"cpu_threads": 3, "io_threads": None}, "metadata_cache_entries": 12})
    back = pickle.loads(pickle.dumps(opts))
    assert back == opts and back.arrow.supplied_fields() == {"cpu_threads", "io_threads"}
    assert back.supplied_fields() == {"metadata_cache_entries"} and back.cache.supplied_fields() == frozenset()


def test_resolved_parquet_rg_cache_defaults(tmp_path):
    plain = StoreOptions().resolved_parquet_rg_cache()
    assert (plain.enabled, plain.limit_bytes) == (False, 4 << 30)
    big = StoreOptions.from_any({"cache": {"enabled": True, "limit_bytes": "100gb"}}).resolved_parquet_rg_cache()
    assert (big.enabled, big.limit_bytes) == (True, 10 << 30)
    assert StoreOptions.from_any({"cache": {"enabled": True, "limit_bytes": "10gb"}}) \
        .resolved_parquet_rg_cache().limit_bytes == 4 << 30
    rg_only = StoreOptions.from_any({"cache": {"limit_bytes": "100gb"}, "parquet": {"rg_cache": {"root": tmp_path}}})
    assert (rg_only.resolved_parquet_rg_cache().enabled, rg_only.resolved_parquet_rg_cache().limit_bytes) == \
        (True, 4 << 30)  # the shard cache is off: its limit does not count
    kept = StoreOptions.from_any({"parquet": {"rg_cache": {"limit_bytes": "20gb"}}}).merge({"cache": {"enabled": True}})
    assert kept.resolved_parquet_rg_cache().limit_bytes == 20 << 30
    with pytest.raises(ConfigError, match="enabled=True requires parquet.rg_cache.root"):
        StoreOptions.from_any({"parquet": {"rg_cache": True}}).resolved_parquet_rg_cache()


def test_rg_cache_bytes_is_deprecated_and_migrates_unless_the_new_limit_is_set():
    with pytest.warns(DeprecationWarning, match="rg_cache_bytes is deprecated"):
        migrated = StoreOptions.from_any({"cache": {"enabled": True, "limit_bytes": "100gb", "rg_cache_bytes": "2gb"}})
    assert migrated.resolved_parquet_rg_cache().limit_bytes == 2 << 30
    with pytest.warns(DeprecationWarning):
        overridden = StoreOptions.from_any({"cache": {"enabled": True, "rg_cache_bytes": "6gb"},
                                            "parquet": {"rg_cache": {"limit_bytes": "8gb"}}})
    assert overridden.resolved_parquet_rg_cache().limit_bytes == 8 << 30
    with pytest.warns(DeprecationWarning):
        off = StoreOptions(cache=CacheOptions(enabled=True, rg_cache_bytes=0)).resolved_parquet_rg_cache()
    assert (off.enabled, off.limit_bytes) == (False, 4 << 30)
