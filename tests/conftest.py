"""Shared fixtures: small real datasets on disk (Parquet and JSONL) and pipeline builders."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

WORDS = ("the quick brown fox jumps over a lazy dog while the loader packs tokens into lanes "
         "and every checkpoint resumes exactly where it stopped").split()


def doc_text(i: int) -> str:
    n = 3 + (i * 7) % 17
    return " ".join(WORDS[(i + 3 * k) % len(WORDS)] for k in range(n))


def write_parquet_dataset(root: Path, *, shards: int, rows_per_shard: int, start: int = 0,
                          row_group_size: int = 16) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for s in range(shards):
        ids = list(range(start + s * rows_per_shard, start + (s + 1) * rows_per_shard))
        table = pa.table({"id": pa.array(ids, pa.int64()), "text": [doc_text(i) for i in ids]})
        pq.write_table(table, root / f"part-{s:03d}.parquet", row_group_size=row_group_size)
    return root


def write_jsonl_dataset(root: Path, *, shards: int, rows_per_shard: int, start: int = 0) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for s in range(shards):
        with open(root / f"part-{s:03d}.jsonl", "w") as f:
            for i in range(start + s * rows_per_shard, start + (s + 1) * rows_per_shard):
                f.write(json.dumps({"id": i, "text": doc_text(i)}) + "\n")
    return root


@pytest.fixture(scope="session")
def web_dir(tmp_path_factory) -> Path:
    """3 Parquet shards x 40 rows, ids 0..119."""
    return write_parquet_dataset(tmp_path_factory.mktemp("web"), shards=3, rows_per_shard=40)


@pytest.fixture(scope="session")
def code_dir(tmp_path_factory) -> Path:
    """2 JSONL shards x 25 rows, ids 1000..1049."""
    return write_jsonl_dataset(tmp_path_factory.mktemp("code"), shards=2, rows_per_shard=25, start=1000)


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Keep JSONL indexes and downloaded shards out of the user's home cache."""
    import os

    old = os.environ.get("ZEPHON_COLUMNAR_CACHE")
    os.environ["ZEPHON_COLUMNAR_CACHE"] = str(tmp_path_factory.mktemp("zephon_cache"))
    yield
    if old is None:
        os.environ.pop("ZEPHON_COLUMNAR_CACHE", None)
    else:
        os.environ["ZEPHON_COLUMNAR_CACHE"] = old


@pytest.fixture(autouse=True)
def _default_shard_cache_per_test(monkeypatch):
    """A test whose pipeline names a cache root (``options(io_options=...)``) repoints this
    process's default shard cache; put it back after the test."""
    from zephon_columnar.io import fs

    monkeypatch.setattr(fs, "_default_cache", fs._default_cache)  # noqa: SLF001


@pytest.fixture(autouse=True)
def _fresh_tokenizers():
    """Tokenizer files are loaded and fastokens proved once per process, and the tests' trained
    tokenizers recur (the same JSON, module-wide folders): each test loads and proves its own,
    whatever ran before it."""
    from zephon_columnar.ops.tokenize.load import forget_tokenizers

    forget_tokenizers()
    yield
    forget_tokenizers()
