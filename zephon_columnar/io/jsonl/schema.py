"""The schema of every line: Arrow types widened line by line, file by file.

Contract: types widen as Arrow's JSON reader widens them within a file (null and any type give
that type, ints and floats give ``double``, objects merge their fields, arrays their items); two
types that do not widen raise `_TypeConflict` (internal; callers turn it into a
DatasetFormatError naming the line and field). Strings that look like timestamps stay strings.
`_SchemaSoFar` widens one file's schema block by block as its lines are counted; lines pyarrow
cannot parse are left out of it and recorded as bad rows (the reader reports them).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson

from zephon_columnar.errors import DatasetFormatError
from zephon_columnar.io.base import SHOWN_SKIPPED
from zephon_columnar.io.jsonl.lines import _PYARROW_REFUSED, _json_kind, _not_json, _object_lines, _reject_constant

_ONE_TYPE_PER_FIELD = (
    "A field must have one JSON type on every line of every file of a dataset (null is allowed "
    "anywhere, ints and floats mix and are read as floats, objects may have different keys). Give "
    "the field one type (e.g. always a string), or fix or remove the line."
)


class _TypeConflict(Exception):
    """Two types of the field ``path`` that do not widen into one (internal: the caller turns it
    into a DatasetFormatError naming the line)."""

    def __init__(self, path: str, old: pa.DataType, new: pa.DataType) -> None:
        super().__init__(path, old, new)
        self.path, self.old, self.new = path, old, new


def _timestamps_as_strings(t: pa.DataType) -> pa.DataType:
    """pyarrow infers timestamps from date-like strings; keep them strings, as in the JSON."""
    if pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_time(t):
        return pa.string()
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(_timestamps_as_strings(t.field(i).type)) for i in range(t.num_fields)])
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_timestamps_as_strings(t.value_type)))
    return t


def _merge_types(old: pa.DataType, new: pa.DataType, path: str) -> pa.DataType:
    """The type that holds the values of both ``old`` and ``new``, widened as pyarrow's JSON
    reader widens within a file: null gives way to any type, ints to floats, objects merge their
    fields (new ones last), arrays their items. Raises :class:`_TypeConflict` otherwise.

    Example:
        >>> _merge_types(pa.int64(), pa.float64(), "score")
        DataType(double)
        >>> _merge_types(pa.struct([("a", pa.int64())]), pa.struct([("b", pa.null())]), "meta")
        StructType(struct<a: int64, b: null>)
        >>> try:
        ...     _merge_types(pa.int64(), pa.string(), "id")
        ... except _TypeConflict as conflict:
        ...     print(conflict.path, conflict.old, conflict.new)
        id int64 string
    """
    if old == new:
        return old
    if pa.types.is_null(old):
        return new
    if pa.types.is_null(new):
        return old
    if _is_number(old) and _is_number(new):
        return pa.float64()
    if pa.types.is_struct(old) and pa.types.is_struct(new):
        return pa.struct(_merge_fields(_fields(old), _fields(new), path + "."))
    if pa.types.is_list(old) and pa.types.is_list(new):
        return pa.list_(old.value_field.with_type(_merge_types(old.value_type, new.value_type, path + "[]")))
    raise _TypeConflict(path, old, new)


def _merge_schemas(old: pa.Schema, new: pa.Schema) -> pa.Schema:
    """``old`` widened by ``new`` (see :func:`_merge_types`); fields first seen in ``new`` last."""
    return pa.schema(_merge_fields(list(old), list(new), ""))


def _merge_fields(old: list[pa.Field], new: list[pa.Field], prefix: str) -> list[pa.Field]:
    new_by_name = {f.name: f for f in new}
    merged = [
        f.with_type(_merge_types(f.type, new_by_name[f.name].type, prefix + f.name)) if f.name in new_by_name else f
        for f in old
    ]
    old_names = {f.name for f in old}
    return merged + [f for f in new if f.name not in old_names]


def _fields(struct: pa.StructType) -> list[pa.Field]:
    return [struct.field(i) for i in range(struct.num_fields)]


def _is_number(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t))


class _SchemaSoFar:
    """The schema of the rows of one file, widened block by block while :func:`_scan_lines`
    counts its lines.

    Fast path: each block's complete lines go through one ``pyarrow.json.read_json`` (type
    inference, no explicit schema), whose schema is merged into the file's so far. Slow path,
    only when that fails (a line that is not one JSON object, or a field that changes type):
    ``json.loads`` line by line finds the first line whose field conflicts and raises
    DatasetFormatError naming it; lines that do not parse are left out of the schema (the
    reader reports them, with their line numbers, when their rows are read).
    """

    def __init__(self, url: str, seed: pa.Schema | None) -> None:
        self.url = url
        self.schema = pa.schema([])  # of this file's rows
        self._seed = seed if seed is not None else pa.schema([])  # types of the files before it
        self.bad_rows: list[int] = []  # rows left out of the schema, increasing
        self.bad_reasons: list[str] = []  # "line N: why", for the first SHOWN_SKIPPED of them

    def widen(
        self,
        buf: bytes | memoryview,
        starts: np.ndarray,
        ends: np.ndarray,
        rows: np.ndarray,
        line_numbers: Callable[[np.ndarray], np.ndarray],
    ) -> None:
        """Widen by ``rows``, consecutive rows whose bytes are ``buf[starts:ends]`` (each range
        ends with a newline); ``line_numbers(rows)`` gives their physical line numbers."""
        found = None
        if _object_lines(buf, starts, ends).all():  # pyarrow crashes on a leading `null` line
            found = _parsed_schema(
                memoryview(buf)[int(starts[0]) : int(ends[-1])], int((ends - starts).max()), len(rows)
            )
        if found is not None:
            try:
                self._merge(found)
                return
            except _TypeConflict:
                pass  # find the line below
        # Slow path (rare): a line pyarrow cannot parse, or a field that changes type.
        lines_of_rows = line_numbers(rows)
        bad: dict[int, str] = {}  # index into rows -> why its line is left out
        good = self._check_lines(buf, starts, ends, lines_of_rows, bad)
        kept = np.flatnonzero(good)
        try:
            lines = [bytes(buf[s:e]) for s, e in zip(starts[kept].tolist(), ends[kept].tolist())]
            found = _parsed_schema(b"".join(lines), max(map(len, lines)), len(lines)) if lines else None
            if found is not None:
                self._merge(found)
            else:
                # Lines Python's json accepts but pyarrow does not: leave those out too, one by one.
                for i, line in zip(kept.tolist(), lines):
                    found = _parsed_schema(line, len(line), 1)
                    if found is None:
                        bad[i] = _PYARROW_REFUSED
                    else:
                        self._merge(found)
        except _TypeConflict as conflict:  # pyarrow and the line-by-line check disagreed
            raise DatasetFormatError(
                f"{self.url}: lines {lines_of_rows[0]}-{lines_of_rows[-1]}: field "
                f"{conflict.path!r} is {conflict.new} there but {conflict.old} before. {_ONE_TYPE_PER_FIELD}"
            ) from None
        for i in sorted(bad):
            self.bad_rows.append(int(rows[i]))
            if len(self.bad_reasons) < SHOWN_SKIPPED:
                self.bad_reasons.append(f"line {lines_of_rows[i]}: {bad[i]}")

    def _merge(self, found: pa.Schema) -> None:
        schema = _merge_schemas(self.schema, found)
        _merge_schemas(self._seed, schema)  # raises if it conflicts with the files before it
        self.schema = schema

    def _check_lines(
        self,
        buf: bytes | memoryview,
        starts: np.ndarray,
        ends: np.ndarray,
        line_numbers: np.ndarray,
        bad: dict[int, str],
    ) -> np.ndarray:
        """Mask of the lines ``buf[starts:ends]`` (physical ``line_numbers``) that parse to one
        JSON object (``bad[i]`` says why line ``i`` does not); raise DatasetFormatError naming the
        first line whose field has another JSON type than on an earlier line (or in the files
        before it)."""
        kinds: dict[str, tuple[str, str]] = {}  # field path -> (JSON type, where it was seen)
        for f in self.schema:
            _seed_kinds(f.type, f.name, "on an earlier line", kinds)
        for f in self._seed:
            if f.name not in kinds:
                _seed_kinds(f.type, f.name, "in the dataset's files before this one", kinds)
        good = np.zeros(len(starts), dtype=bool)
        for i, (s, e, line) in enumerate(zip(starts.tolist(), ends.tolist(), line_numbers.tolist())):
            try:
                value = json.loads(bytes(buf[s:e]), parse_constant=_reject_constant)
            except ValueError as err:  # not JSON, not UTF-8, or NaN/Infinity: the reader reports it
                bad[i] = _not_json(err)
                continue
            if isinstance(value, dict):
                for name, field_value in value.items():
                    _check_kind(self.url, line, name, field_value, kinds)
                good[i] = True
            else:
                bad[i] = f"a JSON {_json_kind(value)}, not an object"
        return good


def _parsed_schema(buf: bytes | memoryview, longest_line: int, num_lines: int) -> pa.Schema | None:
    """The schema pyarrow infers for the ``num_lines`` JSON objects in ``buf`` (timestamps kept
    as strings), or None if it cannot parse them into that many rows of valid values (pyarrow
    copies the bytes of strings as they are: a string that is not UTF-8 fails the validation,
    ~0.2 ms per MB of strings against ~2 ms per MB to parse)."""
    block = max(1 << 20, longest_line + 1)
    options = pajson.ReadOptions(use_threads=len(buf) > 4 * block, block_size=block)
    try:
        table = pajson.read_json(pa.BufferReader(buf), read_options=options)
        table.validate(full=True)
    except pa.ArrowInvalid:
        return None
    if table.num_rows != num_lines:  # two values on one line parse as two rows
        return None
    return pa.schema([f.with_type(_timestamps_as_strings(f.type)) for f in table.schema])


def _kind_of_type(t: pa.DataType) -> str | None:
    """The JSON type of the values of ``t`` (None for ``null``: it agrees with any)."""
    if _is_number(t):
        return "number"
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_struct(t):
        return "object"
    if pa.types.is_list(t):
        return "array"
    return None


def _seed_kinds(t: pa.DataType, path: str, where: str, kinds: dict[str, tuple[str, str]]) -> None:
    """Record the JSON type of field ``path`` (of Arrow type ``t``) and of its nested fields."""
    kind = _kind_of_type(t)
    if kind is None:
        return
    kinds[path] = (kind, where)
    if kind == "object":
        for f in _fields(t):
            _seed_kinds(f.type, f"{path}.{f.name}", where, kinds)
    elif kind == "array":
        _seed_kinds(t.value_type, path + "[]", where, kinds)


def _check_kind(url: str, line: int, path: str, value: Any, kinds: dict[str, tuple[str, str]]) -> None:
    """Raise DatasetFormatError if ``value`` (field ``path`` on ``line``) has another JSON type
    than the field had before; else record it (nested fields too)."""
    kind = _json_kind(value)
    if kind == "null":
        return
    seen = kinds.setdefault(path, (kind, f"on line {line}"))
    if seen[0] != kind:
        raise DatasetFormatError(
            f"{url}:{line}: field {path!r} is {_with_article(kind)} here but {_with_article(seen[0])} "
            f"{seen[1]}. {_ONE_TYPE_PER_FIELD}"
        )
    if kind == "object":
        for name, field_value in value.items():
            _check_kind(url, line, f"{path}.{name}", field_value, kinds)
    elif kind == "array":
        for item in value:
            _check_kind(url, line, path + "[]", item, kinds)


def _with_article(kind: str) -> str:
    return ("an " if kind[0] in "aeiou" else "a ") + kind
