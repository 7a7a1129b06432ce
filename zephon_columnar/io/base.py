"""The contract between datasets and the engine: shard metadata and shard readers.

A :class:`ShardReader` turns ``(shard_id, row indices)`` into an Arrow table of the payload
columns, rows in the order asked. Readers are opened per worker (they may hold open files and a
small cache of decoded row groups) and are never shared between threads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
import pyarrow as pa

#: What reading does with a record it cannot read (``Dataset.from_path(on_bad_record=...)``):
#: ``"raise"`` an error naming the file and line, or ``"skip"`` it (counted and warned).
BadRecordPolicy = Literal["raise", "skip"]


#: How many skipped records' locations an index keeps and a message shows (the first ones).
SHOWN_SKIPPED = 5


@dataclass(frozen=True, kw_only=True)
class SkippedRecords:
    """The records a dataset's discovery left out under ``on_bad_record="skip"``: how many,
    and where and why for the first few (``"path:line: why"``).

    Example:
        >>> SkippedRecords(count=0).message("web")
        ''
        >>> SkippedRecords(count=2, first=("a.jsonl:3: not valid JSON",)).message("web")[:60]
        "Dataset 'web' left out 2 bad records (on_bad_record='skip'):"
    """

    count: int
    first: tuple[str, ...] = ()

    def message(self, dataset: str) -> str:
        """What a warning says of them ('' when there are none)."""
        if not self.count:
            return ""
        more = f"; and {self.count - len(self.first)} more" if self.count > len(self.first) else ""
        return (
            f"Dataset {dataset!r} left out {self.count} bad records (on_bad_record='skip'): {'; '.join(self.first)}"
            f"{more}. They are not rows of the dataset: every pass reads without them. Fix or remove those lines "
            "to read them, or pass on_bad_record='raise' to stop at the first."
        )


@dataclass(frozen=True, kw_only=True)
class ShardInfo:
    """One shard of a dataset: where it is and how many rows it holds.

    ``path`` is a local path or an fsspec URL (None for in-memory shards); ``extra`` holds
    format-specific metadata found at discovery (e.g. Parquet row-group row counts).
    """

    shard_id: int
    path: str | None
    num_rows: int
    num_bytes: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)

    def file_path(self) -> str:
        """``path`` of a shard that is a file (every format but in-memory data).

        Example:
            >>> ShardInfo(shard_id=0, path="data/part-0.parquet", num_rows=10).file_path()
            'data/part-0.parquet'
        """
        if self.path is None:
            raise RuntimeError(f"shard {self.shard_id} is held in memory; it has no file to read.")
        return self.path


class ShardReader(Protocol):
    """Reads rows of one dataset's shards. Not thread-safe: one reader per worker."""

    def take(self, shard_id: int, rows: np.ndarray) -> pa.Table:
        """Return the payload rows ``rows`` (int64 indices into the shard) in that order."""
        ...

    def close(self) -> None:
        """Release open files and caches."""
        ...


def check_columns(name: str, schema: pa.Schema, columns: Sequence[str] | None) -> list[str] | None:
    """Validate a reader's column projection against the dataset schema (None = all columns).

    Example:
        >>> check_columns("web", pa.schema([("text", pa.string())]), ["text"])
        ['text']
    """
    if columns is None:
        return None
    columns = list(columns)
    unknown = [c for c in columns if c not in schema.names]
    if unknown:
        from zephon_columnar.errors import ConfigError

        raise ConfigError(
            f"Dataset {name!r} has no column(s) {unknown}; its columns are {schema.names}. "
            "Pass columns from that list, or None for all."
        )
    return columns


def project(schema: pa.Schema, columns: Sequence[str] | None) -> pa.Schema:
    """``schema`` restricted to ``columns`` (in that order); the whole schema for None."""
    return schema if columns is None else pa.schema([schema.field(c) for c in columns])


def shard_info(shards: Sequence[ShardInfo], shard_id: int, *, dataset: str | None = None) -> ShardInfo:
    """The shard whose id is ``shard_id`` (by id, never by position); an IndexError naming the
    ids that exist otherwise.

    Discovered datasets number their shards ``0..n-1`` in order, so the shard at position
    ``shard_id`` is tried first (O(1)); other ids (in-memory datasets keep the ids they were
    given) are searched for. ``dataset`` (a name) goes into the error message.

    Example:
        >>> shard_info([ShardInfo(shard_id=0, path="a.parquet", num_rows=3)], 0).path
        'a.parquet'
        >>> shard_info([ShardInfo(shard_id=2, path="a", num_rows=1),
        ...             ShardInfo(shard_id=5, path="b", num_rows=1)], 5).path
        'b'
    """
    if 0 <= shard_id < len(shards) and shards[shard_id].shard_id == shard_id:
        return shards[shard_id]
    for info in shards:
        if info.shard_id == shard_id:
            return info
    who = "this dataset" if dataset is None else f"dataset {dataset!r}"
    raise IndexError(
        f"shard {shard_id} does not exist; {who} has {len(shards)} shards with ids "
        f"{describe_ids([s.shard_id for s in shards])}. Pass one of those ids."
    )


def describe_ids(ids: Sequence[int], shown: int = 8) -> str:
    """Shard ids for an error message: ``[2, 5]``, ``0..99`` for a contiguous run, or the first
    ``shown`` ids and a count.

    Example:
        >>> describe_ids([2, 5]), describe_ids(list(range(100))), describe_ids(list(range(0, 40, 2)))
        ('[2, 5]', '0..99', '[0, 2, 4, 6, 8, 10, 12, 14, ... 12 more]')
    """
    ids = [int(i) for i in ids]
    if len(ids) > 2 and ids == list(range(ids[0], ids[0] + len(ids))):
        return f"{ids[0]}..{ids[-1]}"
    if len(ids) > shown:
        return "[" + ", ".join(map(str, ids[:shown])) + f", ... {len(ids) - shown} more]"
    return str(ids)
