"""Fixtures for the io tests: a private on-disk cache per test, a clean memory filesystem, and
files the OS refuses to read."""

from __future__ import annotations

import builtins
import os
import uuid

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon_columnar.io import jsonl


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Point every on-disk cache (shards, JSONL indexes) at this test's tmp dir."""
    root = tmp_path / "zc_cache"
    monkeypatch.setenv("ZEPHON_COLUMNAR_CACHE", str(root))
    jsonl.INDEX_CACHE.clear_memory()
    yield root
    jsonl.INDEX_CACHE.clear_memory()


@pytest.fixture()
def memfs():
    """``(fs, url_root)``: a fresh folder in fsspec's in-process memory filesystem."""
    fs = fsspec.filesystem("memory")
    root = f"/zc-test-{uuid.uuid4().hex[:8]}"
    fs.makedirs(root, exist_ok=True)
    yield fs, f"memory://{root}"
    fs.rm(root, recursive=True)


@pytest.fixture()
def deny_read(monkeypatch):
    """``deny_read(path)``: from now on the OS refuses to read ``path``, as after ``chmod 000``.

    The tests run as root, whom file modes do not stop, so the calls that open files
    (``open``, ``os.open``, ``os.scandir``, and Arrow's own opening in ``pyarrow.parquet`` and
    ``pa.memory_map``) raise, for a denied path, exactly the PermissionError the OS (or Arrow)
    raises for a normal user; other paths are untouched.
    """
    denied: set[str] = set()

    def check(path, *, arrow: bool = False) -> None:
        if not isinstance(path, (str, os.PathLike)) or os.path.abspath(os.fspath(path)) not in denied:
            return
        path = os.path.abspath(os.fspath(path))
        if arrow:
            raise PermissionError(13, f"Failed to open local file '{path}'. Detail: [errno 13] Permission denied")
        raise PermissionError(13, "Permission denied", path)

    real_open, real_os_open, real_scandir = builtins.open, os.open, os.scandir
    real_metadata, real_memory_map = pq.read_metadata, pa.memory_map

    def fake_open(file, *args, **kwargs):
        check(file)
        return real_open(file, *args, **kwargs)

    def fake_os_open(path, *args, **kwargs):
        check(path)
        return real_os_open(path, *args, **kwargs)

    def fake_scandir(path=".", *args, **kwargs):
        check(path)
        return real_scandir(path, *args, **kwargs)

    def fake_metadata(where, *args, **kwargs):
        check(where, arrow=True)
        return real_metadata(where, *args, **kwargs)

    def fake_memory_map(path, *args, **kwargs):
        check(path, arrow=True)
        return real_memory_map(path, *args, **kwargs)

    class DeniedParquetFile(pq.ParquetFile):
        def __init__(self, source, *args, **kwargs):
            check(source, arrow=True)
            super().__init__(source, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(os, "open", fake_os_open)
    monkeypatch.setattr(os, "scandir", fake_scandir)
    monkeypatch.setattr(pq, "read_metadata", fake_metadata)
    monkeypatch.setattr(pq, "ParquetFile", DeniedParquetFile)
    monkeypatch.setattr(pa, "memory_map", fake_memory_map)
    return lambda path: denied.add(os.path.abspath(os.fspath(path)))


def cache_files(root) -> list[str]:
    """The names in a shard cache folder: its copies and any temp files, not its bookkeeping
    folders (``.locks``, ``.remembered``)."""
    return [n for n in os.listdir(root) if not n.startswith(".")]
