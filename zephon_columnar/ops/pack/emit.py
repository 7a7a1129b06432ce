"""Writing packed rows: a run and row lengths -> an output frame (shared by every algorithm).

Output columns of a packed row (``pack_flat``):

- bookkeeping of the segment holding the row's first token (``__lane``, ``__chunk``,
  ``__offset``, ``__dataset``, ``__shard``, ``__row``, ``__component``, ``__lineage``), so sample
  ids stay meaningful; ``__padding_length`` (int32): trailing pad tokens; ``__segments``: the
  row's pieces in order, one struct each (source sample, chunk, offset, component, lineage,
  ``start`` = tokens of its document before the piece, ``length``, ``closes`` = the piece ends
  its document): what records report as contributors and per-component counts;
- the token column under its own name, padded with ``pad_token_id``. Training code masks pad
  by ``__padding_length`` (``SampleBatch.to_training`` does), not by id;
- the aligned fields, concatenated the same way and padded with 0;
- ``positions`` (int32, with ``emit_positions``): restarts at 0 at every segment: at every
  document start and at every row start (a document split across rows restarts at 0 in the
  next row), and the pad tail is one more segment, so the document id of a position is
  ``cumsum(positions == 0) - 1``.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.errors import ConfigError
from zephon_columnar.memory import buffer_pool
from zephon_columnar.ops.pack.spec import POSITIONS, PackSpec
from zephon_columnar.ops.pack.stream import TokenRun

SEGMENTS = F.SEGMENTS
_SEGMENT_FIELDS = (
    (F.DATASET, "dataset"),
    (F.SHARD, "shard"),
    (F.ROW, "row"),
    (F.CHUNK, "chunk"),
    (F.OFFSET, "offset"),
    (F.COMPONENT, "component"),
)


def emit_rows(spec: PackSpec, run: TokenRun, row_lengths: np.ndarray, *, op: str = "pack_flat") -> pa.Table:
    """Rows that are consecutive stretches of ``run`` from token 0 (row i holds
    ``row_lengths[i]`` real tokens, at most ``max_length``), each padded to ``max_length``."""
    L = spec.max_length
    rows = len(row_lengths)
    row_lengths = row_lengths.astype(np.int64, copy=False)
    ends = np.cumsum(row_lengths)
    total = int(ends[-1])
    row_starts = ends - row_lengths
    pads = L - row_lengths
    padded = bool(pads.any())
    offsets = pa.array(np.arange(0, (rows + 1) * L, L, dtype=np.int32))

    cols: list[pa.Array] = []
    names: list[str] = []
    book = run.book.take(pa.array(run.seg_book[run.segment_at(row_starts)]))
    for name in book.column_names:
        cols.append(book.column(name))
        names.append(name)
    cols.append(pa.array(pads.astype(np.int32)))
    names.append(F.PADDING_LENGTH)
    if all(col in book.column_names for col, _ in _SEGMENT_FIELDS):  # frames of real samples
        cols.append(segments_column(run, row_starts, total))
        names.append(SEGMENTS)

    tok = next(iter(run.data))
    for name, values in run.data.items():
        real = values[:total]
        if padded:
            fill = spec.pad_token_id if name == tok else 0
            try:
                pad_run = np.full(L, fill, dtype=values.dtype)
            except OverflowError as err:
                raise ConfigError(
                    f"{op}(pad_token_id={fill}) does not fit the token column {name!r} "
                    f"({values.dtype}); pass a pad id in range."
                ) from err
            # Each row's tokens, then its pad: one pass writing every output element once.
            parts = []
            for a, n in zip(row_starts.tolist(), row_lengths.tolist()):  # rows are long
                parts.append(real[a : a + n])
                parts.append(pad_run[: L - n])
            flat = np.concatenate(parts)
        else:
            flat = real
        cols.append(pa.ListArray.from_arrays(offsets, pa.array(flat)))
        names.append(name)

    if spec.emit_positions:
        positions = _positions(run.seg_starts, row_lengths, row_starts, L)
        cols.append(pa.ListArray.from_arrays(offsets, pa.array(positions)))
        names.append(POSITIONS)
    return pa.Table.from_arrays(cols, names=names)


def pieces(run: TokenRun, row_starts: np.ndarray, total: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The rows' pieces: (start in the run, length, segment index, row index) of every stretch
    of one segment inside one row, in order."""
    seg = run.seg_starts[: int(np.searchsorted(run.seg_starts, total))]
    starts = np.union1d(seg, row_starts[row_starts < total])
    lengths = np.diff(np.append(starts, total))
    return starts, lengths, run.segment_at(starts), np.searchsorted(row_starts, starts, side="right") - 1


_SEGMENT_DTYPES = {
    F.DATASET: np.int32,
    F.SHARD: np.int32,
    F.ROW: np.int64,
    F.CHUNK: np.int64,
    F.OFFSET: np.int32,
    F.COMPONENT: np.int32,
}


def segments_column(run: TokenRun, row_starts: np.ndarray, total: int) -> pa.Array:
    """``__segments`` of the rows starting at ``row_starts`` (see the module docstring). Built
    from numpy views of the run's bookkeeping: a few array operations per frame."""
    starts, lengths, seg, row = pieces(run, row_starts, total)
    seg_ends = np.append(run.seg_starts[1:], len(run))[seg]
    book_rows = run.seg_book[seg]
    book = run.book
    children = []
    for col, _ in _SEGMENT_FIELDS:
        values = book.column(col)
        values = (values.chunk(0) if values.num_chunks == 1 else values.combine_chunks()).to_numpy()
        children.append(pa.array(values[book_rows].astype(_SEGMENT_DTYPES[col], copy=False)))
    if F.LINEAGE in book.column_names:
        lineage_off, lineage_values = F.lineage_parts(book.take(pa.array(book_rows)))
    else:
        lineage_off, lineage_values = np.zeros(len(seg) + 1, np.int64), np.zeros(0, np.int32)
    children.append(
        pa.ListArray.from_arrays(pa.array(lineage_off.astype(np.int32)), pa.array(lineage_values, pa.int32()))
    )
    children.append(pa.array(run.seg_skip[seg] + (starts - run.seg_starts[seg])))
    children.append(pa.array(lengths.astype(np.int32)))
    children.append(pa.array(run.seg_closes[seg] & (starts + lengths == seg_ends)))
    struct = pa.StructArray.from_arrays(children, fields=list(F.SEGMENT_STRUCT))
    counts = np.bincount(row, minlength=len(row_starts))
    list_offsets = np.zeros(len(row_starts) + 1, np.int32)
    np.cumsum(counts, out=list_offsets[1:])
    return pa.ListArray.from_arrays(pa.array(list_offsets), struct)


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
