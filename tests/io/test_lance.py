"""Lance datasets (`zephon_columnar.io.lance`), written by ``pylance``: a dataset folder is
detected and its fragments are the shards, values (nested ones too) read back as written in any
order, the version found at discovery is the one read (appends and deletions after it change
nothing until the dataset is discovered again), a dataset in S3 read by Lance itself, and missing
files, other URL kinds and a missing library named."""

from __future__ import annotations

import sys

import numpy as np
import pyarrow as pa
import pytest

from tests.extras import require
from zephon_columnar import Dataset
from zephon_columnar.errors import ConfigError, DatasetFormatError

lance = require("lance", "lance")


def table(start: int, n: int) -> pa.Table:
    ids = list(range(start, start + n))
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "text": [f"doc {i}" for i in ids],
        "tokens": pa.array([[i] * (1 + i % 4) for i in ids], pa.list_(pa.int32())),
        "meta": pa.array([{"source": f"s{i % 3}", "tags": ["a", "b"][: i % 3]} for i in ids]),
    })


def write(path, sizes=(12, 9, 15)) -> str:
    start = 0
    for k, n in enumerate(sizes):
        lance.write_dataset(table(start, n), str(path), mode="create" if k == 0 else "append")
        start += n
    return str(path)


def test_a_lance_folder_is_detected_and_its_fragments_are_the_shards(tmp_path):
    path = write(tmp_path / "corpus.lance")
    ds = Dataset.from_path("c", path)
    assert ds.format_name == "lance" and ds.counts().tolist() == [12, 9, 15]
    assert ds.schema == table(0, 5).schema
    assert Dataset.from_path("c", path, fmt="lance").total() == 36
    assert all(s.num_bytes > 0 for s in ds.shards)


def test_values_and_nested_fields_read_back_as_written_in_any_order(tmp_path):
    ds = Dataset.from_path("c", write(tmp_path / "corpus.lance"))
    rows = np.array([8, 0, 3, 3, 2])
    assert ds.open_reader().take(1, rows).to_pylist() == table(12, 9).take(pa.array(rows)).to_pylist()
    only = ds.open_reader(columns=["tokens", "id"]).take(2, np.arange(15))
    assert only.column_names == ["tokens", "id"] and only.column("id").to_pylist() == list(range(21, 36))


def test_the_version_found_at_discovery_is_read_until_discovered_again(tmp_path):
    path = write(tmp_path / "corpus.lance", sizes=(10,))
    ds = Dataset.from_path("c", path)
    lance.write_dataset(table(100, 5), path, mode="append")
    lance.dataset(path).delete("id = 3")
    assert ds.open_reader().take(0, np.arange(10)).column("id").to_pylist() == list(range(10))
    again = Dataset.from_path("c", path)
    assert again.counts().tolist() == [9, 5]  # the deleted row is not counted, and not read
    assert again.open_reader().take(0, np.arange(9)).column("id").to_pylist() == [0, 1, 2, 4, 5, 6, 7, 8, 9]


def test_a_missing_data_file_is_named_when_read(tmp_path):
    path = write(tmp_path / "corpus.lance", sizes=(10,))
    ds = Dataset.from_path("c", path)
    for f in (tmp_path / "corpus.lance" / "data").iterdir():
        f.unlink()
    with pytest.raises((DatasetFormatError, FileNotFoundError), match="corpus.lance"):
        ds.open_reader().take(0, np.arange(3))


def test_a_cut_manifest_is_named_at_discovery(tmp_path):
    path = write(tmp_path / "corpus.lance", sizes=(10,))
    for manifest in (tmp_path / "corpus.lance" / "_versions").iterdir():
        manifest.write_bytes(manifest.read_bytes()[:20])
    with pytest.raises(DatasetFormatError, match=r"corpus\.lance: not a readable Lance dataset"):
        Dataset.from_path("c", path)


def test_an_fsspec_url_lance_cannot_read_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"memory://corpus\.lance: Lance reads local folders"):
        from zephon_columnar.io.lance import open_version

        open_version("memory://corpus.lance", None)


def test_without_the_library_the_error_names_the_extra(tmp_path, monkeypatch):
    path = write(tmp_path / "corpus.lance", sizes=(4,))
    monkeypatch.setitem(sys.modules, "lance", None)  # import lance now fails
    with pytest.raises(ImportError, match=r"pip install 'zephon_columnar\[lance\]'"):
        Dataset.from_path("c", path)


def test_a_dataset_in_s3_is_read_by_lance_itself(tmp_path, monkeypatch):
    # Lance reads object stores through its own client (credentials and endpoint from the
    # environment), not through the shard cache: a real S3-compatible server on loopback.
    require("moto", "s3")
    s3fs = require("s3fs", "s3")
    from tests.s3_server import TEST_CREDENTIALS, FaultyS3Server

    server = FaultyS3Server().start()
    try:
        for key, value in {**TEST_CREDENTIALS, "AWS_ENDPOINT_URL": server.endpoint, "AWS_ALLOW_HTTP": "true"}.items():
            monkeypatch.setenv(key, value)
        store = s3fs.S3FileSystem(endpoint_url=server.endpoint)
        store.mkdir("corpus")
        store.put(write(tmp_path / "corpus.lance"), "s3://corpus/web.lance", recursive=True)
        ds = Dataset.from_path("c", "s3://corpus/web.lance")
        assert ds.format_name == "lance" and ds.counts().tolist() == [12, 9, 15]
        assert ds.open_reader().take(2, np.array([14, 0])).column("id").to_pylist() == [35, 21]
    finally:
        server.stop()


@pytest.mark.parametrize("runner", ["inline", "process"])
def test_a_vector_column_reaches_records_as_numpy_arrays(tmp_path, runner):
    """Fixed-size lists of numbers (vector columns) reach records as read-only numpy arrays of
    their dtype (Zephon's rule for numeric lists); fixed-size lists of other values as lists."""
    from zephon_columnar import Pipeline, StaticMixtureWorkSource

    vectors = pa.array([[i, i + 0.5] if i != 3 else None for i in range(10)], pa.list_(pa.float32(), 2))
    pairs = pa.array([[True, i % 2 == 0] for i in range(10)], pa.list_(pa.bool_(), 2))
    lance.write_dataset(pa.table({"id": pa.array(range(10), pa.int64()), "vec": vectors, "pair": pairs}),
                        str(tmp_path / "v.lance"), max_rows_per_file=4)
    ds = Dataset.from_path("v", str(tmp_path / "v.lance"))
    assert ds.schema.field("vec").type == vectors.type and ds.schema.field("pair").type == pairs.type
    work = StaticMixtureWorkSource([ds], {"v": 1.0}, chunk_size=3, shuffle_shards=False, shuffle_within_shard=False)
    records = [r for b in Pipeline(work).batch(4, drop_last=False).options(runner=runner, max_workers=2)
               for r in b.records]
    assert sorted(r.payload["id"] for r in records) == list(range(10))
    for r in records:
        i, vec = r.payload["id"], r.payload["vec"]
        if i == 3:
            assert vec is None
        else:
            assert isinstance(vec, np.ndarray) and vec.dtype == np.float32 and vec.tolist() == [i, i + 0.5]
        assert r.payload["pair"] == [True, i % 2 == 0]
