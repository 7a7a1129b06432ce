"""Vortex files (`zephon_columnar.io.vortex`), written by ``vortex-data``: detection, row counts
from the footers, the plain Arrow types (never the view types Vortex hands back), values and
nested fields read back as written in any order, fsspec URLs through the shard cache, and cut
or foreign files and a missing library named."""

from __future__ import annotations

import sys

import numpy as np
import pyarrow as pa
import pytest

from tests.extras import require
from zephon_columnar import Dataset
from zephon_columnar.errors import DatasetFormatError
from zephon_columnar.io.vortex import VortexReader

vortex = require("vortex", "vortex")


def table(start: int, n: int) -> pa.Table:
    ids = list(range(start, start + n))
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "text": [f"doc {i} " + "x" * (i % 7) for i in ids],
        "tokens": pa.array([[i] * (1 + i % 4) for i in ids], pa.list_(pa.int32())),
        "blob": [bytes([i % 256]) * (i % 3) for i in ids],
        "meta": pa.array([{"source": f"s{i % 3}", "tags": ["a", "b"][: i % 3]} for i in ids]),
    })


def write(folder, sizes=(12, 9)):
    folder.mkdir(parents=True, exist_ok=True)
    start = 0
    for k, n in enumerate(sizes):
        vortex.io.write(table(start, n), str(folder / f"part-{k:03d}.vortex"))
        start += n
    return folder


def test_a_folder_of_vortex_files_is_detected_with_plain_arrow_types(tmp_path):
    ds = Dataset.from_path("v", write(tmp_path))
    assert ds.format_name == "vortex" and ds.counts().tolist() == [12, 9]
    assert ds.schema.types == table(0, 5).schema.types  # string and binary, not their view types
    assert Dataset.from_path("v", tmp_path / "part-001.vortex", fmt="vortex").total() == 9


def test_values_and_nested_fields_read_back_as_written_in_any_order(tmp_path):
    ds = Dataset.from_path("v", write(tmp_path))
    rows = np.array([8, 0, 3, 3, 2])
    got = ds.open_reader().take(1, rows)
    assert got.schema == ds.schema
    assert got.to_pylist() == table(12, 9).take(pa.array(rows)).to_pylist()
    only = ds.open_reader(columns=["tokens", "id"]).take(0, np.arange(12))
    assert only.column_names == ["tokens", "id"] and only.column("id").to_pylist() == list(range(12))


def test_a_memory_url_is_read_through_the_shard_cache(tmp_path, memfs):
    mem, root = memfs
    write(tmp_path, sizes=(7,))
    mem.pipe(f"{root}/v/part-000.vortex", (tmp_path / "part-000.vortex").read_bytes())
    ds = Dataset.from_path("m", f"{root}/v")
    assert ds.total() == 7 and ds.open_reader().take(0, np.array([6])).column("text").to_pylist() == [table(0, 7)["text"][6].as_py()]


def test_a_cut_or_foreign_file_is_named(tmp_path):
    write(tmp_path, sizes=(40,))
    data = (tmp_path / "part-000.vortex").read_bytes()
    (tmp_path / "part-000.vortex").write_bytes(data[: len(data) // 2])
    with pytest.raises(DatasetFormatError, match=r"part-000\.vortex: not a readable Vortex file"):
        Dataset.from_path("v", tmp_path)
    (tmp_path / "part-000.vortex").write_bytes(b"PAR1 not vortex" * 50)
    with pytest.raises(DatasetFormatError, match=r"part-000\.vortex: not a readable Vortex file"):
        Dataset.from_path("v", tmp_path)


def test_without_the_library_the_error_names_the_extra(tmp_path, monkeypatch):
    write(tmp_path, sizes=(3,))
    monkeypatch.setitem(sys.modules, "vortex", None)
    with pytest.raises(ImportError, match=r"pip install 'zephon_columnar\[vortex\]'"):
        Dataset.from_path("v", tmp_path)


@pytest.mark.parametrize("whole_file_bytes, cache_bytes", [(0, 0), (1 << 30, 1), (1 << 30, 1 << 30)],
                         ids=["by-index", "whole-files-evicted", "whole-files-kept"])
def test_both_read_paths_return_the_rows_asked(tmp_path, whole_file_bytes, cache_bytes):
    from zephon_columnar.io.vortex import VortexReader

    ds = Dataset.from_path("v", write(tmp_path))
    reader = VortexReader(ds, columns=["id", "text"], whole_file_bytes=whole_file_bytes, decoded_cache_bytes=cache_bytes)
    for shard, rows in ((1, [8, 0, 3, 3]), (0, [11, 2]), (1, [4, 5, 6]), (0, list(range(12)))):
        got = reader.take(shard, np.array(rows))
        assert got.column_names == ["id", "text"]
        assert got.column("id").to_pylist() == [12 * shard + r for r in rows]


@pytest.mark.parametrize("values", [
    pa.array([10, None, 30, 40], pa.int16()),
    pa.array(["zero", None, "two", "three"]),
    pa.array([[1, 2], None, [], [3]], pa.list_(pa.int16())),
], ids=["int16", "string", "list"])
def test_a_file_of_bare_values_reads_as_one_value_column(tmp_path, values):
    """A root that is not a struct: one column, ``value``, in its plain type, whole or by index."""
    vortex.io.write(vortex.array(values), str(tmp_path / "bare.vortex"))
    ds = Dataset.from_path("bare", str(tmp_path), fmt="vortex")
    plain = values.cast(pa.list_(pa.int16()) if pa.types.is_list(values.type) else values.type)
    assert ds.schema == pa.schema([pa.field("value", plain.type)]) and ds.total() == 4
    rows = np.array([3, 0, 3, 1])
    assert ds.open_reader().take(0, rows).column("value").to_pylist() == [values[i].as_py() for i in rows]
    big = VortexReader(ds, whole_file_bytes=0)  # read by index, not decoded whole
    assert big.take(0, rows).equals(ds.open_reader().take(0, rows))
    assert ds.open_reader(columns=[]).take(0, rows).num_rows == 4
