"""The token stream a packer works on: `TokenRun` (flat buffers and segments) and `FrameReader`
(frames of documents -> runs, with the rules that decide which columns are packed).

A *segment* is a document, or the piece of one that lands in one packed row. A run keeps, per
segment, where it starts in the flat buffers, which bookkeeping row (source document) it came
from, how many of its document's tokens come before it (``seg_skip``) and whether it ends its
document (``seg_closes``): what packed rows report about their contributors.

Field rules (Zephon raises on a leftover field; packing here drops it by rule):

- *aligned*: a list column of numbers or booleans whose length equals the token length on the
  first non-empty document the reader sees after a reset (the first document of the flush
  epoch). That choice depends only on the data, never on how rows were grouped into frames, so
  frame sizes and restore cannot change it. An aligned column must then stay aligned: a later
  document where it has another length, or a frame without it, is an error naming the column
  and the sample (drop the column before packing if it is not per-token data);
- *dropped*: every other payload column: strings such as ``text``, scalars, structs, lists of
  other types, lists whose length differs from the token length on that first document;
- ``positions`` in the input: with ``emit_positions=True`` it is an error (rename or drop it,
  or pass ``emit_positions=False``); with ``emit_positions=False`` it is an ordinary field.

Example:
    >>> from zephon_columnar.frame import frame_of
    >>> from zephon_columnar.ops.pack.spec import PackSpec
    >>> reader = FrameReader(PackSpec(max_length=4))
    >>> run = reader.read(frame_of({"input_ids": [[1, 2, 3], [4, 5]], "text": ["a", "b"]}))
    >>> run.data["input_ids"].tolist(), run.seg_starts.tolist(), list(run.data)
    ([1, 2, 3, 4, 5], [0, 3], ['input_ids'])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.errors import ConfigError, DatasetFormatError, MissingFieldError, WrongTypeError
from zephon_columnar.ops.pack.spec import POSITIONS, PackSpec
from zephon_columnar.records import PYTHON_LISTS_KEY
from zephon_columnar.types import TOKEN_FIELD_CANDIDATES

TOKEN_SKIP = F.TOKEN_SKIP


@dataclass
class TokenRun:
    """A stretch of a lane's token stream.

    ``data``: column name -> flat numpy values (the token column first, then the aligned
    fields; all the same length). ``seg_starts`` (int64, strictly increasing, 0 first when
    non-empty): where segments start. ``seg_book[i]``: the row of ``book`` (bookkeeping) that
    segment i came from. ``seg_skip[i]``: tokens of that document before segment i.
    ``seg_closes[i]``: segment i ends its document.
    """

    data: dict[str, np.ndarray]
    seg_starts: np.ndarray
    seg_book: np.ndarray
    book: pa.Table
    seg_skip: np.ndarray
    seg_closes: np.ndarray

    def __len__(self) -> int:
        return len(next(iter(self.data.values())))

    @property
    def tokens(self) -> np.ndarray:
        return next(iter(self.data.values()))

    def seg_lengths(self) -> np.ndarray:
        return np.diff(np.append(self.seg_starts, len(self)))

    @staticmethod
    def concat(runs: list[TokenRun]) -> TokenRun:
        if len(runs) == 1:
            return runs[0]
        names = list(runs[0].data)
        data = {n: np.concatenate([r.data[n] for r in runs]) for n in names}
        tok_shift = np.cumsum([0] + [len(r) for r in runs[:-1]])
        book_shift = np.cumsum([0] + [r.book.num_rows for r in runs[:-1]])
        return TokenRun(
            data,
            np.concatenate([r.seg_starts + s for r, s in zip(runs, tok_shift)]),
            np.concatenate([r.seg_book + s for r, s in zip(runs, book_shift)]),
            pa.concat_tables([r.book for r in runs], promote_options="default"),
            np.concatenate([r.seg_skip for r in runs]),
            np.concatenate([r.seg_closes for r in runs]),
        )

    def segment_at(self, pos: np.ndarray | int) -> Any:
        """Index of the segment holding token ``pos``."""
        return np.searchsorted(self.seg_starts, pos, side="right") - 1

    def sub(self, start: int, stop: int | None = None, *, copy: bool = False) -> TokenRun:
        """Tokens ``[start, stop)``: views of the buffers, or (``copy``) a run owning its memory
        with compact bookkeeping. A segment cut at ``start`` continues as the first segment."""
        stop = len(self) if stop is None else stop
        first = int(self.segment_at(start))
        last = int(np.searchsorted(self.seg_starts, stop, side="left"))
        cut_into = start - int(self.seg_starts[first])
        seg_starts = self.seg_starts[first:last] - start
        seg_starts[0] = 0
        seg_skip = self.seg_skip[first:last].copy()
        seg_skip[0] += cut_into
        seg_closes = self.seg_closes[first:last].copy()
        if (last < len(self.seg_starts) and self.seg_starts[last] > stop) or (
            last == len(self.seg_starts) and stop < len(self)
        ):
            seg_closes[-1] = False  # the last segment is cut at ``stop``
        seg_book = self.seg_book[first:last]
        if not copy:
            return TokenRun(
                {k: v[start:stop] for k, v in self.data.items()}, seg_starts, seg_book, self.book, seg_skip, seg_closes
            )
        book = self.book.take(pa.array(seg_book))
        data = {k: v[start:stop].copy() for k, v in self.data.items()}
        return TokenRun(data, seg_starts, np.arange(len(seg_book), dtype=np.int64), book, seg_skip, seg_closes)

    def tail(self, start: int) -> TokenRun | None:
        """What is left from token ``start`` on (owning its memory), or None."""
        return self.sub(start, copy=True) if start < len(self) else None

    def to_frame(self, token_field: str) -> pa.Table:
        """The run as a frame of one row per segment (bookkeeping with ``__token_skip``, then the
        packed columns as lists): what a packer carries across a flush point. Reading it back
        gives the same run."""
        book = self.book.take(pa.array(self.seg_book))
        book = book.append_column(TOKEN_SKIP, pa.array(self.seg_skip.astype(np.int64)))
        offsets = pa.array(np.append(self.seg_starts, len(self)).astype(np.int32))
        payload = pa.table(
            {name: pa.ListArray.from_arrays(offsets, pa.array(values)) for name, values in self.data.items()}
        )
        del token_field  # the token column is the first of ``data``
        return F.with_payload(book, payload)


def gather(
    runs: list[TokenRun], run_index: np.ndarray, seg_index: np.ndarray, start: np.ndarray, length: np.ndarray
) -> TokenRun:
    """A new run of pieces of segments, concatenated in order: piece i is ``length[i]`` tokens
    of segment ``seg_index[i]`` of ``runs[run_index[i]]``, from its token ``start[i]``."""
    run_index = np.asarray(run_index, np.int64)
    seg_index = np.asarray(seg_index, np.int64)
    start = np.asarray(start, np.int64)
    length = np.asarray(length, np.int64)
    n = len(length)
    dst_start = np.zeros(n, np.int64)
    np.cumsum(length[:-1], out=dst_start[1:])
    total = int(length.sum())
    names = list(runs[int(run_index[0])].data)
    data = {name: np.empty(total, runs[int(run_index[0])].data[name].dtype) for name in names}
    skip = np.empty(n, np.int64)
    closes = np.empty(n, bool)
    src_starts = np.empty(n, np.int64)
    book_rows = np.empty(n, np.int64)  # in the runs' books stacked in order
    book_base = np.cumsum([0] + [r.book.num_rows for r in runs[:-1]])
    # Pieces grouped by run (one pass over each run involved, whatever their number).
    order = np.argsort(run_index, kind="stable")
    bounds_r = np.flatnonzero(np.diff(run_index[order])) + 1
    for mine in np.split(order, bounds_r):
        r = int(run_index[mine[0]])
        run = runs[r]
        segs = seg_index[mine]
        src_starts[mine] = run.seg_starts[segs] + start[mine]
        book_rows[mine] = run.seg_book[segs] + book_base[r]
        skip[mine] = run.seg_skip[segs] + start[mine]
        seg_end = np.append(run.seg_starts[1:], len(run))[segs] - run.seg_starts[segs]
        closes[mine] = run.seg_closes[segs] & (start[mine] + length[mine] == seg_end)
    # Long pieces: one slice view each and one concatenate per column (memcpy speed). Many tiny
    # pieces: index arrays instead (per-piece Python would dominate).
    if total >= 16 * n:
        bounds = list(zip(run_index.tolist(), src_starts.tolist(), (src_starts + length).tolist()))
        for name in names:
            columns = [r.data[name] for r in runs]
            np.concatenate([columns[r][a:b] for r, a, b in bounds], out=data[name])
    else:
        within = np.arange(total, dtype=np.int64) - np.repeat(dst_start, length)
        src_pos = np.repeat(src_starts, length) + within
        piece_run = np.repeat(run_index, length)
        for r in np.unique(run_index).tolist():
            mask = piece_run == r
            for name in names:
                data[name][mask] = runs[r].data[name][src_pos[mask]]
    books = [r.book for r in runs]
    book = (F.concat_frames(books) if len(books) > 1 else books[0]).take(pa.array(book_rows))
    return TokenRun(data, dst_start, np.arange(n, dtype=np.int64), book, skip, closes)


# ---------------------------------------------------------------------- Arrow list helpers
def list_parts(arr: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """(row offsets, child values covering exactly the rows) of a list array, zero-copy."""
    t = arr.type
    b = len(arr)
    if pa.types.is_fixed_size_list(t):
        offsets = (np.arange(b + 1, dtype=np.int64) + arr.offset) * t.list_size
    else:
        width = np.int64 if pa.types.is_large_list(t) else np.int32
        offsets = np.frombuffer(arr.buffers()[1], dtype=width, count=arr.offset + b + 1)[arr.offset :]
    lo, hi = int(offsets[0]), int(offsets[-1])
    return offsets, arr.values.slice(lo, hi - lo)


def numpy_values(values: pa.Array, dtype: np.dtype) -> np.ndarray:
    if pa.types.is_boolean(values.type):
        bools: np.ndarray = values.to_numpy(zero_copy_only=False)
        return bools
    return np.frombuffer(values.buffers()[1], dtype=dtype, count=values.offset + len(values))[values.offset :]


def is_list(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t))


def is_number_list(t: pa.DataType) -> bool:
    if not is_list(t):
        return False
    v = t.value_type
    return bool(pa.types.is_integer(v) or pa.types.is_floating(v) or pa.types.is_boolean(v))


def np_dtype(t: pa.DataType) -> np.dtype:
    return np.dtype(np.bool_) if pa.types.is_boolean(t) else np.dtype(t.to_pandas_dtype())


def where(frame: pa.Table, row: int) -> str:
    """Which sample row ``row`` of a frame is, for error messages."""
    names = frame.column_names
    if all(c in names for c in (F.DATASET, F.SHARD, F.ROW)):
        d, s, r = (frame.column(c)[row].as_py() for c in (F.DATASET, F.SHARD, F.ROW))
        return f"sample (dataset={d}, shard={s}, row={r})"
    return f"frame row {row}"


def token_field(frame: pa.Table, want: str, op: str) -> str:
    """The token column of ``frame``: ``want``, or with ``"auto"`` the first of
    ``TOKEN_FIELD_CANDIDATES`` present; an error naming the columns otherwise."""
    names = frame.column_names
    if want == "auto":
        name = next((c for c in TOKEN_FIELD_CANDIDATES if c in names), None)
        if name is None:
            raise MissingFieldError(
                f"{op}: no token column (tokens_field='auto' looks for {list(TOKEN_FIELD_CANDIDATES)}; "
                f"fields: {F.payload_names(frame)}). Tokenize first or pass tokens_field=<name>."
            )
        return name
    if want not in names:
        raise MissingFieldError(f"{op}(tokens_field={want!r}): no such column (fields: {F.payload_names(frame)}).")
    return want


class FrameReader:
    """Frames -> runs, with the field rules of the module docstring. Decisions (token column,
    its dtype, which fields are aligned) are made on the first non-empty document and kept
    until `reset`."""

    def __init__(self, spec: PackSpec, *, op: str = "pack_flat", keep_payload: bool = False) -> None:
        self.spec = spec
        self.op = op
        self.keep_payload = keep_payload  # also keep the other payload columns, beside bookkeeping
        self.reset()

    def reset(self) -> None:
        self.tokens: str | None = None
        self.dtypes: dict[str, np.dtype] | None = None  # packed columns (tokens first) -> dtype
        self.value_types: dict[str, pa.DataType] = {}
        # Whether the tokens came as Python lists (`records.PYTHON_LISTS_KEY`: tokenize's ids)
        # rather than read from the data: packed_samples keep the kind (`LanePacker`).
        self.python_lists = False

    # ------------------------------------------------------------------ helpers
    def _token_field(self, frame: pa.Table) -> str:
        name = token_field(frame, self.spec.tokens_field, self.op)
        if self.tokens is not None and name != self.tokens:
            raise ConfigError(
                f"{self.op}: tokens_field='auto' resolved to {self.tokens!r} earlier in this lane "
                f"and to {name!r} now (rows have different columns); pass tokens_field=<name>."
            )
        t = frame.schema.field(name).type
        if not (is_list(t) and pa.types.is_integer(t.value_type)):
            raise WrongTypeError(
                f"{self.op}: token column {name!r} has type {t}; it must be a list of ints "
                "(tokenize first, or pass tokens_field=<the token column>)."
            )
        return name

    def _column(self, frame: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(row lengths int64, flat values) of a list column, over all the frame's chunks."""
        col = frame.column(name)
        dtype = np_dtype(col.type.value_type)
        lens, vals = [], []
        base = 0
        for arr in col.chunks:
            if len(arr) == 0:
                continue
            if arr.null_count:
                row = base + int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
                raise DatasetFormatError(
                    f"{self.op}: column {name!r} is null in {where(frame, row)}; "
                    f"fill or filter null rows before {self.op}."
                )
            offsets, values = list_parts(arr)
            if values.null_count:
                first = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
                row = base + int(np.searchsorted(offsets - offsets[0], first, side="right")) - 1
                raise DatasetFormatError(
                    f"{self.op}: column {name!r} has a null element in "
                    f"{where(frame, row)}; fill or filter it before {self.op}."
                )
            lens.append(np.diff(offsets).astype(np.int64, copy=False))
            vals.append(numpy_values(values, dtype))
            base += len(arr)
        if not lens:
            return np.zeros(0, np.int64), np.zeros(0, dtype)
        if len(lens) == 1:
            return lens[0], vals[0]
        return np.concatenate(lens), np.concatenate(vals)

    def _coerce(self, name: str, values: np.ndarray, frame: pa.Table) -> np.ndarray:
        """Values in the dtype chosen at the first document (rows of one lane may come from
        datasets that store ids as int32 or int64); a value that does not fit is an error."""
        want = self.dtypes[name]  # type: ignore[index]
        if values.dtype == want:
            return values
        if np.can_cast(values.dtype, want, "safe"):
            return values.astype(want)
        if want.kind in "iu" and values.dtype.kind in "iu":
            info = np.iinfo(want)
            if not len(values) or (int(values.min()) >= info.min and int(values.max()) <= info.max):
                return values.astype(want)
        raise WrongTypeError(
            f"{self.op}: column {name!r} is {self.value_types[name]} in this lane's first "
            f"document but {frame.schema.field(name).type.value_type} in a later frame, with "
            "values that do not fit; cast it to one type before packing."
        )

    # ------------------------------------------------------------------ reading
    def read(self, frame: pa.Table) -> TokenRun | None:
        """The frame as a run (one segment per non-empty document), or None when it holds no
        tokens. Empty documents are skipped."""
        if frame.num_rows == 0:
            return None
        names = frame.column_names
        if self.spec.emit_positions and POSITIONS in names:
            raise ConfigError(
                f"{self.op}: the input already has a 'positions' column and emit_positions=True "
                "would overwrite it; drop or rename it before packing, or pass "
                "emit_positions=False to pack it as an ordinary field."
            )
        tok = self._token_field(frame)
        lens, values = self._column(frame, tok)
        nonempty = np.flatnonzero(lens)
        if self.dtypes is None:
            if not len(nonempty):
                return None  # no decision before the first real document
            self._decide(frame, tok, lens, int(nonempty[0]), values.dtype)
        data = {tok: self._coerce(tok, values, frame)}
        for name in list(self.dtypes)[1:]:  # type: ignore[arg-type]
            if name not in names or not is_number_list(frame.schema.field(name).type):
                found = "lacks it" if name not in names else f"has it as {frame.schema.field(name).type}"
                raise DatasetFormatError(
                    f"{self.op}: column {name!r} is packed as a per-token field in this lane (it matched the "
                    f"token length on the first document) but a later frame {found}; drop {name!r} before "
                    "packing if it is not per-token data."
                )
            flens, fvalues = self._column(frame, name)
            if not np.array_equal(flens, lens):
                row = int(np.flatnonzero(flens != lens)[0])
                raise DatasetFormatError(
                    f"{self.op}: column {name!r} has {int(flens[row])} values but {tok!r} has {int(lens[row])} "
                    f"tokens in {where(frame, row)}; it was packed as a per-token field (it matched on the "
                    f"lane's first document). Drop {name!r} before packing if it is not per-token data, or fix "
                    "the row."
                )
            data[name] = self._coerce(name, fvalues, frame)
        if not len(nonempty):
            return None
        keep = [n for n in names if F.is_bookkeeping(n) and n not in _DERIVED]
        if self.keep_payload:
            keep += [n for n in F.payload_names(frame) if n not in self.dtypes]  # type: ignore[operator]
        book = frame.select(keep)
        offsets = np.concatenate([[0], np.cumsum(lens)])
        skip = (
            frame.column(TOKEN_SKIP).to_numpy().astype(np.int64)[nonempty]
            if TOKEN_SKIP in names
            else np.zeros(len(nonempty), np.int64)
        )
        closes = ~F.open_rows(frame)[nonempty]  # a piece that does not end its sample closes nothing
        return TokenRun(data, offsets[nonempty], nonempty.astype(np.int64), book, skip, closes)

    def _decide(self, frame: pa.Table, tok: str, lens: np.ndarray, first: int, dtype: np.dtype) -> None:
        schema = frame.schema
        self.tokens = tok
        self.python_lists = PYTHON_LISTS_KEY in (schema.field(tok).metadata or {})
        self.dtypes = {tok: dtype}
        self.value_types = {tok: schema.field(tok).type.value_type}
        for name in F.payload_names(frame):
            if name == tok or not is_number_list(schema.field(name).type):
                continue
            arr = frame.column(name)
            # Length of this column in the first non-empty document, without flattening it.
            chunk_row, chunk = first, None
            for c in arr.chunks:
                if chunk_row < len(c):
                    chunk = c
                    break
                chunk_row -= len(c)
            cell = None if chunk is None else chunk[chunk_row]
            if cell is not None and cell.is_valid and len(cell) == int(lens[first]):
                self.dtypes[name] = np_dtype(schema.field(name).type.value_type)
                self.value_types[name] = schema.field(name).type.value_type


#: Bookkeeping that describes a packed row rather than a source document, and ``__open`` (read
#: into ``TokenRun.seg_closes``): not carried into runs.
_DERIVED = (F.PADDING_LENGTH, TOKEN_SKIP, "__segments", F.OPEN)
