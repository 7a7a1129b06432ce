"""MosaicML Streaming (MDS) folders (`zephon_columnar.io.mds`), written by ``streaming``'s own
``MDSWriter``: detection by ``index.json``, row counts from it, every encoding read back as
``StreamingDataset`` reads it (numbers, text, JSON, bytes, typed and untyped 1-D arrays),
compressed shards, fsspec URLs through the shard cache, and pickles, cut shards, corrupt or
missing indexes named."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from tests.format_writers import streaming
from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.errors import DatasetFormatError

COLUMNS = {"id": "int", "text": "str", "tokens": "ndarray:int32", "meta": "json", "blob": "bytes", "raw": "ndarray",
           "f": "float32", "small": "uint8", "si": "str_int", "sf": "str_float", "fixed": "ndarray:uint16:4"}


def sample(i: int) -> dict:
    return {"id": i, "text": f"doc {i} naïve 🙂" * (i % 3), "tokens": np.arange(1 + i % 6, dtype=np.int32) * i,
            "meta": {"i": i, "tags": ["a", "b"][: i % 3]}, "blob": bytes([i % 256]) * (i % 4),
            "raw": np.arange(2 + i % 3, dtype=np.int16) - i, "f": np.float32(i / 4), "small": np.uint8(i % 200),
            "si": i * 11, "sf": i / 8, "fixed": np.arange(4, dtype=np.uint16) + i}


def expected(i: int) -> dict:
    s = sample(i)
    return {"id": i, "text": s["text"], "tokens": s["tokens"].tolist(), "meta": s["meta"], "blob": s["blob"],
            "raw": s["raw"].tolist(), "f": float(s["f"]), "small": int(s["small"]), "si": s["si"], "sf": s["sf"],
            "fixed": s["fixed"].tolist()}


def write(folder, n=40, compression=None, columns=COLUMNS, size_limit=1 << 11):
    with streaming().MDSWriter(out=str(folder), columns=columns, compression=compression, size_limit=size_limit) as out:
        for i in range(n):
            out.write({k: v for k, v in sample(i).items() if k in columns})
    return folder


def as_written(row: dict) -> dict:
    return {**row, "meta": json.loads(row["meta"])}


@pytest.mark.parametrize("compression", [None, "zstd", "zstd:7", "gz"])
def test_every_encoding_reads_back_as_written_in_any_order(tmp_path, compression):
    ds = Dataset.from_path("m", write(tmp_path / "mds", compression=compression))
    index = json.loads((tmp_path / "mds" / "index.json").read_text())
    assert ds.format_name == "mds" and ds.counts().tolist() == [s["samples"] for s in index["shards"]]
    assert len(ds.shards) > 3 and ds.total() == 40
    assert ds.schema.field("tokens").type == pa.list_(pa.int32()) and ds.schema.field("raw").type == pa.list_(pa.int16())
    reader, first = ds.open_reader(), 0
    for shard in ds.shards:
        rows = np.arange(shard.num_rows)[::-1]
        got = reader.take(shard.shard_id, np.concatenate([rows, rows[:1]]))
        assert [as_written(r) for r in got.to_pylist()] == [expected(first + int(r)) for r in [*rows, rows[0]]]
        first += shard.num_rows


def test_values_equal_what_streamings_own_dataset_reads(tmp_path):
    folder = write(tmp_path / "mds", compression="zstd")
    ds = Dataset.from_path("m", folder)
    ours = Dataset.from_path("m", folder).open_reader(columns=["id", "tokens", "text"])
    theirs = streaming().StreamingDataset(local=str(folder), remote=None, shuffle=False, batch_size=4)
    mine = [row for s in ds.shards for row in ours.take(s.shard_id, np.arange(s.num_rows)).to_pylist()]
    assert [(r["id"], r["tokens"], r["text"]) for r in mine] == [
        (int(x["id"]), x["tokens"].tolist(), x["text"]) for x in (theirs[i] for i in range(len(theirs)))
    ]


def test_a_pickled_column_is_refused_by_name(tmp_path):
    with streaming().MDSWriter(out=str(tmp_path / "mds"), columns={"id": "int", "obj": "pkl"}) as out:
        out.write({"id": 1, "obj": {"a": 1}})
    with pytest.raises(DatasetFormatError, match=r"index\.json: column 'obj' is pickled \('pkl'\)"):
        Dataset.from_path("m", tmp_path / "mds")


def test_a_memory_url_is_read_through_the_shard_cache(tmp_path, memfs):
    mem, root = memfs
    folder = write(tmp_path / "mds", n=12, compression="zstd")
    for f in folder.iterdir():
        mem.pipe(f"{root}/mds/{f.name}", f.read_bytes())
    ds = Dataset.from_path("m", f"{root}/mds")
    assert ds.format_name == "mds" and ds.total() == 12
    last = ds.shards[-1]
    got = ds.open_reader().take(last.shard_id, np.array([last.num_rows - 1]))
    assert as_written(got.to_pylist()[0]) == expected(11)


def test_cut_shards_and_broken_or_missing_indexes_are_named(tmp_path):
    folder = write(tmp_path / "mds", n=20)
    shard = folder / "shard.00001.mds"
    shard.write_bytes(shard.read_bytes()[:-30])
    ds = Dataset.from_path("m", folder)  # the index alone: nothing is read yet
    with pytest.raises(DatasetFormatError, match=r"shard\.00001\.mds is cut short"):
        ds.open_reader().take(1, np.array([0]))
    (folder / "index.json").write_text('{"shards": [')
    with pytest.raises(DatasetFormatError, match=r"index\.json: the MDS or LitData index is not readable JSON"):
        Dataset.from_path("m", folder)
    (folder / "index.json").unlink()
    with pytest.raises(DatasetFormatError, match=r"shard\.00000\.mds.*index\.json, which is missing"):
        Dataset.from_path("m", folder)


def test_a_cut_compressed_shard_is_named(tmp_path):
    folder = write(tmp_path / "mds", n=20, compression="zstd")
    shard = folder / "shard.00000.mds.zstd"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    # (discovery reads the first value of the untyped "raw" ndarray column, from this shard)
    # (its frame states its size: the decompressor stops short of it)
    with pytest.raises(DatasetFormatError, match=r"shard\.00000\.mds\.zstd cannot be decompressed .*; is it cut short"):
        Dataset.from_path("m", folder).open_reader().take(0, np.array([0]))


def test_decompressed_shards_keep_to_the_cache_limit_and_are_made_again_after_eviction(tmp_path):
    folder = write(tmp_path / "mds", n=120, compression="zstd", size_limit=1 << 12)
    raw = [shard["raw_data"]["bytes"] for shard in json.loads((folder / "index.json").read_text())["shards"]]
    assert len(raw) >= 4
    cache_dir, limit = tmp_path / "cache", int(2.5 * max(raw))  # room for two decompressed shards

    def one_pass() -> tuple[list[int], int]:
        work = StaticMixtureWorkSource([Dataset.from_path("m", folder)], {"m": 1.0}, chunk_size=8, seed=3)
        options = {"cache": {"enabled": True, "root": str(cache_dir), "limit_bytes": limit}}
        ids, peak = [], 0
        for batch in Pipeline(work).batch(8, drop_last=False).options(runner="inline", io_options=options):
            ids += batch.to_pydict()["id"]
            peak = max(peak, sum(p.stat().st_size for p in cache_dir.iterdir() if p.is_file()))
        return sorted(ids), peak

    for _ in range(2):  # the second pass decompresses the evicted shards again
        ids, peak = one_pass()
        assert ids == list(range(120))
        assert peak <= limit  # never more than the limit on disk, the shard in use included
