"""The line index of one JSON Lines file: the byte offset of every row, and the schema of its lines.

Contract: `_scan_file` reads the file's decompressed bytes once, in big blocks: it counts
newlines (numpy, no Python object per row), skips blank lines, and in the same pass infers the
schema of every line (`schema._SchemaSoFar`). The result is a :class:`LineIndex`; caching it
is `index_cache`'s job. A truncated or corrupt ``.gz``/``.zst`` file, or a field whose type
changes within the file (or against ``seed``), is a DatasetFormatError naming the file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import IO

import numpy as np
import pyarrow as pa

from zephon_columnar.errors import DatasetFormatError
from zephon_columnar.io.jsonl.compression import _open_decompressed, _read_error, compression_of
from zephon_columnar.io.jsonl.lines import _WHITESPACE, _blank_lines, _terminated
from zephon_columnar.io.jsonl.schema import _SchemaSoFar

_SCAN_BLOCK = 16 << 20  # bytes per block when counting lines


@dataclass(frozen=True)
class LineIndex:
    """Byte offsets of the rows of one (decompressed) JSON Lines file, and their schema.

    ``offsets`` has ``num_rows + 1`` entries: row ``r`` is the bytes ``[offsets[r],
    offsets[r+1])`` (its line, its newline, and any blank lines after it); the last entry is
    the decompressed size. ``blank_before[i]`` is the row that follows the i-th blank line
    (``num_rows`` for trailing ones), which maps rows back to physical line numbers.
    ``schema`` is the Arrow schema of every row of the file (widened as the module docstring
    says; rows pyarrow cannot parse are left out, the reader reports them). ``bad_rows`` are
    those rows, increasing: a line that is not one JSON object in UTF-8 that pyarrow parses
    (``on_bad_record="skip"`` leaves them out of the dataset); ``bad_reasons`` say why for the
    first `SHOWN_SKIPPED` of them, as ``"line N: why"``.
    """

    offsets: np.ndarray
    blank_before: np.ndarray
    schema: pa.Schema = field(default_factory=lambda: pa.schema([]))
    bad_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    bad_reasons: tuple[str, ...] = ()

    @property
    def num_rows(self) -> int:
        return len(self.offsets) - 1

    def line_no(self, row: int) -> int:
        """1-based physical line number of ``row``."""
        return int(row) + 1 + int(np.searchsorted(self.blank_before, row, side="right"))

    @property
    def nbytes(self) -> int:
        return self.offsets.nbytes + self.blank_before.nbytes + self.bad_rows.nbytes

    def good_rows(self) -> np.ndarray:
        """The rows that are not bad, increasing (row ``i`` of a dataset that skips bad records
        is ``good_rows()[i]``)."""
        return np.delete(np.arange(self.num_rows, dtype=np.int64), self.bad_rows)


def _scan_file(url: str, local: str, seed: pa.Schema | None = None) -> LineIndex:
    """:func:`_scan_lines` over the decompressed bytes of ``url`` (a local copy at ``local``)."""
    comp = compression_of(url)
    try:
        with _open_decompressed(local, comp) as stream:
            return _scan_lines(stream, url, seed)
    except DatasetFormatError:
        raise  # a bad line: already names the file and line
    except (EOFError, OSError, ValueError) as err:
        error = _read_error(url, err, f"cannot read as {comp or 'uncompressed'} JSON Lines")
        if error is err:
            raise
        raise error from err


def _scan_lines(stream: IO[bytes], url: str, seed: pa.Schema | None = None) -> LineIndex:
    """Build a :class:`LineIndex` by counting newlines in big blocks, and infer its schema by
    parsing each block's complete lines with pyarrow (one call per block).

    ``seed`` is a schema the file's types must agree with (those of the dataset's earlier files):
    a field whose type conflicts with it, or changes within the file, raises DatasetFormatError
    naming ``url``, the line and the field.
    """
    row_starts: list[np.ndarray] = []
    blanks: list[np.ndarray] = []
    carry = b""  # the unfinished last line of the previous block
    base = 0  # file offset of carry[0]
    rows = 0
    schema = _SchemaSoFar(url, seed)

    def line_numbers(of_rows: np.ndarray) -> np.ndarray:
        """1-based physical line numbers of rows scanned so far (only on slow paths: the blank
        lines seen so far are all those before these rows)."""
        blank_before = np.concatenate(blanks) if blanks else np.zeros(0, dtype=np.int64)
        return of_rows + 1 + np.searchsorted(blank_before, of_rows, side="right")

    while True:
        block = stream.read(_SCAN_BLOCK)
        if not block:
            break
        buf = carry + block if carry else block
        arr = np.frombuffer(buf, dtype=np.uint8)
        nl = np.flatnonzero(arr == 10)
        if len(nl) == 0:
            carry = buf
            continue
        starts = np.empty(len(nl), dtype=np.int64)
        starts[0] = 0
        starts[1:] = nl[:-1] + 1
        blank = _blank_lines(buf, arr, starts, nl - starts)
        keep = ~blank
        row_starts.append(starts[keep] + base)
        if blank.any():
            blanks.append(rows + np.cumsum(keep)[blank])
        end = int(nl[-1]) + 1
        block_starts = starts[keep]
        if len(block_starts):
            # A row runs to the next row's start (blank lines between them included) or `end`.
            block_ends = np.append(block_starts[1:], end)
            schema.widen(buf, block_starts, block_ends, np.arange(rows, rows + len(block_starts)), line_numbers)
        rows += len(block_starts)
        carry = buf[end:]
        base += end
    if carry:  # a last line without a trailing newline
        if carry.strip(_WHITESPACE):
            row_starts.append(np.array([base], dtype=np.int64))
            last = _terminated(carry)
            schema.widen(last, np.zeros(1, dtype=np.int64), np.array([len(last)]), np.array([rows]), line_numbers)
            rows += 1
        else:
            blanks.append(np.array([rows], dtype=np.int64))
    total = base + len(carry)
    offsets = np.concatenate(row_starts + [np.array([total], dtype=np.int64)]).astype(np.int64, copy=False)
    blank_before = np.concatenate(blanks).astype(np.int64) if blanks else np.zeros(0, dtype=np.int64)
    return LineIndex(
        offsets=offsets,
        blank_before=blank_before,
        schema=schema.schema,
        bad_rows=np.array(schema.bad_rows, dtype=np.int64),
        bad_reasons=tuple(schema.bad_reasons),
    )
