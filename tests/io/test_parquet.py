"""Parquet: discovery from footers and the row-group-aware reader."""

from __future__ import annotations

import io
import os
import time
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon_columnar.errors import ConfigError, DatasetFormatError
from zephon_columnar.io import Dataset
from zephon_columnar.io.parquet import ParquetReader


def make_table(n: int, start: int = 0) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    lens = (ids % 7) + 1
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    return pa.table({
        "id": ids,
        "text": [f"doc {i} " + "x" * int(i % 13) for i in ids],
        "tokens": pa.ListArray.from_arrays(offsets, np.arange(offsets[-1], dtype=np.int32)),
    })


@pytest.fixture()
def pq_dir(tmp_path):
    """3 shards of 1000, 777 and 1300 rows; row groups of 100 rows."""
    d = tmp_path / "pq"
    d.mkdir()
    start = 0
    for i, n in enumerate([1000, 777, 1300]):
        pq.write_table(make_table(n, start), d / f"part-{i}.parquet", row_group_size=100)
        start += n
    return d


def test_discovery_reads_counts_row_groups_and_sizes_from_footers(pq_dir):
    ds = Dataset.from_path("web", str(pq_dir))
    assert ds.format.name == "parquet"
    assert ds.counts().tolist() == [1000, 777, 1300] and len(ds) == 3077
    assert ds.shards[1].extra["row_groups"] == (100,) * 7 + (77,)
    assert ds.raw_bytes().tolist() == [os.path.getsize(pq_dir / f"part-{i}.parquet") for i in range(3)]
    assert ds.schema.names == ["id", "text", "tokens"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_take_returns_exactly_the_rows_asked_in_order(pq_dir, seed):
    ds = Dataset.from_path("web", str(pq_dir))
    rng = np.random.default_rng(seed)
    reader = ds.open_reader()
    for shard in range(3):
        full = pq.read_table(pq_dir / f"part-{shard}.parquet")
        n = full.num_rows
        for rows in (rng.integers(0, n, 257),  # random, with repeats, across row groups
                     rng.permutation(n)[:50],
                     np.array([n - 1, 0, n - 1]),
                     np.arange(150, 380),  # consecutive across row groups
                     np.arange(210, 260),  # consecutive inside one row group
                     rng.integers(300, 400, 30),  # random inside one row group
                     np.array([5])):
            got = reader.take(shard, rows)
            assert got.equals(full.take(pa.array(rows))), (shard, rows[:5])
    reader.close()


def test_empty_take_has_the_schema(pq_dir):
    reader = Dataset.from_path("web", str(pq_dir)).open_reader()
    got = reader.take(0, np.array([], dtype=np.int64))
    assert got.num_rows == 0 and got.schema.names == ["id", "text", "tokens"]


def test_sequential_scan_decodes_each_row_group_once(pq_dir):
    ds = Dataset.from_path("web", str(pq_dir))
    for step in (1024, 7, 100):
        reader = ParquetReader(ds)
        for shard, n in enumerate(ds.counts().tolist()):
            parts = [reader.take(shard, np.arange(s, min(n, s + step))) for s in range(0, n, step)]
            assert pa.concat_tables(parts).equals(pq.read_table(pq_dir / f"part-{shard}.parquet"))
        assert reader.stats["decoded_groups"] == sum(len(s.extra["row_groups"]) for s in ds.shards), step


def test_rows_inside_one_row_group_are_zero_copy_slices(pq_dir):
    reader = ParquetReader(Dataset.from_path("web", str(pq_dir)))
    first = reader.take(0, np.arange(110, 140))
    again = reader.take(0, np.arange(120, 125))
    assert reader.stats["decoded_groups"] > 0
    decoded = reader.stats["decoded_groups"]
    # Same decoded buffer, offset by 10 rows: no decode and no copy for the second take.
    a = first.column("id").chunk(0)
    b = again.column("id").chunk(0)
    assert a.buffers()[1].address == b.buffers()[1].address and b.offset == a.offset + 10
    assert reader.stats["decoded_groups"] == decoded


def test_a_tiny_row_group_cache_still_gives_correct_rows(pq_dir):
    ds = Dataset.from_path("web", str(pq_dir))
    reader = ParquetReader(ds, cache_bytes=1, max_open_files=1)
    rng = np.random.default_rng(3)
    for _ in range(20):
        shard = int(rng.integers(0, 3))
        rows = rng.integers(0, ds.shards[shard].num_rows, 40)
        full = pq.read_table(pq_dir / f"part-{shard}.parquet")
        assert reader.take(shard, rows).equals(full.take(pa.array(rows)))
    assert reader._decoded.held_by(reader._owner)[0] <= 1 and len(reader._open) == 1


def test_column_projection_reads_only_those_columns(pq_dir):
    ds = Dataset.from_path("web", str(pq_dir))
    reader = ParquetReader(ds, columns=["text"])
    got = reader.take(1, np.array([3, 2]))
    assert got.column_names == ["text"] and got.column("text").to_pylist() == ["doc 1003 " + "x" * 2, "doc 1002 " + "x"]
    with pytest.raises(ConfigError, match=r"no column\(s\) \['nope'\].*\['id', 'text', 'tokens'\]"):
        ParquetReader(ds, columns=["nope"])


def test_out_of_range_rows_name_the_file(pq_dir):
    reader = Dataset.from_path("web", str(pq_dir)).open_reader()
    with pytest.raises(IndexError, match=r"part-1\.parquet: row 777 is out of range"):
        reader.take(1, np.array([0, 777]))


def test_a_corrupt_file_is_named_with_what_to_do(pq_dir):
    (pq_dir / "part-1.parquet").write_bytes(b"this is not parquet at all")
    with pytest.raises(DatasetFormatError, match=r"part-1\.parquet: not a readable Parquet file.*Re-write") as e:
        Dataset.from_path("web", str(pq_dir))
    assert isinstance(e.value.__cause__, (pa.ArrowInvalid, OSError))


def test_a_shard_with_another_schema_is_named(pq_dir):
    pq.write_table(make_table(10).drop_columns(["tokens"]), pq_dir / "part-2.parquet")
    with pytest.raises(DatasetFormatError, match=r"shard 2 \(part-2\.parquet\).*differs from shard 0.*tokens"):
        Dataset.from_path("web", str(pq_dir))


def test_shards_with_the_same_columns_in_another_order_read_in_the_first_shards_order(tmp_path):
    from zephon_columnar import Pipeline, StaticMixtureWorkSource
    from zephon_columnar import frame as F

    a, b = make_table(30), make_table(20, 30)
    pq.write_table(a, tmp_path / "part-0.parquet", row_group_size=8)
    pq.write_table(b.select(["tokens", "text", "id"]), tmp_path / "part-1.parquet", row_group_size=8)
    expected = pa.concat_tables([a, b]).to_pylist()  # row i is the row with id i
    ds = Dataset.from_path("web", str(tmp_path))
    assert ds.schema.names == ["id", "text", "tokens"]
    reader = ds.open_reader()
    for shard, start in ((0, 0), (1, 30)):
        for rows in (np.array([7, 2, 19]), np.arange(3, 17)):  # random rows and a run across row groups
            got = reader.take(shard, rows)
            assert got.column_names == ["id", "text", "tokens"]
            assert got.to_pylist() == [expected[i] for i in rows + start]
    # Through a pipeline: batches mix rows of both shards (a concatenation needs one schema).
    ws = StaticMixtureWorkSource([ds], {"web": 1.0}, chunk_size=8, seed=1, shuffle_within_shard=True)
    batches = list(Pipeline(ws).batch(7, drop_last=False))  # 7 divides neither 30 nor 20: a batch spans both shards
    ids = []
    for b in batches:
        payload = F.payload_of(b.table)
        assert payload.column_names == ["id", "text", "tokens"]
        assert payload.to_pylist() == [expected[i] for i in payload.column("id").to_pylist()]
        ids += payload.column("id").to_pylist()
    assert sorted(ids) == list(range(50))
    assert any(len({i < 30 for i in F.payload_of(b.table).column("id").to_pylist()}) == 2 for b in batches)


def test_a_file_rewritten_after_discovery_is_detected(pq_dir):
    ds = Dataset.from_path("web", str(pq_dir))
    pq.write_table(make_table(1000), pq_dir / "part-0.parquet", row_group_size=250)
    with pytest.raises(DatasetFormatError, match=r"part-0\.parquet: row groups .* changed since"):
        ds.open_reader().take(0, np.array([0]))


def test_random_rows_decode_only_the_row_groups_they_touch(pq_dir):
    reader = ParquetReader(Dataset.from_path("web", str(pq_dir)))
    got = reader.take(0, np.array([950, 3, 960, 10]))  # row groups 9 and 0 of 10
    assert got.column("id").to_pylist() == [950, 3, 960, 10]
    assert reader.stats["decoded_groups"] == 2


def test_only_a_scan_reads_ahead(pq_dir):
    reader = ParquetReader(Dataset.from_path("web", str(pq_dir)))  # shard 0: 10 row groups of 100
    reader.take(0, np.array([5]))  # a first take: nothing says what comes next
    reader.take(0, np.array([450, 430]))  # scattered rows (a restore recomputing held documents)
    reader.take(0, np.arange(600, 650))  # consecutive, but not where the last take ended
    assert reader.stats["decoded_groups"] == 3  # row groups 0, 4 and 6: only what was asked
    got = reader.take(0, np.arange(650, 720))  # continues the last take: a scan reads ahead
    assert got.column("id").to_pylist() == list(range(650, 720))
    assert reader.stats["decoded_groups"] == 6 and reader.stats["decode_calls"] == 4  # 7, 8, 9 at once


def unreadable(path) -> str:
    """The start of the error for a file the OS refuses to read."""
    return rf"^{re.escape(str(path))}: cannot be read \(Permission denied\)\. Give this process read permission"


def test_an_unreadable_file_is_a_permission_error_naming_it_not_a_corrupt_one(pq_dir, deny_read):
    path = pq_dir / "part-1.parquet"
    ds = Dataset.from_path("web", str(pq_dir))  # discovered while readable
    deny_read(path)
    for action in (lambda: ds.open_reader().take(1, np.array([0])), lambda: Dataset.from_path("web", str(pq_dir))):
        with pytest.raises(PermissionError, match=unreadable(path)) as e:
            action()
        assert not isinstance(e.value, ValueError)  # not reported as a corrupt file
        assert isinstance(e.value.__cause__, PermissionError)


def test_a_corrupt_remote_footer_is_a_format_error_at_once_not_retried(memfs):
    mem, root = memfs
    # Valid magic bytes around a footer Arrow cannot parse: Arrow raises an OSError for it.
    mem.pipe(f"{root}/bad/a.parquet", b"PAR1" + b"x" * 100 + (16).to_bytes(4, "little") + b"PAR1")
    t0 = time.monotonic()
    with pytest.raises(DatasetFormatError, match=r"bad/a\.parquet: not a readable Parquet file"):
        Dataset.from_path("web", f"{root}/bad")
    assert time.monotonic() - t0 < 0.5  # no retries with backoff: the bytes arrived, they are wrong


def test_a_remote_footer_larger_than_the_first_range_is_read_whole(memfs):
    mem, root = memfs
    buf = io.BytesIO()
    pq.write_table(pa.table({"id": np.arange(20_000)}), buf, row_group_size=10)  # 2,000 row groups
    data = buf.getvalue()
    assert int.from_bytes(data[-8:-4], "little") > 64 << 10  # the footer is past the first 64 KiB read
    mem.pipe(f"{root}/many/a.parquet", data)
    ds = Dataset.from_path("web", f"{root}/many")
    assert ds.counts().tolist() == [20_000] and ds.shards[0].extra["row_groups"] == (10,) * 2000
