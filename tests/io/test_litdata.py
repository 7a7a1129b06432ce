"""LitData optimized folders (`zephon_columnar.io.litdata`), written by ``litdata``'s own
writer: detection by ``index.json``, item counts from it, the sample's leaves as columns (nested
dicts flattened the way litdata flattens them), values read back as ``litdata.StreamingDataset``
reads them for every zstd packing (framed batches, per-item frames, whole files), chunks that
hold their rows as an Arrow table, TokensLoader datasets, fsspec URLs, and pickles, cut chunks,
broken or missing indexes named."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from tests.format_writers import litdata
from zephon_columnar import Dataset
from zephon_columnar.errors import DatasetFormatError

PACKINGS = {"plain": {}, "zstd-batch": {"compression": "zstd"},
            "zstd-sample": {"compression": "zstd", "compression_level": "sample"},
            "zstd-file": {"compression": "zstd", "compression_level": "chunk"}}


def item(i: int) -> dict:
    return {"id": i, "text": f"doc {i} naïve 🙂" * (i % 3), "tokens": np.arange(1 + i % 6, dtype=np.int32) * i,
            "blob": bytes([i % 256]) * (i % 4), "meta": {"i": i, "tags": ["a", "b"][: i % 3]}, "f": i / 4,
            "ok": i % 2 == 0}


def expected(i: int) -> dict:
    s = item(i)
    return {"id": i, "text": s["text"], "tokens": s["tokens"].tolist(), "blob": s["blob"], "meta.i": i,
            "meta.tags": s["meta"]["tags"], "f": s["f"], "ok": s["ok"]}


def write(folder, items, **options) -> str:
    writer = litdata().streaming.writer.BinaryWriter(str(folder), **{"chunk_size": 8, **options})
    for i, value in enumerate(items):
        writer.add_item(i, value)
    writer.done()
    writer.merge()
    return str(folder)


def as_written(row: dict) -> dict:
    return {**row, "meta.tags": json.loads(row["meta.tags"])}


@pytest.mark.parametrize("packing", sorted(PACKINGS))
def test_every_leaf_reads_back_as_written_in_any_order(tmp_path, packing):
    ds = Dataset.from_path("l", write(tmp_path / "ld", [item(i) for i in range(30)], **PACKINGS[packing]))
    assert ds.format_name == "litdata" and ds.counts().tolist() == [8, 8, 8, 6]
    assert ds.schema == pa.schema([("id", pa.int64()), ("text", pa.string()), ("tokens", pa.list_(pa.int32())),
                                   ("blob", pa.binary()), ("meta.i", pa.int64()), ("meta.tags", pa.string()),
                                   ("f", pa.float64()), ("ok", pa.bool_())])
    reader = ds.open_reader()
    got = reader.take(2, np.array([7, 0, 3, 3]))
    assert [as_written(r) for r in got.to_pylist()] == [expected(16 + i) for i in (7, 0, 3, 3)]
    only = ds.open_reader(columns=["tokens", "id"]).take(3, np.arange(6))
    assert only.column_names == ["tokens", "id"] and only.column("id").to_pylist() == list(range(24, 30))


def test_values_equal_what_litdatas_own_dataset_reads(tmp_path):
    folder = write(tmp_path / "ld", [item(i) for i in range(20)], compression="zstd")
    ds = Dataset.from_path("l", folder)
    mine = [r for s in ds.shards for r in ds.open_reader(columns=["id", "tokens", "text"]).take(
        s.shard_id, np.arange(s.num_rows)).to_pylist()]
    theirs = litdata().StreamingDataset(input_dir=folder)
    assert [(r["id"], r["tokens"], r["text"]) for r in mine] == [
        (x["id"], x["tokens"].tolist(), x["text"]) for x in (theirs[i] for i in range(len(theirs)))]


def test_chunks_holding_their_rows_as_an_arrow_table(tmp_path):
    # Plain dict rows (no array leaf): litdata writes them as a trailing Arrow table when
    # pyarrow is installed, with an empty body.
    rows = [{"id": i, "text": f"t{i}", "tags": ["x"] * (i % 3), "meta": {"k": i, "deep": {"z": -i}}} for i in range(12)]
    folder = write(tmp_path / "ld", rows)
    chunk = (tmp_path / "ld" / "chunk-0-0.bin").read_bytes()
    assert chunk.endswith(b"LDARW01\0")
    ds = Dataset.from_path("l", folder)
    assert ds.schema.names == ["id", "text", "tags", "meta.k", "meta.deep.z"]  # nested dicts: a leaf per field
    got = ds.open_reader().take(1, np.array([3, 1]))
    assert [(r["id"], r["text"], json.loads(r["tags"]), r["meta.k"], r["meta.deep.z"]) for r in got.to_pylist()] == [
        (11, "t11", ["x", "x"], 11, -11), (9, "t9", [], 9, -9)]


def test_a_tokens_loader_dataset_is_one_row_per_array(tmp_path):
    arrays = [np.arange(1 + i % 7, dtype=np.int32) + i for i in range(20)]
    folder = write(tmp_path / "ld", arrays, chunk_size=40, item_loader=litdata().TokensLoader())
    ds = Dataset.from_path("l", folder)
    assert ds.schema == pa.schema([("tokens", pa.list_(pa.int32()))]) and ds.total() == 20
    rows = [r["tokens"] for s in ds.shards for r in ds.open_reader().take(s.shard_id, np.arange(s.num_rows)).to_pylist()]
    assert rows == [a.tolist() for a in arrays]


def test_a_pickled_leaf_is_refused_by_name(tmp_path):
    folder = write(tmp_path / "ld", [{"id": i, "obj": np.int64(i)} for i in range(3)])  # a numpy scalar is pickled
    with pytest.raises(DatasetFormatError, match=r"index\.json: field 'obj' is pickled"):
        Dataset.from_path("l", folder)


def test_a_memory_url_is_read_through_the_shard_cache(tmp_path, memfs):
    mem, root = memfs
    folder = write(tmp_path / "ld", [item(i) for i in range(12)], compression="zstd")
    for f in (tmp_path / "ld").iterdir():
        mem.pipe(f"{root}/ld/{f.name}", f.read_bytes())
    ds = Dataset.from_path("l", f"{root}/ld")
    assert ds.format_name == "litdata" and ds.total() == 12 and folder
    assert as_written(ds.open_reader().take(1, np.array([3])).to_pylist()[0]) == expected(11)


def test_cut_chunks_and_broken_or_missing_indexes_are_named(tmp_path):
    folder = tmp_path / "ld"
    write(folder, [item(i) for i in range(20)])
    chunk = folder / "chunk-0-1.bin"
    chunk.write_bytes(chunk.read_bytes()[:-40])
    ds = Dataset.from_path("l", folder)
    with pytest.raises(DatasetFormatError, match=r"chunk-0-1\.bin is cut short"):
        ds.open_reader().take(1, np.array([0]))
    (folder / "index.json").write_text('{"chunks": [')
    with pytest.raises(DatasetFormatError, match=r"index\.json: the MDS or LitData index is not readable JSON"):
        Dataset.from_path("l", folder)
    (folder / "index.json").unlink()
    with pytest.raises(DatasetFormatError, match=r"chunk-0-\d\.bin.*index\.json, which is missing"):
        Dataset.from_path("l", folder)


def test_a_cut_compressed_chunk_is_named(tmp_path):
    folder = tmp_path / "ld"
    write(folder, [item(i) for i in range(20)], compression="zstd", compression_level="chunk")
    chunk = next(folder.glob("chunk-0-0*.bin"))
    chunk.write_bytes(chunk.read_bytes()[: chunk.stat().st_size // 2])
    with pytest.raises(DatasetFormatError, match=chunk.name.replace(".", r"\.")):
        Dataset.from_path("l", folder).open_reader().take(0, np.array([0]))
