"""Shaping the tables readers return: rows in the order asked, columns in the dataset's order,
and one schema per dataset.

Every format's reader uses these, so a shard comes back the same way whatever stores it.

Example:
    >>> take_rows(pa.table({"x": [1, 2, 3, 4]}), np.array([1, 2])).column("x").to_pylist()
    [2, 3]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.errors import DatasetFormatError


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

    Example:
        >>> in_column_order(pa.table({"b": [1], "a": [2]}), ["a", "b"]).column_names
        ['a', 'b']
    """
    if table.column_names == list(names):
        return table
    return table.select(list(names))


def same_columns(first: pa.Schema, other: pa.Schema) -> bool:
    """Whether ``other`` has the columns and types of ``first``, in any order (metadata ignored)."""
    if other.equals(first, check_metadata=False):
        return True
    names = first.names
    if len(set(names)) != len(names) or sorted(names) != sorted(other.names):
        return False
    return bool(pa.schema([other.field(n) for n in names]).equals(first, check_metadata=False))


def check_same_schema(name: str, schemas: Sequence[tuple[str, pa.Schema]]) -> None:
    """Raise if the shards of dataset ``name`` disagree on column names or types.

    ``schemas`` pairs where each schema was found (``"shard 1 (part-1.parquet)"``) with it. The
    same columns in another order are accepted (readers put every shard in the first shard's
    order, see :func:`in_column_order`); the error names each differing column.

    Example:
        >>> try:
        ...     check_same_schema("web", [("shard 0", pa.schema([("a", pa.int64())])),
        ...                               ("shard 1", pa.schema([("a", pa.string())]))])
        ... except ValueError as err:
        ...     print(str(err)[:83])
        Dataset 'web': shard 1 has a schema that differs from shard 0: column 'a' is string
    """
    if not schemas:
        return
    first_where, first = schemas[0]
    for where, schema in schemas[1:]:
        if not same_columns(first, schema):
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
