"""Packing: `PackFlatOp` (``Pipeline.pack_flat``) and the packers behind it.

Packing turns each lane's documents (rows with a list-of-int token column) into rows of exactly
``max_length`` tokens. All state lives in one packer per lane (a `LaneAccumulator`), fed that
lane's frames in order on one thread; the engine flushes and resets it at every flush point and
at the end of the lane.

The machinery is split so that every algorithm shares everything but placement:

- `_FrameReader` turns a frame into a `_Run` (the frame's token stream, its aligned fields and
  where each document starts) and applies the field rules below;
- `_Run` is a stretch of the stream: flat numpy buffers plus segment starts (a *segment* is a
  document, or the piece of one that lands in one packed row) and their bookkeeping rows;
- `_RowEmitter` turns the prefix of a run and a list of row lengths into an output frame:
  padding, ``positions``, ``__padding_length`` and bookkeeping;
- a packer class per algorithm decides where rows are cut. `WrapPacker` is ``algorithm="wrap"``;
  bin packers (first_fit, best_fit, best_fit_wrap) will gather their bins' segments into a run
  and hand it to the same emitter.

Wrap, per lane: the documents' tokens are concatenated in order and cut into rows of exactly
``max_length``; a document is split across rows where a cut falls, and the remainder is carried
to the next frame. With ``max_sequences_per_bin=m`` a row also closes, padded, when its m-th
segment ends. At a flush (every flush point and the end of the lane) the partial row is
emitted padded to ``max_length``: **nothing is dropped** (Zephon 0.2.0 drops it).

Output columns of a packed row:

- bookkeeping (``__lane``, ``__chunk``, ``__offset``, ``__dataset``, ``__shard``, ``__row``,
  ``__component``) of the input row that contributed the packed row's first token, so sample
  ids stay meaningful; ``__padding_length`` (int32): the number of trailing pad tokens;
- the token column under its own name, padded with ``pad_token_id`` (0 when None). Training
  code must mask pad by ``__padding_length`` (``SampleBatch.to_training`` does), not by id:
  0 is usually a real token;
- the aligned fields (see below), concatenated the same way and padded with 0;
- ``positions`` (int32, with ``emit_positions``): restarts at 0 at every segment: at every
  document start and at every row start (a document split across rows restarts at 0 in the
  next row, as Zephon does), and the pad tail is one more segment, so the document id of a
  position is ``cumsum(positions == 0) - 1``.

Field rules (Zephon raises on a leftover field; this packer drops it by rule):

- *aligned*: a list column of numbers or booleans whose length equals the token length on the
  first non-empty document the packer sees after a reset (the first document of the flush
  epoch). That choice depends only on the data, never on how rows were grouped into frames, so
  frame sizes and restore cannot change it. An aligned column must then stay aligned: a later
  document where it has another length, or a frame without it, is an error naming the column
  and the sample (drop the column before ``pack_flat`` if it is not per-token data);
- *dropped*: every other payload column: strings such as ``text``, scalars, structs, lists of
  other types, lists whose length differs from the token length on that first document;
- ``positions`` in the input: with ``emit_positions=True`` it is an error (rename or drop it,
  or pass ``emit_positions=False``); with ``emit_positions=False`` it is an ordinary field
  (packed if aligned).

Example:
    >>> op = PackFlatOp(4, algorithm="wrap")
    >>> packer = op.lane_accumulator()
    >>> out = packer.push(frame_of_docs([[1, 2, 3], [4, 5, 6]]))      # doctest: +SKIP
    >>> out[0].column("input_ids").to_pylist(), out[0].column("positions").to_pylist()  # doctest: +SKIP
    ([[1, 2, 3, 4]], [[0, 1, 2, 0]])
    >>> tail = packer.flush(reset=True)[0]                              # doctest: +SKIP
    >>> tail.column("input_ids").to_pylist(), tail.column("__padding_length").to_pylist()  # doctest: +SKIP
    ([[5, 6, 0, 0]], [2])
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.errors import ConfigError, DatasetFormatError
from zephon_columnar.memory import buffer_pool
from zephon_columnar.ops.base import BaseOp, OpTraits
from zephon_columnar.types import PADDING_LENGTH, TOKEN_FIELD_CANDIDATES

PackAlgorithm = Literal["first_fit", "best_fit", "wrap", "best_fit_wrap"]
ShuffleStrategy = Literal["random", "length"]
FlushStrategy = Literal["fifo", "fullest"]
Homogeneity = Literal["none", "group", "full"]

ALGORITHMS: tuple[str, ...] = ("first_fit", "best_fit", "wrap", "best_fit_wrap")
POSITIONS = "positions"


# ====================================================================== configuration
@dataclass(frozen=True)
class PackSpec:
    """What every packer needs to know (resolved, validated arguments)."""

    max_length: int
    tokens_field: str  # "auto" or a column name
    pad_token_id: int
    emit_positions: bool
    max_sequences_per_bin: int | None


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _check_optional_positive(name: str, value: Any) -> None:
    if value is not None and (not _is_int(value) or value < 1):
        raise ConfigError(f"pack_flat({name}={value!r}): pass a positive int or None.")


def _check_literal(name: str, value: Any, allowed: tuple[Any, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"pack_flat({name}={value!r}): unknown value; use one of {list(allowed)}.")


class PackFlatOp(BaseOp):
    """``pack_flat``: pack each lane's token stream into rows of exactly ``max_length`` tokens.

    Only ``algorithm="wrap"`` is available in this version; the others raise `ConfigError`.
    Real tokens are conserved: the real tokens of the output rows, in order, are the
    concatenation of the input documents' tokens; the partial row at a flush point or at the
    end is padded with ``pad_token_id`` (default 0) and counted in ``__padding_length``, which
    ``SampleBatch.to_training`` masks. See the module docstring for the output columns and the
    rule that decides which input columns are packed and which are dropped.

    Arguments of other algorithms (``drop_oversized``, ``min_sequence_length``,
    ``flush_strategy``, ``candidate_pool_size``, ``max_candidate_age``, ``shuffle_seed``) are
    validated and have no effect under wrap (wrap splits documents, so nothing is oversized and
    every row but a flush tail is full); ``num_bins`` is refused with wrap, as in Zephon.
    ``parallelism`` is accepted: placement is serial per lane and cheap (vectorized cuts).

    Example:
        >>> pipe.pack_flat(2048, algorithm="wrap").batch(8)  # doctest: +SKIP
    """

    name = "pack_flat"
    builtin = True

    def __init__(
        self,
        max_length: int,
        *,
        num_bins: int | None = None,
        max_sequences_per_bin: int | None = None,
        algorithm: PackAlgorithm = "first_fit",
        tokens_field: str = "auto",
        pad_token_id: int | None = None,
        emit_positions: bool = True,
        drop_oversized: bool | None = None,
        min_sequence_length: int = 1,
        shuffle_strategy: ShuffleStrategy | None = None,
        shuffle_seed: int | None = None,
        flush_strategy: FlushStrategy = "fifo",
        candidate_pool_size: int | None = None,
        max_candidate_age: int | None = None,
        homogeneity: Homogeneity = "none",
        groups: Any = None,
        parallelism: int | None = None,
    ) -> None:
        super().__init__()
        if not _is_int(max_length) or max_length < 1:
            raise ConfigError(f"pack_flat(max_length={max_length!r}): pass the packed row length, a positive int.")
        _check_literal("algorithm", algorithm, ALGORITHMS)
        for name, value in (("num_bins", num_bins), ("max_sequences_per_bin", max_sequences_per_bin),
                            ("candidate_pool_size", candidate_pool_size),
                            ("max_candidate_age", max_candidate_age), ("parallelism", parallelism)):
            _check_optional_positive(name, value)
        if not isinstance(tokens_field, str) or not tokens_field or F.is_bookkeeping(tokens_field):
            raise ConfigError(f"pack_flat(tokens_field={tokens_field!r}): pass 'auto' (first of "
                              f"{list(TOKEN_FIELD_CANDIDATES)}) or the name of a payload column.")
        if pad_token_id is not None and not _is_int(pad_token_id):
            raise ConfigError(f"pack_flat(pad_token_id={pad_token_id!r}): pass an int token id or None (0).")
        if not isinstance(emit_positions, bool):
            raise ConfigError(f"pack_flat(emit_positions={emit_positions!r}): pass True or False.")
        if drop_oversized is not None and not isinstance(drop_oversized, bool):
            raise ConfigError(f"pack_flat(drop_oversized={drop_oversized!r}): pass True, False or None.")
        if not _is_int(min_sequence_length) or not 1 <= min_sequence_length <= max_length:
            raise ConfigError(f"pack_flat(min_sequence_length={min_sequence_length!r}): pass an int in "
                              f"[1, max_length={max_length}].")
        _check_literal("shuffle_strategy", shuffle_strategy, (None, "random", "length"))
        if shuffle_seed is not None and not _is_int(shuffle_seed):
            raise ConfigError(f"pack_flat(shuffle_seed={shuffle_seed!r}): pass an int or None.")
        _check_literal("flush_strategy", flush_strategy, ("fifo", "fullest"))
        _check_literal("homogeneity", homogeneity, ("none", "group", "full"))

        if algorithm not in PACKERS:
            raise ConfigError(f"pack_flat(algorithm={algorithm!r}) comes in a later version; use algorithm='wrap'.")
        if algorithm == "wrap" and num_bins is not None:
            raise ConfigError(f"pack_flat(num_bins={num_bins}, algorithm='wrap'): wrap keeps one open row per "
                              "lane and takes no num_bins; remove num_bins (it is for first_fit/best_fit).")
        if shuffle_strategy is not None:
            raise ConfigError(
                f"pack_flat(shuffle_strategy={shuffle_strategy!r}) is not supported yet: reordering each pushed "
                "micro-batch would make the packed rows depend on frame sizes. Leave it None.")
        if homogeneity != "none":
            raise ConfigError(f"pack_flat(homogeneity={homogeneity!r}) is not supported yet; use "
                              "homogeneity='none' (one token stream per lane).")
        if groups is not None:
            raise ConfigError("pack_flat(groups=...) goes with homogeneity='group', which is not supported yet; "
                              "remove groups.")

        self.max_length = int(max_length)
        self.algorithm = algorithm
        self.num_bins = num_bins
        self.max_sequences_per_bin = None if max_sequences_per_bin is None else int(max_sequences_per_bin)
        self.tokens_field = tokens_field
        self.pad_token_id = pad_token_id
        self.emit_positions = emit_positions
        self.drop_oversized = drop_oversized
        self.min_sequence_length = min_sequence_length
        self.shuffle_strategy = shuffle_strategy
        self.shuffle_seed = shuffle_seed
        self.flush_strategy = flush_strategy
        self.candidate_pool_size = candidate_pool_size
        self.max_candidate_age = max_candidate_age
        self.homogeneity = homogeneity
        self.groups = groups
        self.parallelism = parallelism
        self.spec = PackSpec(max_length=self.max_length, tokens_field=tokens_field,
                             pad_token_id=0 if pad_token_id is None else int(pad_token_id),
                             emit_positions=emit_positions, max_sequences_per_bin=self.max_sequences_per_bin)

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=False, indexable=False)

    def lane_accumulator(self) -> _Packer:
        return PACKERS[self.algorithm](self.spec)

    def fingerprint(self) -> dict[str, Any]:
        s = self.spec
        return {"op": self.name, "algorithm": self.algorithm, "max_length": s.max_length,
                "tokens_field": s.tokens_field, "pad_token_id": s.pad_token_id,
                "emit_positions": s.emit_positions, "max_sequences_per_bin": s.max_sequences_per_bin}


# ====================================================================== the token stream
@dataclass
class _Run:
    """A stretch of a lane's token stream.

    ``data`` maps column name -> flat numpy values (the token column and the aligned fields,
    all the same length). ``seg_starts`` (int64, strictly increasing, 0 first when non-empty)
    are where segments start: documents, or the piece of a document carried from the previous
    row. ``seg_book[i]`` is the row of ``book`` (bookkeeping) that segment i came from.
    """

    data: dict[str, np.ndarray]
    seg_starts: np.ndarray
    seg_book: np.ndarray
    book: pa.Table

    def __len__(self) -> int:
        return len(next(iter(self.data.values())))

    @staticmethod
    def concat(runs: list[_Run]) -> _Run:
        if len(runs) == 1:
            return runs[0]
        names = list(runs[0].data)
        data = {n: np.concatenate([r.data[n] for r in runs]) for n in names}
        tok_shift = np.cumsum([0] + [len(r) for r in runs[:-1]])
        book_shift = np.cumsum([0] + [r.book.num_rows for r in runs[:-1]])
        starts = np.concatenate([r.seg_starts + s for r, s in zip(runs, tok_shift)])
        seg_book = np.concatenate([r.seg_book + s for r, s in zip(runs, book_shift)])
        book = pa.concat_tables([r.book for r in runs], promote_options="default")
        return _Run(data, starts, seg_book, book)

    def segment_at(self, pos: np.ndarray | int) -> np.ndarray | int:
        """Index of the segment holding token ``pos``."""
        return np.searchsorted(self.seg_starts, pos, side="right") - 1

    def sub(self, start: int, stop: int | None = None, *, copy: bool = False) -> _Run:
        """Tokens ``[start, stop)``: views of the buffers, or (``copy``) a run owning its memory
        with compact bookkeeping. A segment cut at ``start`` continues as the first segment."""
        stop = len(self) if stop is None else stop
        first = int(self.segment_at(start))
        last = int(np.searchsorted(self.seg_starts, stop, side="left"))
        seg_starts = self.seg_starts[first:last] - start
        seg_starts[0] = 0
        seg_book = self.seg_book[first:last]
        if not copy:
            return _Run({k: v[start:stop] for k, v in self.data.items()}, seg_starts, seg_book, self.book)
        book = self.book.take(pa.array(seg_book))
        data = {k: v[start:stop].copy() for k, v in self.data.items()}
        return _Run(data, seg_starts, np.arange(len(seg_book), dtype=np.int64), book)

    def tail(self, start: int) -> _Run | None:
        """What is left from token ``start`` on (owning its memory), or None."""
        return self.sub(start, copy=True) if start < len(self) else None


# ====================================================================== reading frames
def _list_parts(arr: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """(row offsets, child values covering exactly the rows) of a list array, zero-copy."""
    t = arr.type
    b = len(arr)
    if pa.types.is_fixed_size_list(t):
        offsets = (np.arange(b + 1, dtype=np.int64) + arr.offset) * t.list_size
    else:
        width = np.int64 if pa.types.is_large_list(t) else np.int32
        offsets = np.frombuffer(arr.buffers()[1], dtype=width, count=arr.offset + b + 1)[arr.offset:]
    lo, hi = int(offsets[0]), int(offsets[-1])
    return offsets, arr.values.slice(lo, hi - lo)


def _numpy_values(values: pa.Array, dtype: np.dtype) -> np.ndarray:
    if pa.types.is_boolean(values.type):
        return values.to_numpy(zero_copy_only=False)
    return np.frombuffer(values.buffers()[1], dtype=dtype, count=values.offset + len(values))[values.offset:]


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _is_number_list(t: pa.DataType) -> bool:
    if not _is_list(t):
        return False
    v = t.value_type
    return pa.types.is_integer(v) or pa.types.is_floating(v) or pa.types.is_boolean(v)


def _np_dtype(t: pa.DataType) -> np.dtype:
    return np.dtype(np.bool_) if pa.types.is_boolean(t) else np.dtype(t.to_pandas_dtype())


class _FrameReader:
    """Frames -> runs, with the field rules of the module docstring. Decisions (token column,
    its dtype, which fields are aligned) are made on the first non-empty document and kept
    until the packer is reset."""

    def __init__(self, spec: PackSpec) -> None:
        self.spec = spec
        self.tokens: str | None = None
        self.dtypes: dict[str, np.dtype] | None = None  # packed columns (tokens first) -> dtype
        self.value_types: dict[str, pa.DataType] = {}

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _where(frame: pa.Table, row: int) -> str:
        names = frame.column_names
        if all(c in names for c in (F.DATASET, F.SHARD, F.ROW)):
            d, s, r = (frame.column(c)[row].as_py() for c in (F.DATASET, F.SHARD, F.ROW))
            return f"sample (dataset={d}, shard={s}, row={r})"
        return f"frame row {row}"

    def _token_field(self, frame: pa.Table) -> str:
        names = frame.column_names
        want = self.spec.tokens_field
        if want == "auto":
            name = next((c for c in TOKEN_FIELD_CANDIDATES if c in names), None)
            if name is None:
                raise ConfigError(
                    f"pack_flat: no token column (tokens_field='auto' looks for {list(TOKEN_FIELD_CANDIDATES)}; "
                    f"fields: {F.payload_names(frame)}). Tokenize first or pass tokens_field=<name>.")
        else:
            if want not in names:
                raise ConfigError(f"pack_flat(tokens_field={want!r}): no such column (fields: "
                                  f"{F.payload_names(frame)}).")
            name = want
        if self.tokens is not None and name != self.tokens:
            raise ConfigError(f"pack_flat: tokens_field='auto' resolved to {self.tokens!r} earlier in this lane and "
                              f"to {name!r} now (rows have different columns); pass tokens_field=<name>.")
        t = frame.schema.field(name).type
        if not (_is_list(t) and pa.types.is_integer(t.value_type)):
            raise ConfigError(f"pack_flat: token column {name!r} has type {t}; it must be a list of ints "
                              "(tokenize first, or pass tokens_field=<the token column>).")
        return name

    def _column(self, frame: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(row lengths int64, flat values) of a list column, over all the frame's chunks."""
        col = frame.column(name)
        dtype = _np_dtype(col.type.value_type)
        lens, vals = [], []
        base = 0
        for arr in col.chunks:
            if arr.null_count:
                row = base + int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
                raise DatasetFormatError(f"pack_flat: column {name!r} is null in {self._where(frame, row)}; "
                                         "fill or filter null rows before pack_flat.")
            offsets, values = _list_parts(arr)
            if values.null_count:
                first = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
                row = base + int(np.searchsorted(offsets - offsets[0], first, side="right")) - 1
                raise DatasetFormatError(f"pack_flat: column {name!r} has a null element in "
                                         f"{self._where(frame, row)}; fill or filter it before pack_flat.")
            lens.append(np.diff(offsets).astype(np.int64, copy=False))
            vals.append(_numpy_values(values, dtype))
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
        raise ConfigError(f"pack_flat: column {name!r} is {self.value_types[name]} in this lane's first "
                          f"document but {frame.schema.field(name).type.value_type} in a later frame, with values "
                          "that do not fit; cast it to one type before pack_flat.")

    # ------------------------------------------------------------------ reading
    def read(self, frame: pa.Table) -> _Run | None:
        """The frame as a run, or None when it holds no tokens."""
        if frame.num_rows == 0:
            return None
        names = frame.column_names
        if self.spec.emit_positions and POSITIONS in names:
            raise ConfigError("pack_flat: the input already has a 'positions' column and emit_positions=True "
                              "would overwrite it; drop or rename it before pack_flat, or pass "
                              "emit_positions=False to pack it as an ordinary field.")
        tok = self._token_field(frame)
        lens, values = self._column(frame, tok)
        nonempty = np.flatnonzero(lens)
        if self.dtypes is None:
            if not len(nonempty):
                return None  # no decision before the first real document
            self._decide(frame, tok, lens, int(nonempty[0]), values.dtype)
        data = {tok: self._coerce(tok, values, frame)}
        for name in list(self.dtypes)[1:]:  # type: ignore[arg-type]
            if name not in names or not _is_number_list(frame.schema.field(name).type):
                found = "lacks it" if name not in names else f"has it as {frame.schema.field(name).type}"
                raise DatasetFormatError(
                    f"pack_flat: column {name!r} is packed as a per-token field in this lane (it matched the "
                    f"token length on the first document) but a later frame {found}; drop {name!r} before "
                    "pack_flat if it is not per-token data.")
            flens, fvalues = self._column(frame, name)
            if not np.array_equal(flens, lens):
                row = int(np.flatnonzero(flens != lens)[0])
                raise DatasetFormatError(
                    f"pack_flat: column {name!r} has {int(flens[row])} values but {tok!r} has {int(lens[row])} "
                    f"tokens in {self._where(frame, row)}; it was packed as a per-token field (it matched on the "
                    f"lane's first document). Drop {name!r} before pack_flat if it is not per-token data, or fix "
                    "the row.")
            data[name] = self._coerce(name, fvalues, frame)
        if not len(nonempty):
            return None
        book = frame.select([n for n in names if F.is_bookkeeping(n) and n != PADDING_LENGTH])
        offsets = np.concatenate([[0], np.cumsum(lens)])
        return _Run(data, offsets[nonempty], nonempty.astype(np.int64), book)

    def _decide(self, frame: pa.Table, tok: str, lens: np.ndarray, first: int, dtype: np.dtype) -> None:
        schema = frame.schema
        self.tokens = tok
        self.dtypes = {tok: dtype}
        self.value_types = {tok: schema.field(tok).type.value_type}
        for name in F.payload_names(frame):
            if name == tok or not _is_number_list(schema.field(name).type):
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
                self.dtypes[name] = _np_dtype(schema.field(name).type.value_type)
                self.value_types[name] = schema.field(name).type.value_type


# ====================================================================== writing rows
class _RowEmitter:
    """Packed rows -> an output frame. Shared by every packer.

    ``emit(run, row_lengths)``: the rows are consecutive stretches of ``run`` from token 0
    (row i holds ``row_lengths[i]`` real tokens, at most ``max_length``); each row is padded to
    ``max_length``. Bookkeeping of a row: that of the segment holding its first token.
    """

    def __init__(self, spec: PackSpec, reader: _FrameReader) -> None:
        self.spec = spec
        self.reader = reader

    def emit(self, run: _Run, row_lengths: np.ndarray) -> pa.Table:
        spec = self.spec
        L = spec.max_length
        rows = len(row_lengths)
        row_lengths = row_lengths.astype(np.int64, copy=False)
        ends = np.cumsum(row_lengths)
        total = int(ends[-1])
        row_starts = ends - row_lengths
        pads = L - row_lengths
        padded = bool(pads.any())
        mask = np.arange(L)[None, :] < row_lengths[:, None] if padded else None
        offsets = pa.array(np.arange(0, (rows + 1) * L, L, dtype=np.int32))

        cols: list[pa.Array] = []
        names: list[str] = []
        book = run.book.take(pa.array(run.seg_book[run.segment_at(row_starts)]))
        for name in book.column_names:
            cols.append(book.column(name))
            names.append(name)
        cols.append(pa.array(pads.astype(np.int32)))
        names.append(PADDING_LENGTH)

        tok = self.reader.tokens
        for name, values in run.data.items():
            real = values[:total]
            if padded:
                fill = spec.pad_token_id if name == tok else 0
                try:
                    flat = np.full(rows * L, fill, dtype=values.dtype)
                except OverflowError as err:
                    raise ConfigError(f"pack_flat(pad_token_id={fill}) does not fit the token column {name!r} "
                                      f"({values.dtype}); pass a pad id in range.") from err
                flat.reshape(rows, L)[mask] = real
            else:
                flat = real
            cols.append(pa.ListArray.from_arrays(offsets, pa.array(flat)))
            names.append(name)

        if spec.emit_positions:
            positions = _positions(run.seg_starts, row_lengths, row_starts, L)
            cols.append(pa.ListArray.from_arrays(offsets, pa.array(positions)))
            names.append(POSITIONS)
        return pa.Table.from_arrays(cols, names=names)


def _positions(seg_starts: np.ndarray, row_lengths: np.ndarray, row_starts: np.ndarray, L: int) -> np.ndarray:
    """``positions`` of packed rows (int32, ``len(row_lengths) * L``): the index of each token
    in its segment, where segments start at every document start, every row start and every
    pad tail.

    Built as a running count in one buffer: 1 everywhere, and at each segment start minus the
    length of the segment before it, so that ``cumsum`` falls back to 0 there. That is two
    passes over the tokens and no token-sized temporaries; the buffer comes from
    `memory.buffer_pool`, which recycles pages instead of faulting fresh ones in every push.
    """
    rows = len(row_lengths)
    total = int(row_lengths.sum())
    seg = seg_starts[: int(np.searchsorted(seg_starts, total))]
    # Document starts in padded coordinates (row r begins at r * L).
    row_of = np.searchsorted(row_starts, seg, side="right") - 1
    seg = seg - row_starts[row_of] + row_of * L
    row_begin = np.arange(rows, dtype=np.int64) * L
    padded = row_lengths < L
    starts = np.union1d(np.union1d(seg, row_begin), (row_begin + row_lengths)[padded])
    n = rows * L
    pos = np.frombuffer(pa.allocate_buffer(n * 4, memory_pool=buffer_pool()), dtype=np.int32)
    pos.fill(1)
    pos[starts[1:]] = (starts[:-1] - starts[1:] + 1).astype(np.int32)
    pos[0] = 0
    np.cumsum(pos, out=pos)
    return pos


# ====================================================================== packers
class _Packer:
    """Shared machinery of a lane's packer: frames are read into runs and kept pending until
    the algorithm can close a row (``_ready``); ``_place`` closes rows; ``flush`` emits what is
    left, padded. After ``flush(reset=True)`` the packer is exactly a fresh one."""

    def __init__(self, spec: PackSpec) -> None:
        self.spec = spec
        self._reset()

    def _reset(self) -> None:
        self.reader = _FrameReader(self.spec)
        self.emitter = _RowEmitter(self.spec, self.reader)
        self._pending: list[_Run] = []
        self._pending_tokens = 0
        self._pending_segments = 0

    # ------------------------------------------------------------------ LaneAccumulator
    def push(self, frame: pa.Table) -> list[pa.Table]:
        run = self.reader.read(frame)
        if run is None:
            return []
        self._pending.append(run)
        self._pending_tokens += len(run)
        self._pending_segments += len(run.seg_starts)
        if not self._ready():
            return []
        out, tail = self._place(self._pending)
        self._pending = [tail] if tail is not None else []
        self._pending_tokens = len(tail) if tail is not None else 0
        self._pending_segments = len(tail.seg_starts) if tail is not None else 0
        return out

    def flush(self, *, reset: bool) -> list[pa.Table]:
        out = []
        if self._pending_tokens:
            run = _Run.concat(self._pending)
            out = [self.emitter.emit(run, np.array([len(run)], np.int64))]
        self._pending, self._pending_tokens, self._pending_segments = [], 0, 0
        if reset:
            self._reset()
        return out

    # ------------------------------------------------------------------ algorithm
    def _ready(self) -> bool:
        raise NotImplementedError

    def _place(self, runs: list[_Run]) -> tuple[list[pa.Table], _Run | None]:
        """Close the rows the pending runs allow: (output frames, what stays pending)."""
        raise NotImplementedError


class WrapPacker(_Packer):
    """``algorithm="wrap"``: cut the lane's token stream every ``max_length`` tokens (and, with
    ``max_sequences_per_bin=m``, right after a row's m-th segment ends)."""

    def _ready(self) -> bool:
        m = self.spec.max_sequences_per_bin
        return self._pending_tokens >= self.spec.max_length or (m is not None and self._pending_segments >= m)

    def _place(self, runs: list[_Run]) -> tuple[list[pa.Table], _Run | None]:
        L = self.spec.max_length
        if self.spec.max_sequences_per_bin is not None:
            run = _Run.concat(runs)
            lengths = self._capped_rows(run)
            out = [self.emitter.emit(run, lengths)] if len(lengths) else []
            return out, run.tail(int(lengths.sum()))
        out = []
        last = runs[-1]
        head = self._pending_tokens - len(last)  # carried tokens, fewer than max_length
        if head and len(last) >= 2 * L - head:
            # Copy only what completes the carried row; the other rows are views of the frame.
            k = L - head
            out.append(self.emitter.emit(_Run.concat(runs[:-1] + [last.sub(0, k)]), np.array([L], np.int64)))
            runs = [last.sub(k)]
        run = _Run.concat(runs)
        rows = len(run) // L
        if rows:
            out.append(self.emitter.emit(run, np.full(rows, L, dtype=np.int64)))
        return out, run.tail(rows * L)

    def _capped_rows(self, run: _Run) -> np.ndarray:
        """Row lengths when a row also closes after its m-th segment. O(rows) Python steps.

        Every run ends at a document end (frames hold whole documents), and the pending run
        starts at a row start."""
        L = self.spec.max_length
        m = self.spec.max_sequences_per_bin
        assert m is not None
        n = len(run)
        starts = run.seg_starts.tolist()
        k_max = len(starts)
        lengths = []
        r = 0
        j = 0  # first segment starting at or after r
        while r < n:
            j = bisect.bisect_left(starts, r, j)
            cont = j == k_max or starts[j] != r  # the row starts inside a segment
            k = j + m - 1 - cont  # index of the row's m-th segment
            end_m = (starts[k + 1] if k + 1 < k_max else n) if k < k_max else None
            if end_m is not None and end_m - r <= L:
                lengths.append(end_m - r)  # closes after its m-th segment (padded if short)
                r = end_m
            elif r + L <= n:
                lengths.append(L)
                r += L
            else:
                break  # partial row: carried
        return np.array(lengths, dtype=np.int64)


#: algorithm -> packer class. first_fit, best_fit and best_fit_wrap plug in here.
PACKERS: dict[str, type[_Packer]] = {"wrap": WrapPacker}
