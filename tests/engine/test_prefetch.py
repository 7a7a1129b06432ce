"""prefetch(): remote shards are downloaded ahead of fetch; the data never changes."""

from __future__ import annotations

import io
import uuid

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.testing import collect


def write_memory_dataset(shards: int = 4, rows: int = 25) -> str:
    fs = fsspec.filesystem("memory")
    root = f"/prefetch-{uuid.uuid4().hex[:8]}"
    for s in range(shards):
        buf = io.BytesIO()
        pq.write_table(pa.table({"id": list(range(s * rows, (s + 1) * rows))}), buf, row_group_size=10)
        fs.pipe_file(f"{root}/part-{s}.parquet", buf.getvalue())
    return f"memory://{root}"


def build(url: str, prefetch: bool) -> Pipeline:
    ws = StaticMixtureWorkSource([Dataset.from_path("remote", url)], {"remote": 1.0}, chunk_size=10, seed=2)
    pipe = Pipeline(ws)
    if prefetch:
        pipe = pipe.prefetch(buffer_size=64, parallelism=2)
    return pipe.batch(5)


def test_prefetch_downloads_every_remote_shard_and_keeps_the_data(tmp_path, monkeypatch):
    monkeypatch.setenv("ZEPHON_COLUMNAR_CACHE", str(tmp_path / "cache"))
    url = write_memory_dataset()
    plain = collect(build(url, prefetch=False))
    pipe = build(url, prefetch=True)
    it = iter(pipe)
    got = [next(it) for _ in range(3)]
    assert pipe.session.run.prefetch_timing().prefetch_requests == 4  # every shard handed to the downloaders
    it.close()
    assert collect(build(url, prefetch=True)) == plain
    assert len(got) == 3 and len(plain) == 20
    assert len([p for p in (tmp_path / "cache" / "shards").iterdir() if p.is_file()]) == 4  # the copies
