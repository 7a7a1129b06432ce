"""The process-wide cache of decoded data (`zephon_columnar.io.decoded`): every reader's decoded
row groups together within one limit, whatever the number of datasets, rows still right."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.errors import ConfigError
from zephon_columnar.io import decoded
from zephon_columnar.io.decoded import DecodedCache, decoded_cache, new_owner
from zephon_columnar.io.parquet import ParquetReader
from zephon_columnar.testing import collect

GROUP_ROWS = 100


@pytest.fixture
def many(tmp_path) -> list[Dataset]:
    """20 datasets of one file, 2 row groups of 100 rows each (a group decodes to ~8.4 KB)."""
    out = []
    for d in range(20):
        folder = tmp_path / f"d{d}"
        folder.mkdir()
        ids = np.arange(d * 1000, d * 1000 + 2 * GROUP_ROWS, dtype=np.int64)
        pq.write_table(pa.table({"id": ids, "x": ids * 0.5}), folder / "part-0.parquet", row_group_size=GROUP_ROWS)
        out.append(Dataset.from_path(f"d{d}", str(folder)))
    return out


@pytest.fixture
def process_cache(monkeypatch) -> DecodedCache:
    """A fresh process cache for the test (the module's default is replaced, then restored)."""
    cache = DecodedCache()
    monkeypatch.setattr(decoded, "_default", cache)
    return cache


def test_readers_of_many_datasets_keep_within_one_limit_together(many, process_cache):
    group_bytes = ParquetReader(many[0]).take(0, np.arange(GROUP_ROWS)).nbytes
    process_cache.limit_bytes = 5 * group_bytes  # five groups for twenty readers
    readers = [ParquetReader(ds) for ds in many]
    rng = np.random.default_rng(0)
    for _ in range(200):
        d = int(rng.integers(len(many)))
        rows = np.sort(rng.choice(2 * GROUP_ROWS, size=3, replace=False))
        got = readers[d].take(0, rows)
        assert got.column("id").to_pylist() == (d * 1000 + rows).tolist()
        assert process_cache.held_bytes <= process_cache.limit_bytes
    assert process_cache.evictions > 0
    assert sum(r.stats["decoded_groups"] for r in readers) > 2 * len(many)  # some were decoded again
    for r in readers:
        r.close()
    assert process_cache.held_bytes == 0  # a closed reader leaves nothing behind


def test_one_readers_own_share_still_holds_and_a_scan_decodes_each_group_once(many, process_cache):
    reader = ParquetReader(many[0])
    for start in range(0, 2 * GROUP_ROWS, 7):  # a scan in slices: each group decoded once
        reader.take(0, np.arange(start, min(start + 7, 2 * GROUP_ROWS)))
    assert reader.stats["decoded_groups"] == 2
    small = ParquetReader(many[1], cache_bytes=1)
    small.take(0, np.arange(0, 2 * GROUP_ROWS, 10))  # both groups at once: kept while in use
    small.take(0, np.array([5]))
    assert process_cache.held_by(small._owner)[0] == 1  # then down to its share: one group


def test_the_entry_just_put_stays_even_when_larger_than_the_limit():
    cache = DecodedCache(limit_bytes=10)
    a = new_owner()
    cache.put((a, 0), "small", 4, owner_limit=100)
    cache.put((a, 1), "big", 50, owner_limit=100)
    assert (cache.get((a, 0)), cache.get((a, 1)), cache.held_bytes) == (None, "big", 50)


def test_threads_sharing_the_cache_read_the_right_rows(many, process_cache):
    process_cache.limit_bytes = 3 * ParquetReader(many[0]).take(0, np.arange(GROUP_ROWS)).nbytes
    readers = [ParquetReader(ds) for ds in many[:8]]
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(100):
                d = int(rng.integers(len(readers)))
                rows = rng.integers(0, 2 * GROUP_ROWS, size=4)
                # a reader is used by one thread at a time (the engine's pool serializes it)
                with locks[d]:
                    got = readers[d].take(0, rows).column("id").to_pylist()
                assert got == (d * 1000 + rows).tolist()
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    locks = [threading.Lock() for _ in readers]
    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert process_cache.held_bytes <= process_cache.limit_bytes


@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_the_io_option_sets_the_process_limit_and_leaves_the_stream_as_it_was(many, process_cache, runner):
    def pipe(**io) -> Pipeline:
        ws = StaticMixtureWorkSource(many, {ds.name: 1.0 for ds in many}, seed=3, chunk_size=64)
        return Pipeline(ws).fetch().batch(16).options(runner=runner, io_options=io or None)

    want = collect(pipe())
    assert process_cache.limit_bytes == decoded.DEFAULT_LIMIT_BYTES
    got = collect(pipe(decoded_cache_bytes="20kb"))
    assert process_cache.limit_bytes == 20 << 10 and got == want
    assert process_cache.held_bytes <= 20 << 10 and process_cache.evictions > 0


def test_a_bad_limit_is_refused_naming_the_option(many):
    with pytest.raises(ConfigError, match="decoded_cache_bytes"):
        Pipeline(StaticMixtureWorkSource(many[:1], {"d0": 1.0})).options(
            io_options={"decoded_cache_bytes": "lots"}
        )


def test_the_default_cache_is_one_per_process():
    assert decoded_cache() is decoded_cache()


def test_a_forked_child_starts_with_an_empty_cache_of_the_same_limit(many, process_cache):
    import multiprocessing as mp

    process_cache.limit_bytes = 12345
    reader = ParquetReader(many[0])
    reader.take(0, np.arange(5))
    assert process_cache.held_bytes > 0
    held_lock = process_cache._lock.acquire()  # a parent's thread inside the cache at the fork
    try:
        ctx = mp.get_context("fork")
        with ctx.Pool(1) as pool:
            assert pool.apply(_child_view, ()) == (12345, 0, 0)
    finally:
        if held_lock:
            process_cache._lock.release()


def _child_view() -> tuple[int, int, int]:
    cache = decoded_cache()
    a = new_owner()
    cache.put((a, 0), "x", 1, owner_limit=10)  # would hang on the parent's held lock
    cache.release(a)
    return cache.limit_bytes, cache.held_bytes, cache.evictions


def test_a_forked_child_counts_open_files_under_its_own_lock():
    import multiprocessing as mp

    from zephon_columnar.io.open_files import OPEN_FILES

    held_lock = OPEN_FILES._lock.acquire()  # a parent's thread inside opened() at the fork
    try:
        with mp.get_context("fork").Pool(1) as pool:
            assert pool.apply(_child_opens, (OPEN_FILES.held,)) == 1  # before: blocked for ever
    finally:
        if held_lock:
            OPEN_FILES._lock.release()


def _child_opens(before: int) -> int:
    from zephon_columnar.io.open_files import OPEN_FILES

    if not OPEN_FILES._lock.acquire(timeout=10):
        return -1
    OPEN_FILES._lock.release()
    OPEN_FILES.opened()
    return OPEN_FILES.held - before


def test_a_mixture_of_more_datasets_than_the_descriptor_limit_reads_every_row(tmp_path):
    """300 datasets of 2 files under ``ulimit -n 256``: the readers close their files when the
    process holds too many (before, the 257th open failed: "Too many open files")."""
    import subprocess
    import sys
    import textwrap

    for d in range(300):
        (tmp_path / f"d{d}").mkdir()
        for f in range(2):
            pq.write_table(pa.table({"id": list(range(d * 100 + f * 50, d * 100 + f * 50 + 50))}),
                           tmp_path / f"d{d}" / f"p{f}.parquet")
    script = tmp_path / "wide.py"
    script.write_text(textwrap.dedent(f"""
        import resource, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
        from zephon_columnar.io.open_files import OPEN_FILES
        datasets = [Dataset.from_path(f"d{{d}}", {str(tmp_path)!r} + f"/d{{d}}") for d in range(300)]
        ws = StaticMixtureWorkSource(datasets, {{ds.name: 1.0 for ds in datasets}}, seed=0, chunk_size=512)
        ids = [i for b in Pipeline(ws).fetch().batch(50).options(runner="threads") for i in b.table.column("id").to_pylist()]
        assert sorted(ids) == list(range(30000)), len(ids)
        print("read", len(ids), "limit", OPEN_FILES.limit)
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "read 30000 limit 128" in done.stdout, done.stderr[-2000:]


# ---------------------------------------------------------------- the other formats' decoded data
def _gzip_jsonl_datasets(tmp_path: Path, n: int) -> list[Dataset]:
    """``n`` datasets of one gzip JSON Lines file of 200 rows each (ids d*1000 + row)."""
    import gzip
    import json

    out = []
    for d in range(n):
        folder = tmp_path / f"j{d}"
        folder.mkdir()
        lines = "".join(json.dumps({"id": d * 1000 + r, "text": "x" * 40}) + "\n" for r in range(200))
        (folder / "part-0.jsonl.gz").write_bytes(gzip.compress(lines.encode()))
        out.append(Dataset.from_path(f"j{d}", str(folder)))
    return out


def _read_at_random(readers: list, cache: DecodedCache, rows_per_file: int, reads: int, check=lambda: None) -> None:
    """``reads`` takes of a few rows of random readers (dataset d's ids are d*1000 + row): each one
    right, the cache within its limit after each; then some evictions, and nothing left once the
    readers close."""
    rng = np.random.default_rng(reads)
    for _ in range(reads):
        d = int(rng.integers(len(readers)))
        rows = rng.choice(rows_per_file, size=4, replace=False)
        assert readers[d].take(0, rows).column("id").to_pylist() == (d * 1000 + rows).tolist()
        assert cache.held_bytes <= cache.limit_bytes
        check()
    assert cache.evictions > 0
    for r in readers:
        r.close()
    assert cache.held_bytes == 0


def test_compressed_jsonl_readers_keep_their_decompressed_files_within_the_process_limit(tmp_path, process_cache):
    # Before: each reader kept up to 512 MiB of decompressed files (at least one) in its open
    # files, so a mixture of many compressed JSONL datasets held one file's content per dataset.
    import gzip

    from zephon_columnar.io.jsonl import JsonlReader

    datasets = _gzip_jsonl_datasets(tmp_path, 12)
    one_file = len(gzip.decompress((tmp_path / "j0" / "part-0.jsonl.gz").read_bytes()))
    process_cache.limit_bytes = 3 * one_file + one_file // 2  # three files for twelve readers
    readers = [JsonlReader(ds) for ds in datasets]

    def nothing_held_outside_the_cache() -> None:
        assert all(f.data is None for r in readers for f in r._open.values())

    _read_at_random(readers, process_cache, 200, 120, nothing_held_outside_the_cache)


def test_jsonl_readers_count_their_open_files_and_close_them_past_the_process_limit(tmp_path, monkeypatch):
    from zephon_columnar.io import open_files
    from zephon_columnar.io.jsonl import JsonlReader

    counter = open_files.OpenFiles(limit=4)
    monkeypatch.setattr("zephon_columnar.io.jsonl.reader.OPEN_FILES", counter)  # where the reader looks it up
    datasets = _gzip_jsonl_datasets(tmp_path, 10)
    readers = [JsonlReader(ds) for ds in datasets]
    for d, reader in enumerate(readers):
        assert reader.take(0, np.array([5, 1])).column("id").to_pylist() == [d * 1000 + 5, d * 1000 + 1]
        assert counter.held <= counter.limit  # a reader past the limit gave its file back
    for reader in readers:
        reader.close()
    assert counter.held == 0


def test_vortex_readers_keep_their_decoded_files_within_the_process_limit(tmp_path, process_cache):
    from tests.extras import require

    vortex = require("vortex", "vortex")
    from zephon_columnar.io.vortex import VortexReader

    datasets = []
    for d in range(8):
        folder = tmp_path / f"v{d}"
        folder.mkdir()
        ids = np.arange(d * 1000, d * 1000 + 300, dtype=np.int64)
        vortex.io.write(pa.table({"id": ids, "x": ids * 0.5}), str(folder / "part-000.vortex"))
        datasets.append(Dataset.from_path(f"v{d}", str(folder)))
    one_file = VortexReader(datasets[0]).take(0, np.arange(300)).nbytes
    process_cache.limit_bytes = 2 * one_file + one_file // 2  # two files for eight readers
    _read_at_random([VortexReader(ds) for ds in datasets], process_cache, 300, 60)
