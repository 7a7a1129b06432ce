"""``algorithm="wrap"``: cut the stream of documents into rows of exactly ``max_length``.

The documents' tokens are concatenated in arrival order and cut every ``max_length`` tokens; a
document is split where a cut falls and its remainder starts the next row.

- *Uncapped* (no ``max_sequences_per_bin``): every row is full, never padded. At a flush point
  the partial row is **carried** into the next flush epoch (Zephon drops it, losing tokens):
  it is what `carry` returns, and a checkpoint holds it. At the end of the lane the final
  partial row (fewer than ``max_length`` tokens) is dropped, counted in the lane's stats
  (``pack_dropped_final_tokens``) and warned about: the only tokens wrap ever loses.
- *Capped* (``max_sequences_per_bin=m``): a row also closes, padded, right after its m-th
  segment ends (a document piece continuing from the previous row counts as one); at a flush
  point and at the end the partial row is emitted padded, as Zephon does.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.ops.pack.packer import Emission, Packer
from zephon_columnar.ops.pack.stream import TokenRun, gather
from zephon_columnar.references import state_column, with_state


class WrapPacker(Packer):
    """``algorithm="wrap"`` for one stream (see the module docstring)."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self._pending: list[TokenRun] = []
        self._pending_tokens = 0
        self._pending_segments = 0

    def _set_pending(self, tail: TokenRun | None) -> None:
        self._pending = [tail] if tail is not None else []
        self._pending_tokens = len(tail) if tail is not None else 0
        self._pending_segments = len(tail.seg_starts) if tail is not None else 0

    def push(self, run: TokenRun) -> list[Emission]:
        head = self._pending_tokens  # tokens before this run, fewer than max_length
        self._pending.append(run)
        self._pending_tokens += len(run)
        self._pending_segments += len(run.seg_starts)
        m = self.spec.max_sequences_per_bin
        if self._pending_tokens < self.spec.max_length and (m is None or self._pending_segments < m):
            return []
        frames, lengths, tail = self._place(self._pending)
        self._set_pending(tail)
        ends = np.cumsum(np.concatenate(lengths)) - head
        triggers = run.segment_at(ends - 1)
        out, i = [], 0
        for frame, ls in zip(frames, lengths):
            out.append(Emission(frame, triggers[i : i + len(ls)]))
            i += len(ls)
        return out

    def _place(self, runs: list[TokenRun]) -> tuple[list[pa.Table], list[np.ndarray], TokenRun | None]:
        """Close the rows the pending runs allow: (frames, their row lengths, what stays)."""
        L = self.spec.max_length
        if self.spec.max_sequences_per_bin is not None:
            run = TokenRun.concat(runs)
            lengths = self._capped_rows(run)
            if not len(lengths):
                return [], [], run
            return [self.emit(run, lengths)], [lengths], run.tail(int(lengths.sum()))
        frames, all_lengths = [], []
        last = runs[-1]
        head = self._pending_tokens - len(last)  # carried tokens, fewer than max_length
        if head and len(last) >= 2 * L - head:
            # Copy only what completes the carried row; the other rows are views of the frame.
            k = L - head
            one = np.array([L], np.int64)
            frames.append(self.emit(TokenRun.concat(runs[:-1] + [last.sub(0, k)]), one))
            all_lengths.append(one)
            runs = [last.sub(k)]
        run = TokenRun.concat(runs)
        rows = len(run) // L
        if rows:
            lengths = np.full(rows, L, dtype=np.int64)
            frames.append(self.emit(run, lengths))
            all_lengths.append(lengths)
        return frames, all_lengths, run.tail(rows * L)

    def _capped_rows(self, run: TokenRun) -> np.ndarray:
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

    def flush(self, *, end: bool) -> list[pa.Table]:
        if not self._pending_tokens:
            return []
        run = TokenRun.concat(self._pending)
        if self.spec.max_sequences_per_bin is None and not end:
            self._set_pending(run)  # carried into the next flush epoch
            return []
        self._set_pending(None)
        if self.spec.max_sequences_per_bin is None:
            self.count("pack_dropped_final_tokens", len(run))
            return []
        return [self.emit(run, np.array([len(run)], np.int64))]

    def carry(self) -> TokenRun | None:
        if self.spec.max_sequences_per_bin is not None or not self._pending_tokens:
            return None
        run = TokenRun.concat(self._pending)
        self._pending = [run]
        return run

    def snapshot(self) -> tuple[dict[str, Any], pa.Table | None]:
        """The partial row: its pieces' documents by reference, and where each piece starts in
        its document and how long it is."""
        if not self._pending_tokens:
            return {}, None
        run = TokenRun.concat(self._pending)
        refs = F.refs_of(run.book.take(pa.array(run.seg_book)))
        return {}, with_state(refs, skip=run.seg_skip, length=run.seg_lengths())

    def restore(
        self, state: dict[str, Any], refs: pa.Table | None, materialize: Callable[[pa.Table], TokenRun]
    ) -> None:
        if refs is None:
            return
        docs = materialize(refs)  # a few documents at most: computed now
        n = len(docs.seg_starts)
        self._set_pending(
            gather(
                [docs],
                np.zeros(n, np.int64),
                np.arange(n),
                np.array(state_column(refs, "skip"), np.int64),
                np.array(state_column(refs, "length"), np.int64),
            )
        )
