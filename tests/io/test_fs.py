"""Path/URL handling, directory listing and the shard cache."""

from __future__ import annotations

import os
import threading

import fsspec
import fsspec.implementations.memory
import pytest

from tests.io.conftest import cache_files
from zephon_columnar.errors import DatasetNotFoundError
from zephon_columnar.io import fs
from zephon_columnar.io.retry import RetryPolicy


def test_local_paths_and_file_urls_resolve_without_fsspec(tmp_path):
    p = tmp_path / "a.parquet"
    p.write_bytes(b"x")
    assert fs.is_local(str(p)) and fs.is_local(f"file://{p}")
    assert not fs.is_local("memory://bucket/a") and not fs.is_local("simplecache::memory://a")
    assert fs.to_local(f"file://{p}") == str(p)
    assert fs.exists(f"file://{p}") and not fs.isdir(f"file://{p}")
    assert fs.file_size(str(p)) == 1


def test_listing_is_sorted_and_skips_hidden_and_underscore_files(tmp_path):
    for name in ["b.jsonl", "a.jsonl", "_SUCCESS", ".hidden.jsonl", "c.jsonl"]:
        (tmp_path / name).write_text("{}\n")
    (tmp_path / "sub").mkdir()
    assert [os.path.basename(f) for f in fs.list_data_files(str(tmp_path))] == ["a.jsonl", "b.jsonl", "c.jsonl"]
    assert all(os.path.isabs(f) for f in fs.list_data_files(str(tmp_path)))


def test_listing_a_memory_url_gives_reopenable_urls(memfs):
    mem, root = memfs
    for name in ["b.parquet", "a.parquet", "_SUCCESS"]:
        mem.pipe(f"{root}/{name}", b"data")
    files = fs.list_data_files(root)
    assert [fs.basename(f) for f in files] == ["a.parquet", "b.parquet"]
    assert all(f.startswith("memory://") for f in files)
    assert fs.read_bytes(files[0]) == b"data" and fs.file_size(files[0]) == 4


def test_unknown_protocol_says_what_to_install():
    with pytest.raises(DatasetNotFoundError, match="fsspec backend"):
        fs.exists("nosuchproto://bucket/x")


def test_shard_cache_returns_local_files_as_is(tmp_path):
    p = tmp_path / "a.parquet"
    p.write_bytes(b"abc")
    cache = fs.ShardCache(str(tmp_path / "cache"))
    assert cache.ensure_local(str(p)) == str(p)
    assert cache.ensure_local(f"file://{p}") == str(p)
    assert cache.downloads == 0 and not (tmp_path / "cache").exists()


def test_shard_cache_downloads_a_remote_file_once(tmp_path, memfs):
    mem, root = memfs
    mem.pipe(f"{root}/part.jsonl.gz", b"payload" * 1000)
    cache = fs.ShardCache(str(tmp_path / "cache"))
    first = cache.ensure_local(f"{root}/part.jsonl.gz")
    second = cache.local_path(f"{root}/part.jsonl.gz", 7000)
    assert first == second and first.endswith("part.jsonl.gz")  # suffix kept for format detection
    assert open(first, "rb").read() == b"payload" * 1000
    assert cache.downloads == 1
    assert cache_files(tmp_path / "cache") == [os.path.basename(first)]  # no temp files left


def test_shard_cache_key_includes_the_size(tmp_path, memfs):
    mem, root = memfs
    url = f"{root}/a.parquet"
    mem.pipe(url, b"v1")
    cache = fs.ShardCache(str(tmp_path / "cache"))
    old = cache.ensure_local(url)
    mem.pipe(url, b"version2")
    new = cache.ensure_local(url)
    assert old != new and open(new, "rb").read() == b"version2" and cache.downloads == 2


def test_shard_cache_concurrent_callers_share_one_download(tmp_path, memfs):
    mem, root = memfs
    url = f"{root}/big.arrow"
    mem.pipe(url, os.urandom(1 << 20))
    cache = fs.ShardCache(str(tmp_path / "cache"))
    paths, barrier = [], threading.Barrier(8)

    def work():
        barrier.wait()
        paths.append(cache.ensure_local(url))

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(paths)) == 1 and cache.downloads == 1
    assert open(paths[0], "rb").read() == mem.cat(url)


def test_shard_cache_rejects_a_file_whose_size_changed(tmp_path, memfs):
    mem, root = memfs
    mem.pipe(f"{root}/a.parquet", b"abc")
    cache = fs.ShardCache(str(tmp_path / "cache"))
    with pytest.raises(DatasetNotFoundError, match=r"a\.parquet.*changed"):
        cache.ensure_local(f"{root}/a.parquet", size=10)
    assert not cache_files(tmp_path / "cache")  # the partial download was removed


def test_default_cache_follows_the_environment_and_prefetch_keeps_order(private_cache, memfs):
    mem, root = memfs
    urls = [f"{root}/s{i}.parquet" for i in range(5)]
    for i, u in enumerate(urls):
        mem.pipe(u, bytes([i]) * (i + 1))
    local = fs.prefetch(urls, parallelism=3)
    assert all(p.startswith(str(private_cache / "shards")) for p in local)
    assert [open(p, "rb").read() for p in local] == [bytes([i]) * (i + 1) for i in range(5)]
    assert fs.local_path(urls[2]) == local[2]


class _BreakingFile:
    """A remote file whose connection drops once, at byte ``break_at``, as a flaky store's does."""

    def __init__(self, inner, owner: "_FlakyMemoryFS") -> None:
        self._inner, self._owner = inner, owner

    def read(self, n: int = -1) -> bytes:
        at, limit = self._inner.tell(), self._owner.break_at
        if limit is not None:
            if at >= limit:
                self._owner.break_at = None
                raise ConnectionResetError(104, "Connection reset by peer")
            n = limit - at if n < 0 else min(n, limit - at)
        return self._inner.read(n)

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._inner.close()


class _FlakyMemoryFS(fsspec.implementations.memory.MemoryFileSystem):
    """fsspec's memory filesystem under its own protocol, whose files break once; records the
    ranges asked for."""

    protocol = "flakymem"
    break_at: int | None = None
    ranges: list = []

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return super()._strip_protocol(path.replace("flakymem://", "memory://", 1))

    def _open(self, path, mode="rb", **kwargs):
        return _BreakingFile(super()._open(path, mode, **kwargs), self)

    def cat_file(self, path, start=None, end=None, **kwargs):
        self.ranges.append((start, end))
        return super().cat_file(path, start=start, end=end, **kwargs)


def test_a_download_that_breaks_resumes_where_it_broke(tmp_path, monkeypatch):
    fsspec.register_implementation("flakymem", _FlakyMemoryFS, clobber=True)
    flaky = fsspec.filesystem("flakymem")
    data = os.urandom(10_000)
    flaky.pipe("/zc-resume/a.bin", data)
    monkeypatch.setattr(fs, "_COPY_BLOCK", 4000)
    flaky.break_at, flaky.ranges = 6000, []
    cache = fs.ShardCache(str(tmp_path / "cache"), download_policy=RetryPolicy(attempts=2, first_delay_s=0.0))
    local = cache.ensure_local("flakymem:///zc-resume/a.bin")
    assert open(local, "rb").read() == data
    assert cache.retries == 1 and cache.downloads == 1
    assert flaky.ranges == [(6000, 10_000)]  # the second try asked only for the rest


def test_a_download_out_of_tries_names_the_url_and_leaves_nothing(tmp_path, monkeypatch):
    fsspec.register_implementation("flakymem", _FlakyMemoryFS, clobber=True)
    flaky = fsspec.filesystem("flakymem")
    flaky.pipe("/zc-resume/b.bin", b"x" * 3000)
    flaky.break_at = 1000
    cache = fs.ShardCache(str(tmp_path / "cache"), download_policy=RetryPolicy(attempts=1))
    with pytest.raises(OSError, match=r"flakymem:///zc-resume/b\.bin: download failed 1 time.*ConnectionResetError"):
        cache.ensure_local("flakymem:///zc-resume/b.bin")
    assert cache_files(tmp_path / "cache") == []  # no partial copy under any name
