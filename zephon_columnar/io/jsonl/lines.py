"""One JSON Lines line as bytes: blank and object lines, a final newline, and how a line that is
not one JSON object is worded.

Pure functions of bytes and values (no file, no index): the scan (`index`), the schema
inference (`schema`) and the reader's error paths (`bad_lines`) share them, so a line is blank,
an object, or refused the same way wherever it is looked at.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson

_WHITESPACE = b" \t\r"  # with "\n": JSON's insignificant whitespace
_LBRACE = ord("{")


def _blank_lines(buf: bytes, arr: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Mask of blank lines (empty, or only spaces/tabs/CR) among lines ``[starts, starts+lengths)``."""
    blank = np.asarray(lengths == 0, dtype=np.bool_)
    nonempty = np.flatnonzero(~blank)
    first = arr[starts[nonempty]]
    # Only a line that starts with whitespace can be blank; that is rare, so check those in Python.
    maybe = nonempty[(first == 32) | (first == 9) | (first == 13)]
    for i in maybe.tolist():
        s = int(starts[i])
        if not buf[s : s + int(lengths[i])].strip(_WHITESPACE):
            blank[i] = True
    return blank


def _terminated(buf: bytes | memoryview) -> bytes | memoryview:
    """``buf`` with a final newline (the last line of a file may lack one)."""
    if len(buf) and buf[-1] != 10:
        return bytes(buf) + b"\n"
    return buf


def _object_lines(buf: bytes | memoryview, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Mask of the lines ``buf[starts:ends]`` that start with ``{`` (after optional whitespace)."""
    is_object = np.ones(len(starts), dtype=bool)
    if len(starts) == 0:
        return is_object
    arr = np.frombuffer(buf, dtype=np.uint8)
    for i in np.flatnonzero(arr[starts] != _LBRACE).tolist():  # rare: check those in Python
        is_object[i] = bytes(buf[int(starts[i]) : int(ends[i])]).lstrip(_WHITESPACE).startswith(b"{")
    return is_object


_PYARROW_REFUSED = "pyarrow cannot parse it (a number out of range, or a string that is not UTF-8?)"


def _not_json(err: ValueError) -> str:
    """Why ``json.loads`` refused a line, as a message says it."""
    if isinstance(err, json.JSONDecodeError):
        return f"not valid JSON ({err.msg}: column {err.colno})"
    if isinstance(err, UnicodeDecodeError):
        return (
            f"not UTF-8 (byte 0x{err.object[err.start]:02x} at byte {err.start + 1} of the line; JSON Lines files "
            "must be UTF-8: re-encode the file, e.g. iconv -f latin1 -t utf-8)"
        )
    return f"not valid JSON ({err})"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # pyarrow rejects NaN and Infinity


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}.get(
        type(value), "value"
    )


def _parse_options(schema: pa.Schema) -> pajson.ParseOptions:
    return pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore", newlines_in_values=False)
