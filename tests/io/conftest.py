"""Fixtures for the io tests: a private on-disk cache per test and a clean memory filesystem."""

from __future__ import annotations

import uuid

import fsspec
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
