"""Storage options: Zephon's `StoreOptions` / `CacheOptions` shapes, and the shard cache's root
and ``limit_bytes`` taking effect (least recently used copies evicted) through ``io_options``."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import zephon_columnar as zephon
from zephon_columnar.errors import ConfigError
from zephon_columnar.io import fs
from zephon_columnar.io.options import CacheOptions, ParquetOptions, StoreOptions, parse_bytes


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
    assert sorted(os.listdir(tmp_path / "cache")) == sorted(os.path.basename(p) for p in (a, cache.cached_path(
        urls[2], 1000)))
    assert (cache.downloads, cache.hits, cache.evictions) == (3, 1, 1)
    cache.ensure_local(urls[1])  # downloaded again
    assert cache.downloads == 4 and sum(os.path.getsize(tmp_path / "cache" / f)
                                        for f in os.listdir(tmp_path / "cache")) <= 2500


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
    copies = os.listdir(cache_dir)
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
