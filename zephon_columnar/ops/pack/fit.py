"""``algorithm="first_fit"`` / ``"best_fit"``: whole documents into at most ``num_bins`` open bins.

Per stream, documents arrive in order and are never split:

- a document longer than ``max_length`` is dropped (``drop_oversized=True``, the default;
  counted in the lane's stats as ``pack_oversized_docs`` / ``pack_oversized_tokens``, out of
  ``pack_docs_seen`` / ``pack_tokens_seen``, and warned about once per pass with the share
  dropped) or is an error naming the sample (``drop_oversized=False``);
- otherwise it goes into an open bin with room for it: the oldest such bin (``first_fit``) or
  the one it leaves with the least room (``best_fit``; ties to the oldest);
- if no open bin has room, a new bin opens; when ``num_bins`` bins are already open, one is
  emitted first: the oldest (``flush_strategy="fifo"``) or the one with the least room
  (``"fullest"``; ties to the oldest), unless the new bin is full at once (then it is emitted
  and no other bin is);
- a bin is emitted as soon as its room falls below ``min_sequence_length`` or it holds
  ``max_sequences_per_bin`` documents;
- empty documents have no tokens to pack and are skipped;
- a flush point (and the end) emits every open bin, oldest first, padded.

Every emitted row is padded to ``max_length`` with ``pad_token_id`` (``__padding_length`` says
how much). The per-document placement loop is Python over at most ``num_bins`` bins; tokens are
only touched once, when emitted rows are gathered (one vectorized copy per push).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from zephon_columnar.errors import DatasetFormatError
from zephon_columnar.ops.pack.packer import (
    OVERSIZED_DOCS,
    OVERSIZED_TOKENS,
    Emission,
    HeldDocs,
    LazyRun,
    Packer,
)
from zephon_columnar.ops.pack.stream import TokenRun, where
from zephon_columnar.references import state_column, with_state


@dataclass
class _Bin:
    """One open bin: its documents as (run id, segment) in order, and the tokens they use."""

    opened: int
    used: int = 0
    docs: list[tuple[int, int, int]] = field(default_factory=list)  # (run id, segment, length)


class FitPacker(Packer):
    """``first_fit`` / ``best_fit`` for one stream (see the module docstring)."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self._open: list[_Bin] = []  # in opening order
        self._opened = 0
        self._docs = HeldDocs()

    def push(self, run: TokenRun) -> list[Emission]:
        spec = self.spec
        L, num_bins, cap = spec.max_length, spec.num_bins or 1, spec.max_sequences_per_bin
        best = spec.algorithm == "best_fit"
        fullest = spec.flush_strategy == "fullest"
        room_floor = spec.min_sequence_length
        rid = self._docs.add(run)
        closed: list[tuple[_Bin, int]] = []
        seg_lengths = run.seg_lengths()
        lengths = seg_lengths.tolist()
        for i, n in enumerate(lengths):
            if n > L:
                if not spec.drop_oversized:
                    book_row = int(run.seg_book[i])
                    raise DatasetFormatError(
                        f"{spec.algorithm}: a document of {n} tokens, longer than max_length={L}, in "
                        f"{where(run.book, book_row)}; pass drop_oversized=True to drop such documents, split "
                        "them upstream (tokenize(split_long_samples=True)), or use algorithm='wrap'."
                    )
                self.count(OVERSIZED_DOCS, 1)
                self.count(OVERSIZED_TOKENS, n)
                continue
            target: _Bin | None = None
            room = L - n  # a bin fits the document if it uses at most this much
            if best:
                for b in self._open:
                    if b.used <= room and (target is None or b.used > target.used):
                        target = b
            else:
                for b in self._open:
                    if b.used <= room:
                        target = b
                        break
            fresh = target is None
            if target is None:
                target = _Bin(opened=self._opened)
                self._opened += 1
            target.docs.append((rid, i, n))
            target.used += n
            self._docs.hold(rid)
            full = L - target.used < room_floor or (cap is not None and len(target.docs) >= cap)
            if fresh and not full:
                # Make room for the new bin: emit the oldest (fifo) or the fullest open bin.
                while len(self._open) >= num_bins:
                    victim = max(self._open, key=lambda b: (b.used, -b.opened)) if fullest else self._open[0]
                    self._open.remove(victim)
                    closed.append((victim, i))
                self._open.append(target)
            elif full:
                if not fresh:
                    self._open.remove(target)
                closed.append((target, i))
        if not closed:
            self._docs.release()
            return []
        frame = self._emit_bins([b for b, _ in closed])
        return [Emission(frame, np.array([t for _, t in closed], np.int64))]

    def _emit_bins(self, bins: list[_Bin]) -> pa.Table:
        pieces = [(rid, seg, 0, n) for b in bins for rid, seg, n in b.docs]
        run = self._docs.gather(pieces)
        rids, held = np.unique(np.array([p[0] for p in pieces]), return_counts=True)
        for rid, n in zip(rids.tolist(), held.tolist()):
            self._docs.drop(rid, n)
        self._docs.release()
        return self.emit(run, np.array([b.used for b in bins], np.int64))

    def flush(self, *, end: bool) -> list[pa.Table]:
        bins, self._open = self._open, []
        self._opened = 0
        if not bins:
            return []
        return [self._emit_bins(bins)]

    def snapshot(self) -> tuple[dict[str, Any], pa.Table | None]:
        """The open bins (opening number and document lengths) and their documents by reference."""
        bins = [[b.opened, len(b.docs)] for b in self._open]
        refs = self._docs.refs([(rid, seg) for b in self._open for rid, seg, _ in b.docs])
        if refs is not None:
            refs = with_state(refs, length=[n for b in self._open for _, _, n in b.docs])
        return {"opened": self._opened, "bins": bins}, refs

    def restore(
        self, state: dict[str, Any], refs: pa.Table | None, materialize: Callable[[pa.Table], TokenRun]
    ) -> None:
        self._opened = int(state["opened"])
        if refs is None:
            return
        rid = self._docs.add(LazyRun(refs, materialize), held=refs.num_rows)  # computed when a bin is emitted
        lengths = state_column(refs, "length")
        i = 0
        for opened, count in state["bins"]:
            b = _Bin(opened=int(opened))
            for n in lengths[i : i + int(count)]:
                b.docs.append((rid, i, int(n)))
                b.used += int(n)
                i += 1
            self._open.append(b)
