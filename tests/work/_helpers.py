"""Helpers shared by the work-layer tests: tiny datasets (row counts only matter here)."""

from __future__ import annotations

import json
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from zephon_columnar.io.dataset import Dataset
from zephon_columnar.work import StaticMixtureWorkSource, WorkChunk


def make_ds(name: str, shard_rows: Sequence[int]) -> Dataset:
    """A dataset whose shards hold ``shard_rows[i]`` rows (an ``x`` column)."""
    return Dataset.from_tables(name, [pa.table({"x": np.arange(n, dtype=np.int64)}) for n in shard_rows])


def drain(ws: Any, limit: int = 100_000) -> list[WorkChunk]:
    """Every chunk a (bounded) source still returns."""
    out = []
    for _ in range(limit):
        c = ws.next_chunk()
        if c is None:
            return out
        out.append(c)
    raise AssertionError(f"source did not end within {limit} chunks")


def take(ws: Any, n: int) -> list[WorkChunk]:
    """The next ``n`` chunks (fewer if the source ends)."""
    out = []
    for _ in range(n):
        c = ws.next_chunk()
        if c is None:
            break
        out.append(c)
    return out


def per_dataset(chunks: Sequence[WorkChunk], name: str) -> np.ndarray:
    """All pointers of component ``name`` across ``chunks``, in draw order (a chunk without
    rows of ``name`` leaves it out)."""
    parts = [c.component_arrays[name] for c in chunks if name in c.component_arrays]
    return np.concatenate(parts) if parts else np.empty((0, 3), np.int64)


def json_round_trip(obj: Any) -> Any:
    return json.loads(json.dumps(obj))


def source(datasets: Sequence[Dataset], weights: dict[str, float], **kw: Any) -> StaticMixtureWorkSource:
    return StaticMixtureWorkSource(list(datasets), dict(weights), **kw)


def same_chunks(a: Sequence[WorkChunk], b: Sequence[WorkChunk]) -> bool:
    return len(a) == len(b) and all(x == y for x, y in zip(a, b))
