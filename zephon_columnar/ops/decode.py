"""`DecodeTextOp` (``Pipeline.decode_text``): bytes columns to text, vectorized, 1:1.

For each name in ``fields``: a binary column is decoded to a string column (``large_binary`` to
``large_string``); a string column is kept; then both get the same normalization
(``normalize_newlines`` turns ``\\r\\n`` and lone ``\\r`` into ``\\n``; ``lowercase`` applies
Unicode lower-casing with ``utf8_lower``). Nulls stay null. As in Zephon, a field absent from a
frame, or of another type (numbers, lists), is left alone -- ``tokenize`` reports a missing text
field by name.

UTF-8 is decoded by Arrow's validating cast (no per-value Python); other encodings, and UTF-8
columns that fail validation with ``errors="replace"``/``"ignore"`` (or any registered Python
error handler), go through ``bytes.decode`` per value, with Python's exact semantics.
``errors="strict"`` raises DatasetFormatError (a ValueError) naming the field, the sample and the bad byte offset.

Example:
    >>> raw = Dataset.from_tables("raw", [pa.table({"text": [b"Caf\\xc3\\xa9\\r\\nOpen", b"bad \\xff byte"]})])
    >>> pipe = Pipeline(StaticMixtureWorkSource([raw], {"raw": 1.0}, chunk_size=2))
    >>> pipe = pipe.decode_text(fields=("text",), errors="replace", lowercase=True)
    >>> [record.payload["text"] for record in pipe]
    ['café\\nopen', 'bad \ufffd byte']
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from zephon_columnar import frame as F
from zephon_columnar.errors import ConfigError, DatasetFormatError
from zephon_columnar.ops.base import FrameOp, OpTraits
from zephon_columnar.ops.rows import sample_of


class DecodeTextOp(FrameOp):
    """Decode bytes fields to normalized text; stateless and 1:1."""

    name = "decode_text"

    def __init__(
        self,
        *,
        fields: str | Sequence[str] = ("text",),
        encoding: str = "utf-8",
        errors: str = "strict",
        normalize_newlines: bool = True,
        lowercase: bool = False,
        parallelism: int | None = None,
    ) -> None:
        super().__init__()
        names = (fields,) if isinstance(fields, str) else tuple(fields)
        if not names or not all(isinstance(f, str) and f for f in names):
            raise ConfigError(f"decode_text: fields={fields!r}; pass a column name or a sequence of names.")
        try:
            codec = codecs.lookup(encoding)
        except (LookupError, TypeError) as err:
            raise ConfigError(
                f"decode_text: unknown encoding={encoding!r}; pass a Python codec name such as 'utf-8' or 'latin-1'."
            ) from err
        try:
            codecs.lookup_error(errors)
        except (LookupError, TypeError) as err:
            raise ConfigError(f"decode_text: unknown errors={errors!r}; use 'strict', 'replace' or 'ignore'.") from err
        self.fields = names
        self.encoding = codec.name
        self.errors = errors
        self.normalize_newlines = bool(normalize_newlines)
        self.lowercase = bool(lowercase)
        self.parallelism = parallelism

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True, parallelism=self.parallelism or 1, emits="one")

    def fingerprint(self) -> dict[str, Any]:
        return {
            "op": self.name,
            "fields": list(self.fields),
            "encoding": self.encoding,
            "errors": self.errors,
            "normalize_newlines": self.normalize_newlines,
            "lowercase": self.lowercase,
        }

    def process_frame(self, frame: pa.Table) -> pa.Table:
        for name in self.fields:
            if name not in frame.column_names:
                continue
            col = frame.column(name)
            t = col.type
            if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
                col = self._decode(frame, name, col)
            elif not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)):
                continue
            if self.normalize_newlines and pc.any(pc.match_substring(col, "\r")).as_py():
                col = pc.replace_substring(pc.replace_substring(col, "\r\n", "\n"), "\r", "\n")
            if self.lowercase:
                col = pc.utf8_lower(col)
            frame = frame.set_column(frame.column_names.index(name), name, col)
        return frame

    def _decode(self, frame: pa.Table, name: str, col: pa.ChunkedArray) -> pa.ChunkedArray:
        target = pa.large_string() if pa.types.is_large_binary(col.type) else pa.string()
        if pa.types.is_binary_view(col.type):
            col = col.cast(pa.binary())
        if self.encoding == "utf-8":
            try:
                return col.cast(target)  # validates UTF-8, no copy of the data
            except pa.ArrowInvalid:
                pass  # find the bad value (strict) or decode per value (replace/ignore/...)
        values = col.to_pylist()
        out: list[str | None] = []
        for i, v in enumerate(values):
            if v is None:
                out.append(None)
                continue
            try:
                out.append(v.decode(self.encoding, self.errors))
            except UnicodeDecodeError as err:
                raise DatasetFormatError(
                    f"decode_text: field {name!r} of {_where(frame, i)} is not valid {self.encoding} "
                    f"(byte {err.start}: {err.reason}). Pass errors='replace' or 'ignore', or the right encoding=."
                ) from err
        return pa.chunked_array([pa.array(out, type=target)])


def _where(frame: pa.Table, i: int) -> str:
    return sample_of(frame, i) if F.DATASET in frame.column_names else f"row {i} of the frame"
