"""Rows by reference, as a checkpoint writes them: their bookkeeping columns, as compact JSON.

References are small tables of known columns (`frame.BOOKKEEPING`, lineage, a packed row's
segments, a carried piece's token offset) plus the per-row state columns a stage adds
(`with_state`: names starting with ``__s_``, int64, or ``__sf_``, float64). A table of up to
`JSON_ROWS` rows is written as plain JSON columns (a few numbers a row); a larger one (a full
shuffle buffer) as zstd-compressed Arrow IPC in base64, its integer columns first sorted by
(chunk, offset) and delta-encoded in the smallest integer type (with the order kept to undo
the sort): a full buffer of 8192 rows takes a few bytes a row.

Example:
    >>> import pyarrow as pa
    >>> t = pa.table({"__chunk": pa.array([3, 3], pa.int64()), "__s_start": pa.array([0, 7], pa.int64())})
    >>> text = rows_to_json(t)
    >>> text
    {'n': 2, 'cols': {'__chunk': [3, 3], '__s_start': [0, 7]}}
    >>> rows_from_json(text).equals(t)
    True
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from zephon_columnar import frame as F

_DELTA = "d1:"  # prefix of the sorted, delta-encoded form of a large table

JSON_ROWS = 64
STATE_PREFIX = "__s_"
FLOAT_STATE_PREFIX = "__sf_"

_TYPES: dict[str, pa.DataType] = {
    **{f.name: f.type for f in F.BOOKKEEPING_SCHEMA},
    F.LINEAGE: pa.list_(pa.int32()),
    F.PADDING_LENGTH: pa.int32(),
    F.TOKEN_SKIP: pa.int64(),
    F.SEGMENTS: pa.list_(F.SEGMENT_STRUCT),
}
_SEGMENT_NAMES = [f.name for f in F.SEGMENT_STRUCT]


def _delta_ok(table: pa.Table) -> bool:
    return (
        F.CHUNK in table.column_names
        and F.OFFSET in table.column_names
        and all(pa.types.is_integer(f.type) and table.column(f.name).null_count == 0 for f in table.schema)
    )


def _smallest(values: np.ndarray) -> np.ndarray:
    for dtype in (np.int8, np.int16, np.int32):
        info = np.iinfo(dtype)
        if not len(values) or (values.min() >= info.min and values.max() <= info.max):
            return values.astype(dtype)
    return values


def _delta_text(table: pa.Table) -> str:
    order = np.lexsort((table.column(F.OFFSET).to_numpy(), table.column(F.CHUNK).to_numpy()))
    columns = {"__order": pa.array(_smallest(order.astype(np.int64)))}
    for name in table.column_names:
        v = table.column(name).to_numpy().astype(np.int64)[order]
        columns[name] = pa.array(_smallest(np.diff(v, prepend=np.int64(0))))
    return _DELTA + F.frame_to_text(pa.table(columns))


def _from_delta_text(text: str) -> pa.Table:
    packed = F.frame_from_text(text[len(_DELTA) :])
    order = packed.column("__order").to_numpy().astype(np.int64)
    inverse = np.empty(len(order), np.int64)
    inverse[order] = np.arange(len(order))
    arrays, names = [], []
    for name in packed.column_names[1:]:
        t = _type_of(name)
        if t is None:
            raise ValueError(f"column {name!r} is not a reference column")
        values = np.cumsum(packed.column(name).to_numpy().astype(np.int64))[inverse]
        arrays.append(pa.array(values).cast(t))
        names.append(name)
    return pa.Table.from_arrays(arrays, names=names)


def _type_of(name: str) -> pa.DataType | None:
    if name in _TYPES:
        return _TYPES[name]
    if name.startswith(FLOAT_STATE_PREFIX):
        return pa.float64()
    return pa.int64() if name.startswith(STATE_PREFIX) else None


def with_state(refs: pa.Table, **columns: Any) -> pa.Table:
    """``refs`` with per-row state columns ``__s_<name>`` (ints) / ``__sf_<name>`` (floats,
    for names given as ``f_<name>``)."""
    for name, values in columns.items():
        if name.startswith("f_"):
            refs = refs.append_column(FLOAT_STATE_PREFIX + name[2:], pa.array(values, pa.float64()))
        else:
            refs = refs.append_column(STATE_PREFIX + name, pa.array(values, pa.int64()))
    return refs


def concat_refs(tables: list[pa.Table]) -> pa.Table:
    """Reference tables one after another, as the one table a stage's checkpoint holds. A per-row
    state column (`with_state`) that some of them lack is 0 in their rows, never null: each
    table's state is read back only for its own rows (the stage slices them apart again by row
    counts), and a checkpoint refuses a null as damage.

    Example:
        >>> held = with_state(pa.table({"__chunk": pa.array([3], pa.int64())}), skip=[5])
        >>> window = pa.table({"__chunk": pa.array([4, 4], pa.int64())})
        >>> concat_refs([held, window]).to_pydict()
        {'__chunk': [3, 4, 4], '__s_skip': [5, 0, 0]}
    """
    names = list(dict.fromkeys(n for t in tables for n in t.column_names))
    filled = []
    for t in tables:
        for name in names:
            if name not in t.column_names and name.startswith((STATE_PREFIX, FLOAT_STATE_PREFIX)):
                dtype = np.float64 if name.startswith(FLOAT_STATE_PREFIX) else np.int64
                t = t.append_column(name, pa.array(np.zeros(t.num_rows, dtype)))
        filled.append(t.select([n for n in names if n in t.column_names]))
    return F.concat_frames(filled).combine_chunks()


def state_column(refs: pa.Table, name: str) -> list[Any]:
    """A per-row state column `with_state` added (``f_<name>`` for floats)."""
    column = FLOAT_STATE_PREFIX + name[2:] if name.startswith("f_") else STATE_PREFIX + name
    values: list[Any] = refs.column(column).to_pylist()
    return values


def schema_to_json(schema: pa.Schema | None) -> Any:
    """A payload schema: ``[[name, type]]`` when every field is a list of numbers (packed rows),
    else the compressed Arrow form."""
    if schema is None:
        return None
    if all(
        pa.types.is_list(f.type)
        and (
            pa.types.is_integer(f.type.value_type)
            or pa.types.is_floating(f.type.value_type)
            or pa.types.is_boolean(f.type.value_type)
        )
        for f in schema
    ):  # list<...> only
        return [[f.name, str(f.type.value_type)] for f in schema]
    return F.frame_to_text(schema.empty_table())


def schema_from_json(value: Any) -> pa.Schema | None:
    if value is None:
        return None
    if isinstance(value, str):
        return _from_delta_text(value) if value.startswith(_DELTA) else F.frame_from_text(value).schema
    aliases = {"bool": "bool", "float": "float32", "double": "float64", "halffloat": "float16"}
    return pa.schema([(name, pa.list_(pa.type_for_alias(aliases.get(t, t)))) for name, t in value])


def rows_to_json(table: pa.Table | None) -> Any:
    """A reference table as JSON (None stays None)."""
    if table is None:
        return None
    known = all(_type_of(f.name) is not None and f.type.equals(_type_of(f.name)) for f in table.schema)
    if not known:
        return F.frame_to_text(table)
    if table.num_rows > JSON_ROWS:
        return _delta_text(table) if _delta_ok(table) else F.frame_to_text(table)
    cols: dict[str, Any] = {}
    for name in table.column_names:
        values = table.column(name).to_pylist()
        if name == F.SEGMENTS:
            values = [[[seg[k] for k in _SEGMENT_NAMES] for seg in row] for row in values]
        cols[name] = values
    return {"n": table.num_rows, "cols": cols}


def rows_from_json(value: Any) -> pa.Table | None:
    """Inverse of `rows_to_json`; ValueError / TypeError when ``value`` is not such a table."""
    if value is None:
        return None
    if isinstance(value, str):
        return _from_delta_text(value) if value.startswith(_DELTA) else F.frame_from_text(value)
    if not isinstance(value, dict) or not isinstance(value.get("cols"), dict) or not isinstance(value.get("n"), int):
        raise ValueError(f"not an encoded table: {str(value)[:80]}")  # noqa: TRY004 - a malformed value, as below
    arrays, names = [], []
    for name, values in value["cols"].items():
        t = _type_of(name)
        if t is None or not isinstance(values, list) or len(values) != value["n"]:
            raise ValueError(f"column {name!r} is not a reference column of {value['n']} rows")
        if name == F.SEGMENTS:
            values = [[dict(zip(_SEGMENT_NAMES, seg)) for seg in row] for row in values]
        arrays.append(pa.array(values, t))
        names.append(name)
    return pa.Table.from_arrays(arrays, names=names) if arrays else pa.table({})
