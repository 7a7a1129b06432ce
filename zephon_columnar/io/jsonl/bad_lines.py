"""Naming a bad line: the slow paths that run after a batch of lines failed to parse or validate.

Contract: each function looks at the lines of a failed batch one by one and raises a
DatasetFormatError ``"{path}:{line}: ..."`` for the first bad one (not one JSON object, not
UTF-8, or not fitting the dataset's schema), with the physical line number from the file's
:class:`~zephon_columnar.io.jsonl.index.LineIndex`. The fast paths (one pyarrow call per batch)
stay with their callers: discovery's sample check (`plugin`) and the reader (`reader`).
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson

from zephon_columnar.errors import DatasetFormatError
from zephon_columnar.io.jsonl.index import LineIndex
from zephon_columnar.io.jsonl.lines import _json_kind, _not_json, _object_lines, _parse_options

_FIX_OR_SKIP = (
    "Fix or remove the line, or pass on_bad_record='skip' to Dataset.from_path to leave such lines out "
    "(counted and warned)."
)


def _check_objects(
    url: str, index: LineIndex, buf: bytes | memoryview, starts: np.ndarray, ends: np.ndarray, rows: np.ndarray
) -> None:
    """Raise unless every row's line starts with ``{`` (after optional whitespace).

    Besides giving a clear error, this guards pyarrow: ``read_json`` crashes the process on a
    buffer that starts with ``null`` and turns a ``null`` line elsewhere into an all-null row.
    """
    for i in np.flatnonzero(~_object_lines(buf, starts, ends)).tolist():
        _raise_bad_line(url, index, buf, starts[i : i + 1], ends[i : i + 1], rows[i : i + 1], None)


def _raise_bad_line(
    url: str,
    index: LineIndex,
    buf: bytes | memoryview,
    starts: np.ndarray,
    ends: np.ndarray,
    rows: np.ndarray,
    schema: pa.Schema | None,
) -> None:
    """Find the first bad row among ``rows`` (their bytes are ``buf[starts:ends]``) and raise.

    Slow path, only after a batch failed: each line goes through ``json.loads`` (and, with a
    ``schema``, through pyarrow alone) to name the line and the reason. Returns if none fails.
    """
    for s, e, r in zip(starts.tolist(), ends.tolist(), rows.tolist()):
        line = bytes(buf[s:e]).strip()
        where = f"{url}:{index.line_no(r)}"
        try:
            value = json.loads(line)
        except ValueError as err:  # not JSON, or not UTF-8
            raise DatasetFormatError(f"{where}: {_not_json(err)}. {_FIX_OR_SKIP}") from err
        if not isinstance(value, dict):
            raise DatasetFormatError(
                f"{where}: is a JSON {_json_kind(value)}, not an object; every line must be one "
                f'object like {{"text": ...}}. {_FIX_OR_SKIP}'
            )
        if schema is not None:
            try:
                pajson.read_json(pa.BufferReader(line + b"\n"), parse_options=_parse_options(schema))
            except pa.ArrowInvalid as err:
                raise DatasetFormatError(
                    f"{where}: does not match the dataset's schema ({err}). The schema {schema} was "
                    "inferred from every line of the dataset's files when it was discovered; fix or "
                    "remove the line (or, if the file changed, rediscover it with Dataset.from_path)."
                ) from err


def _check_utf8(
    url: str,
    index: LineIndex,
    buf: bytes | memoryview,
    starts: np.ndarray,
    ends: np.ndarray,
    rows: np.ndarray,
    table: pa.Table,
) -> None:
    """Raise DatasetFormatError naming the first bad line unless every string in ``table``
    (parsed from ``rows``, one table row per row, bytes ``buf[starts:ends]``) is valid UTF-8.

    pyarrow's JSON parser copies string bytes as they are, so a file in another encoding would
    give ``string`` columns that fail far from the file (a UnicodeDecodeError in ``to_pylist``).
    Fast path: one ``Table.validate(full=True)`` per batch (~0.2 ms per MB of strings on one core,
    against ~2 ms per MB to parse).
    Slow path, only after it failed: the lines whose bytes do not decode are checked one by one
    (invalid bytes in a field outside the schema are harmless: pyarrow skips that field).
    """
    try:
        table.validate(full=True)
        return
    except pa.ArrowInvalid as err:
        invalid = err
    for i, (s, e, r) in enumerate(zip(starts.tolist(), ends.tolist(), rows.tolist())):
        line = bytes(buf[s:e])
        try:
            line.decode("utf-8")
            continue
        except UnicodeDecodeError as err:
            bad = err
        one = table.take(pa.array([i], pa.int64()))  # a copy of this row only: validates just it
        fields = [n for n, col in zip(one.column_names, one.columns) if not _valid(col)]
        if fields:
            raise DatasetFormatError(
                f"{url}:{index.line_no(r)}: field {fields[0]!r} is not valid UTF-8 (byte 0x{line[bad.start]:02x} "
                f"at byte {bad.start + 1} of the line). JSON Lines files must be UTF-8: re-encode the file "
                f"(e.g. iconv -f latin1 -t utf-8). {_FIX_OR_SKIP}"
            ) from bad
    raise DatasetFormatError(
        f"{url}: lines {index.line_no(int(rows[0]))}-{index.line_no(int(rows[-1]))} parse into invalid "
        f"values ({invalid}). Check that the file is UTF-8 JSON Lines."
    ) from invalid


def _valid(column: pa.ChunkedArray) -> bool:
    try:
        column.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True
