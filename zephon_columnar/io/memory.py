"""Data held in memory: `InMemoryShard` (what ``Dataset.from_dict`` takes: tests, quick starts),
and the format of datasets over in-memory Arrow tables (`InMemoryTables`) with its reader
(`TableReader`).

Example:
    >>> shard = InMemoryShard([{"text": "hello"}, {"text": "world"}])
    >>> len(shard), shard[1], shard.getsamples([0])
    (2, {'text': 'world'}, [{'text': 'hello'}])
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from zephon_columnar import frame as F
from zephon_columnar.errors import ConfigError
from zephon_columnar.io.base import ShardReader, check_columns, describe_ids
from zephon_columnar.io.format import Format
from zephon_columnar.io.tables import take_rows

if TYPE_CHECKING:
    from zephon_columnar.io.dataset import Dataset


class InMemoryShard:
    """A shard held in memory: a list of row dicts (or an Arrow table).

    Example:
        >>> InMemoryShard([{"text": "hello"}]).getsamples([0])
        [{'text': 'hello'}]
    """

    def __init__(self, rows: Sequence[Mapping[str, Any]] | pa.Table) -> None:
        if isinstance(rows, pa.Table):
            self.table = rows
        else:
            rows = list(rows)
            bad = next((i for i, r in enumerate(rows) if not isinstance(r, Mapping)), None)
            if bad is not None:
                raise ConfigError(
                    f"InMemoryShard row {bad} is a {type(rows[bad]).__name__}, not a dict; "
                    "pass a list of {column: value} dicts."
                )
            self.table = pa.Table.from_pylist(rows) if any(rows) else F.no_fields(len(rows))  # [{}, {}]: 2 rows

    def __len__(self) -> int:
        rows: int = self.table.num_rows
        return rows

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"InMemoryShard: row {index} is out of range for a shard of {len(self)} rows.")
        row: dict[str, Any] = self.table.slice(index % len(self), 1).to_pylist()[0]
        return row

    @property
    def raw_bytes(self) -> int:
        """The payload's content bytes, as Zephon counts them: UTF-8 bytes of strings, bytes of
        binaries, 8 per number, bool or null; lists and structs the sum of their members (no
        keys, no container overhead)."""
        return sum(content_bytes(column) for column in self.table.columns)

    def getsamples(self, indices: Iterable[int]) -> list[dict[str, Any]]:
        positions = [int(i) for i in indices]
        if not self.table.num_columns:  # rows without fields: Arrow's take would return none
            return [self[i] for i in positions]
        rows: list[dict[str, Any]] = self.table.take(pa.array(positions, pa.int64())).to_pylist()
        return rows

    def close(self) -> None:
        pass


def content_bytes(values: pa.Array | pa.ChunkedArray) -> int:
    """Content bytes of an Arrow column (see `InMemoryShard.raw_bytes`), computed column-wise.

    Example:
        >>> content_bytes(pa.array(["abcd", None, "é"])), content_bytes(pa.array([[1, 2], None]))
        (14, 24)
    """
    if isinstance(values, pa.ChunkedArray):
        return sum(content_bytes(chunk) for chunk in values.chunks)
    kind = values.type
    nulls = int(values.null_count) * 8
    if pa.types.is_dictionary(kind):
        return content_bytes(values.dictionary_decode())
    if (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
    ):
        return int(pc.sum(pc.binary_length(values)).as_py() or 0) + nulls
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return content_bytes(values.flatten()) + nulls
    if pa.types.is_struct(kind):
        return sum(content_bytes(child) for child in values.flatten()) + nulls
    return 8 * len(values)  # numbers, bools, temporals and nulls: 8 each


@dataclass(frozen=True, eq=False)
class InMemoryTables(Format):
    """The format of a dataset over Arrow tables held in memory (``Dataset.from_dict``,
    ``from_tables``, ``from_hf``): ``tables[i]`` is the shard ``dataset.shards[i]``.

    Example:
        >>> ds = Dataset.from_tables("t", [pa.table({"x": [1, 2]}), pa.table({"x": [3]})])
        >>> ds.format.name, ds.format.open_reader(ds).take(1, np.array([0])).column("x").to_pylist()
        ('inmem', [3])
    """

    name: ClassVar[str] = "inmem"
    tables: tuple[pa.Table, ...]

    def open_reader(self, dataset: Dataset, *, columns: Sequence[str] | None = None) -> ShardReader:
        tables = self.tables
        if columns is not None and tables:
            selected = check_columns(dataset.name, dataset.schema, columns)
            tables = tuple(t.select(selected) for t in tables)  # zero-copy
        return TableReader(tables, [s.shard_id for s in dataset.shards], dataset=dataset.name)


class TableReader:
    """Reader over in-memory Arrow tables, one per shard, looked up by shard id.

    ``shard_ids[i]`` is the id of ``tables[i]`` (default ``0..n-1``). ``take`` returns zero-copy
    slices where possible; an id that is none of them raises IndexError naming the ids (it never
    falls back to a position, so it cannot read another shard's rows).

    Example:
        >>> reader = TableReader([pa.table({"x": [1, 2]}), pa.table({"x": [3]})], shard_ids=[2, 5])
        >>> reader.take(5, np.array([0])).column("x").to_pylist()
        [3]
    """

    def __init__(
        self, tables: Sequence[pa.Table], shard_ids: Sequence[int] | None = None, *, dataset: str | None = None
    ) -> None:
        ids = list(range(len(tables))) if shard_ids is None else [int(i) for i in shard_ids]
        if len(ids) != len(tables):
            raise ConfigError(f"TableReader: {len(ids)} shard ids for {len(tables)} tables; pass one id per table.")
        self._tables = dict(zip(ids, tables))
        self._dataset = dataset

    def take(self, shard_id: int, rows: np.ndarray) -> pa.Table:
        table = self._tables.get(int(shard_id))
        if table is None:
            who = "this dataset" if self._dataset is None else f"dataset {self._dataset!r}"
            raise IndexError(
                f"shard {shard_id} does not exist; {who} has {len(self._tables)} shards with ids "
                f"{describe_ids(list(self._tables))}. Pass one of those ids."
            )
        return take_rows(table, rows)

    def close(self) -> None:
        pass


__all__ = ["InMemoryShard", "InMemoryTables", "TableReader"]
