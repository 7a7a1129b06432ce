"""`ExpandChatOp` (``Pipeline.expand_chat``): one conversation prefix per answered user turn.

A conversation ``U1 A1 U2 A2 U3`` becomes two rows, ``U1 A1`` and ``U1 A1 U2 A2``: each prefix
ends just before the next user message, so an answer keeps its whole assistant/tool exchange.
A user turn counts as answered when an assistant message (even an empty one) follows it before
the next user message; unanswered turns give no row, and a conversation with no answered turn
(or no user message at all) is dropped. The other payload fields are kept as they are.

Bookkeeping, as Zephon: several prefixes are children whose lineage ends with the ordinal of
their user turn among the conversation's user turns (so unanswered turns leave gaps); a sole
prefix keeps the row's own lineage.

The slicing is columnar (one ``take`` on the flattened messages); only the roles are read into
Python. ``field`` may be a path into nested structs (``"chat.messages"``).

Example:
    >>> from zephon_columnar.frame import frame_of, payload_of
    >>> msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
    ...         {"role": "user", "content": "bye"}, {"role": "assistant", "content": "ciao"}]
    >>> out = ExpandChatOp().process_frame(frame_of({"messages": [msgs]}))
    >>> [[m["content"] for m in row] for row in payload_of(out).column("messages").to_pylist()]
    [['hi', 'hello'], ['hi', 'hello', 'bye', 'ciao']]
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from zephon_columnar import frame as F
from zephon_columnar.errors import ConfigError, DatasetFormatError, WrongTypeError
from zephon_columnar.ops.base import FrameOp, OpTraits
from zephon_columnar.ops.rows import sample_of


class ExpandChatOp(FrameOp):
    """Conversation prefixes ending at answered user turns; see the module docstring."""

    name = "expand_chat"

    def __init__(self, *, field: str = "messages", parallelism: int | None = None) -> None:
        super().__init__()
        if not isinstance(field, str) or any(not part for part in field.split(".")):
            raise ConfigError(
                f"expand_chat(field={field!r}): name the messages column (or a path like 'chat.messages')."
            )
        self.field = field
        self.path = tuple(field.split("."))
        self.parallelism = parallelism

    def traits(self) -> OpTraits:
        return OpTraits(
            preserves_cursor_order=True,
            indexable=False,
            calibration_replayable=True,
            parallelism=self.parallelism or 1,
            emits="any",
        )

    def fingerprint(self) -> dict[str, Any]:
        return {"op": self.name, "field": self.field}

    def process_frame(self, frame: pa.Table) -> pa.Table:
        if frame.num_rows == 0:
            return frame
        lists = self._messages(frame)
        offsets = lists.offsets.to_numpy().astype(np.int64)
        roles = self._roles(frame, lists, offsets)
        parent, child, ends = _prefixes(roles, offsets)
        new_offsets = np.zeros(len(parent) + 1, np.int32)
        np.cumsum(ends, out=new_offsets[1:])
        # The messages of every prefix: one take on the flattened messages of the frame
        # (prefix j's k-th message is message starts[j] + k).
        take = np.arange(int(new_offsets[-1])) + np.repeat(offsets[:-1][parent] - new_offsets[:-1], ends)
        messages = pa.ListArray.from_arrays(pa.array(new_offsets), lists.values.take(pa.array(take)), type=lists.type)
        book = F.with_children(F.bookkeeping_of(frame), parent, child)
        payload = F.payload_of(frame).take(pa.array(parent, pa.int64()))
        top = self.path[0]
        column = messages if len(self.path) == 1 else _replace_nested(payload.column(top), self.path[1:], messages)
        payload = payload.set_column(payload.column_names.index(top), top, column)
        return F.with_payload(book, payload)

    # ---------------------------------------------------------------- reading
    def _messages(self, frame: pa.Table) -> pa.ListArray:
        """The messages of every row as one list array (a row with none: an error naming it)."""
        top = self.path[0]
        if top not in frame.column_names:
            raise DatasetFormatError(
                f"expand_chat: the rows have no {top!r} field (columns: "
                f"{F.payload_names(frame)}); pass expand_chat(field=...)."
            )
        column = frame.column(top).combine_chunks()
        for key in self.path[1:]:
            if not pa.types.is_struct(column.type) or column.type.get_field_index(key) < 0:
                raise DatasetFormatError(
                    f"expand_chat: field {self.field!r}: {key!r} is not a field of "
                    f"{column.type}; pass expand_chat(field=...)."
                )
            column = pc.struct_field(column, key)
        if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
            raise WrongTypeError(
                f"expand_chat: field {self.field!r} must be a list of messages, got {column.type} "
                f"(first row: {sample_of(frame, 0)})."
            )
        if column.null_count:
            i = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
            raise DatasetFormatError(f"expand_chat: field {self.field!r} is missing in {sample_of(frame, i)}.")
        if column.offset or pa.types.is_large_list(column.type):  # offsets from 0, int32
            column = pa.ListArray.from_arrays(
                pa.array(column.offsets.to_numpy() - column.offsets[0].as_py(), pa.int32()), column.flatten()
            )
        return column

    def _roles(self, frame: pa.Table, lists: pa.ListArray, offsets: np.ndarray) -> list[str]:
        values = lists.values
        if not pa.types.is_struct(values.type) or values.type.get_field_index("role") < 0:
            raise DatasetFormatError(
                f"expand_chat: the messages of {self.field!r} must have a 'role' "
                f"(got {values.type}; first row: {sample_of(frame, 0)})."
            )
        roles: list[Any] = pc.struct_field(values, "role").to_pylist()  # checked below: non-empty strings
        for flat, role in enumerate(roles):
            if not isinstance(role, str) or not role:
                row = int(np.searchsorted(offsets, flat, side="right") - 1)
                raise DatasetFormatError(
                    f"expand_chat: message {flat - int(offsets[row])} of {self.field!r} in "
                    f"{sample_of(frame, row)} must have a non-empty string role, got {role!r}."
                )
        return roles


def _prefixes(roles: list[str], offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(parent row, child ordinal or -1 for a sole prefix, messages in the prefix) per output."""
    parent, child, ends = [], [], []
    for row in range(len(offsets) - 1):
        lo, hi = int(offsets[row]), int(offsets[row + 1])
        found: list[tuple[int, int]] = []  # (user-turn ordinal, prefix length)
        ordinal, answered = -1, False
        for i in range(lo, hi):
            role = roles[i]
            if role == "user":
                if answered:
                    found.append((ordinal, i - lo))
                ordinal, answered = ordinal + 1, False
            elif role == "assistant" and ordinal >= 0:
                answered = True
        if answered:
            found.append((ordinal, hi - lo))
        for ordinal, length in found:
            parent.append(row)
            child.append(ordinal if len(found) > 1 else -1)
            ends.append(length)
    return (np.asarray(parent, np.int64), np.asarray(child, np.int64), np.asarray(ends, np.int64))


def _replace_nested(column: pa.ChunkedArray, path: tuple[str, ...], value: pa.Array) -> pa.Array:
    """``column`` (a struct) with the field at ``path`` replaced by ``value`` (row-aligned)."""
    struct = column.combine_chunks()
    key, rest = path[0], path[1:]
    names = [struct.type.field(i).name for i in range(struct.type.num_fields)]
    fields = [pc.struct_field(struct, n) for n in names]
    i = names.index(key)
    fields[i] = value if not rest else _replace_nested(pa.chunked_array([fields[i]]), rest, value)
    return pa.StructArray.from_arrays(fields, names=names, mask=struct.is_null())
