"""`Dataset`: a named collection of shards with known row counts, and `InMemoryShard`.

A dataset is metadata only (names, paths, row counts); reading happens through the
:class:`~zephon_columnar.io.base.ShardReader` that :meth:`Dataset.open_reader` returns, one
per worker. Row counts come from metadata (Parquet footers, a cached JSONL line index, Arrow
IPC batch headers), so discovery never reads the data twice.

Example:
    >>> ds = Dataset.from_dict("toy", {0: InMemoryShard([{"text": "a"}, {"text": "b"}])})
    >>> len(ds), ds.shard_count()
    (2, 1)
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.errors import ConfigError
from zephon_columnar.io.base import ShardInfo, ShardReader, describe_ids, shard_info
from zephon_columnar.io.memory import InMemoryShard

DatasetFormat = Literal["parquet", "jsonl", "hf", "arrow"]


def _read_only(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)  # the dataset's metadata: a caller must not edit it through a view
    return array


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


def take_rows(table: pa.Table, rows: np.ndarray) -> pa.Table:
    """Rows ``rows`` of ``table`` in order: a zero-copy slice when they are consecutive."""
    n = len(rows)
    if n == 0:
        return table.slice(0, 0)
    if table.num_columns == 0:  # rows without fields: Arrow's take would return none
        return F.no_fields(n)
    start = int(rows[0])
    if int(rows[-1]) - start == n - 1 and (n < 3 or bool(np.all(np.diff(rows) == 1))):
        return table.slice(start, n)
    return table.take(pa.array(rows, pa.int64()))


def in_column_order(table: pa.Table, names: Sequence[str]) -> pa.Table:
    """``table`` with its columns in the order ``names`` (zero-copy; as-is when already so).

    Shards of one dataset may store the same columns in another order; readers return every
    shard in the dataset schema's order (the first shard's), so shards concatenate.
    """
    if table.column_names == list(names):
        return table
    return table.select(list(names))


@dataclass(frozen=True, eq=False)
class Dataset:
    """A named dataset: shards with row counts, plus how to read them.

    ``backend`` is an opaque description of the storage (``{"kind": "parquet", ...}``);
    ``path`` the root it was discovered under (None in memory). ``shards`` are sorted by id.
    Discovered datasets number their shards ``0..n-1`` in sorted file-name order; in-memory
    ones (:meth:`from_dict`, :meth:`from_tables` with ``shard_ids``) keep the ids they were
    given. Readers and :meth:`shard` look shards up by id, and the work source's pointers
    ``(dataset_id, shard_id, row)`` carry these ids.
    """

    name: str
    backend: Mapping[str, Any]
    path: str | None = None
    shards: tuple[ShardInfo, ...] = ()  # Dataset(name, backend) alone, as Zephon's: no shards

    # ---------------------------------------------------------------- constructors
    @classmethod
    def from_path(cls, name: str, path: str, *, fmt: DatasetFormat | None = None) -> Dataset:
        """Discover a directory (local path or fsspec URL) of Parquet, JSONL (``.jsonl``,
        ``.jsonl.gz``, ``.jsonl.zst``) or Arrow files (a Hugging Face ``save_to_disk`` folder).

        The format is detected from file suffixes unless ``fmt`` is given.

        Example:
            >>> Dataset.from_path("web", "data/web")
            Dataset(name='web', kind='parquet', path='data/web', shards=2, rows=32)
            >>> Dataset.from_path("wiki", "data/wiki_train")  # a save_to_disk folder
            Dataset(name='wiki', kind='hf_arrow', path='data/wiki_train', shards=2, rows=16)
        """
        from zephon_columnar.io.discovery import discover

        return discover(name, path, fmt=fmt)

    @classmethod
    def from_dict(cls, name: str, shards: Mapping[int, InMemoryShard]) -> Dataset:
        """A dataset of in-memory shards keyed by shard id (an int >= 0).

        The ids are kept: ``ids()`` lists them sorted, readers take rows by them and every
        record's ``meta.sample_id`` is ``(dataset_id, shard_id, row)`` with the id given here.
        A value may be an :class:`InMemoryShard` or what one accepts (row dicts, an Arrow table).
        A negative, non-int or repeated id raises :class:`ConfigError` naming it.

        Example:
            >>> ds = Dataset.from_dict("m", {5: InMemoryShard([{"t": "a"}]), 2: InMemoryShard([{"t": "b"}])})
            >>> ds.ids().tolist(), ds.open_reader().take(5, np.array([0])).column("t").to_pylist()
            ([2, 5], ['a'])
        """
        ids, tables = [], []
        for key in shards:
            ids.append(_check_shard_id(name, key))
            shard = shards[key]
            if not isinstance(shard, InMemoryShard):
                shard = InMemoryShard(shard)
            tables.append(shard.table)
        return cls.from_tables(name, tables, kind="inmem", shard_ids=ids)

    @classmethod
    def from_hf(cls, name: str, hf_dataset: Any) -> Dataset:
        """Wrap an in-process ``datasets.Dataset`` zero-copy over its Arrow table."""
        from zephon_columnar.io.hf import dataset_from_hf

        return dataset_from_hf(name, hf_dataset)

    @classmethod
    def from_tables(
        cls, name: str, tables: Sequence[pa.Table], *, kind: str = "arrow", shard_ids: Sequence[int] | None = None
    ) -> Dataset:
        """A dataset over in-memory Arrow tables, one shard each.

        ``shard_ids[i]`` is the id of ``tables[i]`` (default ``0..n-1``; ints >= 0, no repeats,
        else :class:`ConfigError`); shards are kept sorted by id. Every table must have the same
        columns and types; the same columns in another order are read in the order of the
        first shard (the one with the lowest id).
        """
        tables = list(tables)
        if shard_ids is None:
            ids = list(range(len(tables)))
        else:
            ids = [_check_shard_id(name, i) for i in shard_ids]
            if len(ids) != len(tables):
                raise ConfigError(
                    f"Dataset {name!r}: {len(ids)} shard ids for {len(tables)} tables; pass one id per table."
                )
            dups = sorted(i for i, c in Counter(ids).items() if c > 1)
            if dups:
                raise ConfigError(f"Dataset {name!r}: duplicate shard ids {dups}; give every shard its own id.")
            order = sorted(range(len(ids)), key=ids.__getitem__)
            ids, tables = [ids[j] for j in order], [tables[j] for j in order]
        _check_same_schema(name, [(f"shard {i}", t.schema) for i, t in zip(ids, tables)])
        if tables:
            tables = [in_column_order(t, tables[0].column_names) for t in tables]
        infos = tuple(
            # Stored bytes of an in-memory shard: its content bytes, as Zephon counts them.
            ShardInfo(shard_id=i, path=None, num_rows=t.num_rows, num_bytes=InMemoryShard(t).raw_bytes)
            for i, t in zip(ids, tables)
        )
        return cls(name=name, backend={"kind": kind, "tables": tuple(tables)}, path=None, shards=infos)

    # ---------------------------------------------------------------- metadata
    def ids(self) -> np.ndarray:
        """Shard ids, in the order of ``shards`` (sorted); ``counts()[i]`` is shard ``ids()[i]``'s."""
        return _read_only(np.array([s.shard_id for s in self.shards], dtype=np.int64))

    def shard(self, shard_id: int) -> ShardInfo:
        """The :class:`ShardInfo` of the shard with id ``shard_id`` (an IndexError naming the
        ids otherwise)."""
        return shard_info(self.shards, shard_id, dataset=self.name)

    def counts(self) -> np.ndarray:
        """Rows per shard, in the order of ``ids()`` (read-only)."""
        return _read_only(np.array([s.num_rows for s in self.shards], dtype=np.int64))

    def raw_bytes(self) -> np.ndarray:
        """Stored bytes per shard (file sizes; content bytes in memory), in the order of ``ids()``
        (read-only)."""
        return _read_only(np.array([s.num_bytes for s in self.shards], dtype=np.int64))

    def total(self) -> int:
        return int(sum(s.num_rows for s in self.shards))

    def __len__(self) -> int:
        return self.total()

    def max_count(self) -> int:
        return max((s.num_rows for s in self.shards), default=0)

    def shard_count(self) -> int:
        return len(self.shards)

    def describe(self) -> dict[str, Any]:
        """JSON-friendly identity of the dataset (compared when a checkpoint is restored).

        The location is left out on purpose: the same shards moved to another directory or
        bucket (or reached through another relative path) resume the same data order."""
        return {"name": self.name, "shards": len(self.shards), "rows": self.total()}

    # ---------------------------------------------------------------- reading
    def open_reader(self) -> ShardReader:
        """A fresh reader for this dataset's shards; one per worker."""
        kind = self.backend.get("kind")
        if kind in ("inmem", "arrow", "hf_memory"):
            return TableReader(self.backend["tables"], [s.shard_id for s in self.shards], dataset=self.name)
        from zephon_columnar.io.readers import open_reader

        return open_reader(self)

    def __repr__(self) -> str:
        return (
            f"Dataset(name={self.name!r}, kind={self.backend.get('kind')!r}, path={self.path!r}, "
            f"shards={len(self.shards)}, rows={self.total()})"
        )


def _check_shard_id(name: str, shard_id: Any) -> int:
    """``shard_id`` as an int >= 0; a ConfigError naming it otherwise."""
    try:
        if isinstance(shard_id, (bool, np.bool_)):
            raise TypeError
        value = operator.index(shard_id)
    except TypeError:
        raise ConfigError(
            f"Dataset {name!r}: shard id {shard_id!r} is not an int; key the shards by "
            "int ids >= 0, e.g. {0: InMemoryShard(rows)}."
        ) from None
    if value < 0:
        raise ConfigError(f"Dataset {name!r}: shard id {value} is negative; shard ids are ints >= 0.")
    return value


def same_columns(first: pa.Schema, other: pa.Schema) -> bool:
    """Whether ``other`` has the columns and types of ``first``, in any order (metadata ignored)."""
    if other.equals(first, check_metadata=False):
        return True
    names = first.names
    if len(set(names)) != len(names) or sorted(names) != sorted(other.names):
        return False
    return pa.schema([other.field(n) for n in names]).equals(first, check_metadata=False)


def _check_same_schema(name: str, schemas: Sequence[tuple[str, pa.Schema]]) -> None:
    """Raise if the shards of one dataset disagree on column names or types.

    The same columns in another order are accepted (readers put every shard in the first
    shard's order, see :func:`in_column_order`); the error names each differing column.
    """
    if not schemas:
        return
    first_where, first = schemas[0]
    for where, schema in schemas[1:]:
        if not same_columns(first, schema):
            from zephon_columnar.errors import DatasetFormatError

            raise DatasetFormatError(
                f"Dataset {name!r}: {where} has a schema that differs from {first_where}: "
                f"{_schema_differences(first, schema, first_where)}. Every shard of a dataset must have "
                "the same columns and types (in any order); rewrite the odd shard or split it into its "
                "own dataset."
            )


def _schema_differences(first: pa.Schema, other: pa.Schema, first_where: str) -> str:
    """``"column 'tokens' (list<int32>) is missing; column 'id' is string, not int64"``."""

    def describe(f: pa.Field) -> str:
        return str(f.type) + ("" if f.nullable else " not null")

    ours = {f.name: f for f in first}
    theirs = {f.name: f for f in other}
    parts = []
    for n, f in ours.items():
        if n not in theirs:
            parts.append(f"column {n!r} ({describe(f)}) is missing")
        elif describe(theirs[n]) != describe(f):
            parts.append(f"column {n!r} is {describe(theirs[n])}, not {describe(f)}")
    parts += [f"column {n!r} ({describe(f)}) is not in {first_where}" for n, f in theirs.items() if n not in ours]
    if not parts:  # e.g. a repeated column name: show both schemas whole
        parts.append(f"columns {[(f.name, describe(f)) for f in other]}, not {[(f.name, describe(f)) for f in first]}")
    return "; ".join(parts)
