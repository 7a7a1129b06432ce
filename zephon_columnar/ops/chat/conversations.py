"""The conversation column of a frame, checked and flattened (`Conversations`), and how an
error names a row (`describe_row`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from zephon_columnar import frame as F
from zephon_columnar.errors import DatasetFormatError, MissingFieldError, WrongTypeError
from zephon_columnar.ops.rows import sample_of


class Conversations:
    """The conversation column, checked and flattened: per-row message offsets and, per message,
    its role flags and its content (an Arrow string array)."""

    def __init__(
        self, column: pa.Array, offsets: np.ndarray, contents: pa.Array, is_assistant: np.ndarray, is_user: np.ndarray
    ) -> None:
        self.column = column
        self.offsets = offsets
        self.contents = contents
        self.is_assistant = is_assistant
        self.is_user = is_user

    @classmethod
    def of(cls, frame: pa.Table, field: str) -> Conversations:
        n = frame.num_rows
        if field not in frame.column_names:
            if n == 0:
                empty = np.zeros(0, bool)
                return cls(
                    pa.array([], pa.list_(pa.struct([]))),
                    np.zeros(1, np.int64),
                    pa.array([], pa.string()),
                    empty,
                    empty,
                )
            raise MissingFieldError(
                f"tokenize_chat: field {field!r} is missing from {describe_row(frame, 0)} (fields: "
                f"{F.payload_names(frame)}). Pass field=<the column holding the conversations>."
            )
        col = frame.column(field)
        t = col.type
        if pa.types.is_null(t):
            if n == 0:
                return cls.of(frame.drop_columns([field]), field)
            raise DatasetFormatError(
                f"tokenize_chat: field {field!r} is null in {describe_row(frame, 0)}; every row needs a "
                "list of messages. Fix the data or filter such rows out."
            )
        if not (pa.types.is_list(t) or pa.types.is_large_list(t)) or not pa.types.is_struct(t.value_type):
            raise WrongTypeError(
                f"tokenize_chat: field {field!r} has type {t} ({describe_row(frame, 0)}), not a list of messages: "
                "it must be list<struct<role: string, content: string>> (in Python, a list of "
                "{'role': ..., 'content': ...} dicts)."
            )
        st = t.value_type
        have = [st.field(i).name for i in range(st.num_fields)]
        for key in ("role", "content"):
            if key not in have:
                raise MissingFieldError(
                    f"tokenize_chat: the messages in field {field!r} have no {key!r} (their keys: "
                    f"{have}; {describe_row(frame, 0)}). Every message needs 'role' and 'content'."
                )
            kt = st.field(key).type
            if not (pa.types.is_string(kt) or pa.types.is_large_string(kt) or pa.types.is_null(kt)):
                raise WrongTypeError(
                    f"tokenize_chat: message {key!r} in field {field!r} has type {kt}, not text "
                    f"({describe_row(frame, 0)}); {key} must be a string."
                )
        arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        if arr.null_count:
            first = int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
            raise DatasetFormatError(
                f"tokenize_chat: field {field!r} is null in {describe_row(frame, first)}; every row needs a "
                "list of messages. Fix the data or filter such rows out."
            )
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(pc.list_value_length(arr).to_numpy(zero_copy_only=False), out=offsets[1:])
        values = pc.list_flatten(arr)

        def fail_at(bad: pa.Array, what: str) -> None:
            hits = np.flatnonzero(bad.to_numpy(zero_copy_only=False))
            if len(hits):
                j = int(hits[0])
                r = int(np.searchsorted(offsets, j, side="right") - 1)
                raise DatasetFormatError(
                    f"tokenize_chat: message {j - int(offsets[r])} of field {field!r} in "
                    f"{describe_row(frame, r)} {what}. Every message needs a 'role' and a text "
                    "'content'; fix the data or filter such rows out."
                )

        fail_at(values.is_null(), "is null")
        roles = pc.struct_field(values, "role")
        contents = pc.struct_field(values, "content")
        fail_at(roles.is_null(), "has no role")
        fail_at(contents.is_null(), "has no content")
        if pa.types.is_null(roles.type):
            roles = roles.cast(pa.string())
        if pa.types.is_null(contents.type):
            contents = contents.cast(pa.string())
        is_assistant = pc.equal(roles, "assistant").to_numpy(zero_copy_only=False).astype(bool)
        is_user = pc.equal(roles, "user").to_numpy(zero_copy_only=False).astype(bool)
        return cls(arr, offsets, contents, is_assistant, is_user)

    def rows(self) -> list[list[dict[str, Any]]]:
        """Python messages per row, with null-valued keys removed (see `zephon_columnar.ops.chat`)."""
        return [[drop_nulls(m) for m in row] for row in self.column.to_pylist()]

    def last_user_local(self) -> np.ndarray:
        """Per row, the index of its last user message, or -1."""
        users = np.flatnonzero(self.is_user)
        n = len(self.offsets) - 1
        if not len(users):
            return np.full(n, -1, np.int64)
        idx = np.searchsorted(users, self.offsets[1:], side="left") - 1
        cand = users[np.maximum(idx, 0)]
        ok = (idx >= 0) & (cand >= self.offsets[:-1])
        return np.where(ok, cand - self.offsets[:-1], -1)


def drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [drop_nulls(v) for v in value]
    return value


def row_values(frame: pa.Table, column: str | None) -> list[Any] | None:
    if column is None or column not in frame.column_names:
        return None
    return [drop_nulls(v) for v in frame.column(column).to_pylist()]


def describe_row(frame: pa.Table, i: int) -> str:
    return sample_of(frame, i) if F.DATASET in frame.column_names else f"row {i} of the frame"
