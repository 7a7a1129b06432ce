"""`Dataset` constructors over in-memory shards: shard ids are kept as given, readers look
shards up by id, and every record's sample id carries the id its shard was given."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import zephon_columnar
from zephon_columnar.errors import ConfigError
from zephon_columnar.io import Dataset, InMemoryShard
from zephon_columnar.work import StaticMixtureWorkSource


def shard_rows(shard: int, n: int) -> list[dict]:
    return [{"shard": shard, "row": r, "text": f"s{shard}-r{r}"} for r in range(n)]


@pytest.fixture()
def given_ids() -> Dataset:
    """Shard 5 (7 rows) and shard 2 (5 rows), given in that (unsorted) order."""
    return Dataset.from_dict("m", {5: InMemoryShard(shard_rows(5, 7)), 2: InMemoryShard(shard_rows(2, 5))})


class PairsMapping(Mapping):
    """A Mapping over (key, value) pairs that may repeat a key (as a parsed config can)."""

    def __init__(self, pairs: list[tuple[Any, Any]]) -> None:
        self._pairs = pairs

    def __getitem__(self, key: Any) -> Any:
        return next(v for k, v in self._pairs if k == key)

    def __iter__(self) -> Iterator[Any]:
        return iter(k for k, _ in self._pairs)

    def __len__(self) -> int:
        return len(self._pairs)


def test_from_dict_keeps_the_given_shard_ids_sorted(given_ids):
    assert given_ids.ids().tolist() == [2, 5]
    assert given_ids.counts().tolist() == [5, 7]
    assert given_ids.shard(5).num_rows == 7 and given_ids.shard(2).num_rows == 5


@pytest.mark.parametrize("columns", [None, ["text"]])
def test_in_memory_readers_take_shards_by_id(given_ids, columns):
    for reader in (given_ids.open_reader(columns=columns), given_ids.open_reader()):
        assert reader.take(5, np.array([6, 0])).column("text").to_pylist() == ["s5-r6", "s5-r0"]
        assert reader.take(2, np.array([4])).column("text").to_pylist() == ["s2-r4"]
        # Positions 0 and 1, and a negative id, are not shard ids: never another shard's rows.
        for wrong in (0, 1, -1):
            with pytest.raises(IndexError, match=rf"shard {wrong} does not exist.*ids \[2, 5\]"):
                reader.take(wrong, np.array([0]))


def test_a_shard_id_that_does_not_exist_is_named(given_ids):
    with pytest.raises(IndexError, match=r"shard 3 does not exist; dataset 'm' has 2 shards with ids \[2, 5\]"):
        given_ids.shard(3)


@pytest.mark.parametrize("shards, named", [
    ({-1: [{"x": 1}]}, "-1"),
    (PairsMapping([(4, [{"x": 1}]), (4, [{"x": 2}])]), "4"),
    ({"a": [{"x": 1}]}, "'a'"),
    ({True: [{"x": 1}]}, "True"),
])
def test_from_dict_refuses_negative_duplicate_and_non_int_ids(shards, named):
    with pytest.raises(ConfigError, match=rf"Dataset 'm': .*shard ids? .*{re.escape(named)}"):
        Dataset.from_dict("m", shards)


def test_from_tables_refuses_duplicate_ids_and_a_wrong_count():
    tables = [pa.table({"x": [1]}), pa.table({"x": [2]})]
    with pytest.raises(ConfigError, match=r"duplicate shard ids \[7\]"):
        Dataset.from_tables("m", tables, shard_ids=[7, 7])
    with pytest.raises(ConfigError, match=r"3 shard ids for 2 tables"):
        Dataset.from_tables("m", tables, shard_ids=[1, 2, 3])
    ds = Dataset.from_tables("m", tables, shard_ids=[9, 3])  # sorted by id, tables follow
    assert ds.ids().tolist() == [3, 9]
    assert ds.open_reader().take(9, np.array([0])).column("x").to_pylist() == [1]


def test_from_tables_reads_shards_with_reordered_columns_in_the_first_shards_order():
    a = pa.table({"id": [0, 1], "text": ["a0", "a1"]})
    b = pa.table({"text": ["b0"], "id": [2]})
    ds = Dataset.from_tables("m", [a, b])
    reader = ds.open_reader()
    assert reader.take(1, np.array([0])).to_pylist() == [{"id": 2, "text": "b0"}]
    assert reader.take(1, np.array([0])).column_names == ["id", "text"]


def test_pipeline_over_given_shard_ids_yields_each_row_once_with_those_ids(given_ids):
    ws = StaticMixtureWorkSource([given_ids], {"m": 1.0}, chunk_size=4)
    records = list(zephon_columnar.Pipeline(ws))
    seen = Counter()
    for r in records:
        dataset_id, shard_id, row = r.meta.sample_id
        assert dataset_id == 0
        assert (r.payload["shard"], r.payload["row"]) == (shard_id, row)  # the id names the rows' shard
        seen[(shard_id, row)] += 1
    assert {s for s, _ in seen} == {2, 5}
    assert seen == Counter([(2, r) for r in range(5)] + [(5, r) for r in range(7)])


def test_shards_that_really_differ_name_each_differing_column():
    from zephon_columnar.errors import DatasetFormatError

    first = pa.table({"id": pa.array([1], pa.int64()), "text": ["a"]})
    cases = [
        (pa.table({"id": ["1"], "text": ["b"]}), r"column 'id' is string, not int64"),
        (pa.table({"text": ["b"]}), r"column 'id' \(int64\) is missing"),
        (pa.table({"id": [2], "text": ["b"], "x": [0.5]}), r"column 'x' \(double\) is not in shard 0"),
        (pa.Table.from_arrays([pa.array([2]), pa.array(["b"])],
                              schema=pa.schema([pa.field("id", pa.int64(), nullable=False), ("text", pa.string())])),
         r"column 'id' is int64 not null, not int64"),
    ]
    for other, named in cases:
        with pytest.raises(DatasetFormatError, match=rf"Dataset 'm': shard 1 has a schema that differs from shard 0: {named}"):
            Dataset.from_tables("m", [first, other])


def test_rows_without_fields_are_rows_through_fetch_and_a_map():
    # [{}, {}] is two samples (an operator gives them fields), not an empty shard: Arrow alone
    # would count no row in a table without columns, in from_pylist, take and concat alike.
    shard = InMemoryShard([{}, {}, {}])
    assert len(shard) == 3 and shard[2] == {} and shard.getsamples([0, 2]) == [{}, {}]
    ds = Dataset.from_dict("d", {0: shard, 1: InMemoryShard([{}])})
    assert list(ds.counts()) == [3, 1]
    ws = StaticMixtureWorkSource([ds], {"d": 1.0}, chunk_size=2, seed=3)
    texts = [r.payload["text"] for r in zephon_columnar.Pipeline(ws).map_transform(lambda row: {"text": "x"})]
    assert texts == ["x"] * 4  # every row of one pass, fetched in any grouping
