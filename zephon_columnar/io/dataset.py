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

from dataclasses import dataclass
from typing import Any, Iterable, Literal, Mapping, Sequence

import numpy as np
import pyarrow as pa

from zephon_columnar.errors import ConfigError
from zephon_columnar.io.base import ShardInfo, ShardReader

DatasetFormat = Literal["parquet", "jsonl", "hf", "arrow"]


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
            self.table = pa.Table.from_pylist(rows)

    def __len__(self) -> int:
        return self.table.num_rows

    @property
    def raw_bytes(self) -> int:
        return self.table.nbytes

    def getsamples(self, indices: Iterable[int]) -> list[dict[str, Any]]:
        return self.table.take(pa.array(list(indices), pa.int64())).to_pylist()

    def close(self) -> None:
        pass


class TableReader:
    """Reader over in-memory Arrow tables, one per shard (zero-copy slices where possible)."""

    def __init__(self, tables: Sequence[pa.Table]) -> None:
        self._tables = tables

    def take(self, shard_id: int, rows: np.ndarray) -> pa.Table:
        table = self._tables[shard_id]
        return take_rows(table, rows)

    def close(self) -> None:
        pass


def take_rows(table: pa.Table, rows: np.ndarray) -> pa.Table:
    """Rows ``rows`` of ``table`` in order: a zero-copy slice when they are consecutive."""
    n = len(rows)
    if n == 0:
        return table.slice(0, 0)
    start = int(rows[0])
    if int(rows[-1]) - start == n - 1 and (n < 3 or bool(np.all(np.diff(rows) == 1))):
        return table.slice(start, n)
    return table.take(pa.array(rows, pa.int64()))


@dataclass(frozen=True, eq=False)
class Dataset:
    """A named dataset: shards with row counts, plus how to read them.

    ``backend`` is an opaque description of the storage (``{"kind": "parquet", ...}``);
    ``path`` the root it was discovered under (None in memory). Shard ids are ``0..n-1``
    in sorted file-name order.
    """

    name: str
    backend: Mapping[str, Any]
    path: str | None
    shards: tuple[ShardInfo, ...]

    # ---------------------------------------------------------------- constructors
    @classmethod
    def from_path(cls, name: str, path: str, *, fmt: DatasetFormat | None = None) -> "Dataset":
        """Discover a directory (local path or fsspec URL) of Parquet, JSONL (``.jsonl``,
        ``.jsonl.gz``, ``.jsonl.zst``) or Arrow files (a Hugging Face ``save_to_disk`` folder).

        The format is detected from file suffixes unless ``fmt`` is given.

        Example:
            >>> Dataset.from_path("web", "data/web_parquet")  # doctest: +SKIP
        """
        from zephon_columnar.io.discovery import discover

        return discover(name, path, fmt=fmt)

    @classmethod
    def from_dict(cls, name: str, shards: Mapping[int, InMemoryShard]) -> "Dataset":
        """A dataset of in-memory shards, keyed by shard id (ids are renumbered 0..n-1 in
        sorted key order)."""
        if not shards:
            raise ConfigError(f"Dataset {name!r}: from_dict got no shards; pass {{0: InMemoryShard(rows)}}.")
        keys = sorted(shards)
        tables = []
        for k in keys:
            shard = shards[k]
            if not isinstance(shard, InMemoryShard):
                shard = InMemoryShard(shard)
            tables.append(shard.table)
        return cls.from_tables(name, tables, kind="inmem")

    @classmethod
    def from_hf(cls, name: str, hf_dataset: Any) -> "Dataset":
        """Wrap an in-process ``datasets.Dataset`` zero-copy over its Arrow table."""
        from zephon_columnar.io.hf import dataset_from_hf

        return dataset_from_hf(name, hf_dataset)

    @classmethod
    def from_tables(cls, name: str, tables: Sequence[pa.Table], *, kind: str = "arrow") -> "Dataset":
        """A dataset over in-memory Arrow tables, one shard each."""
        _check_same_schema(name, [(f"shard {i}", t.schema) for i, t in enumerate(tables)])
        infos = tuple(
            ShardInfo(shard_id=i, path=None, num_rows=t.num_rows, num_bytes=t.nbytes)
            for i, t in enumerate(tables)
        )
        return cls(name=name, backend={"kind": kind, "tables": tuple(tables)}, path=None, shards=infos)

    # ---------------------------------------------------------------- metadata
    def ids(self) -> np.ndarray:
        return np.array([s.shard_id for s in self.shards], dtype=np.int64)

    def counts(self) -> np.ndarray:
        return np.array([s.num_rows for s in self.shards], dtype=np.int64)

    def raw_bytes(self) -> np.ndarray:
        return np.array([s.num_bytes for s in self.shards], dtype=np.int64)

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
            return TableReader(self.backend["tables"])
        from zephon_columnar.io.readers import open_reader

        return open_reader(self)

    def __repr__(self) -> str:
        return (f"Dataset(name={self.name!r}, kind={self.backend.get('kind')!r}, path={self.path!r}, "
                f"shards={len(self.shards)}, rows={self.total()})")


def _check_same_schema(name: str, schemas: Sequence[tuple[str, pa.Schema]]) -> None:
    """Raise if the shards of one dataset disagree on column names or types."""
    if not schemas:
        return
    first_where, first = schemas[0]
    for where, schema in schemas[1:]:
        if not schema.equals(first, check_metadata=False):
            ours = {f.name: str(f.type) for f in first}
            theirs = {f.name: str(f.type) for f in schema}
            diff = sorted(set(ours.items()) ^ set(theirs.items()))
            from zephon_columnar.errors import DatasetFormatError

            raise DatasetFormatError(
                f"Dataset {name!r}: {where} has a schema that differs from {first_where}: "
                f"differing (column, type) pairs {diff}. Every shard of a dataset must have the "
                "same columns and types; rewrite the odd shard or split it into its own dataset."
            )
