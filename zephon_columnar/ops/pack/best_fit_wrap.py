"""``algorithm="best_fit_wrap"``: a pool of candidates, best fit, at most one split per row.

Per stream (Zephon 0.2.0's rules):

- a document first emits its full windows of ``max_length`` tokens (each a row of its own);
  what is left (fewer than ``max_length`` tokens) becomes a *candidate*;
- candidates wait in a pool sorted by length (ties: arrival order). Once the pool holds
  ``candidate_pool_size`` candidates and at least ``max_length`` tokens (or, capped,
  ``max_sequences_per_bin`` candidates), a row is built, as often as that still holds:

  1. candidates older than ``max_candidate_age`` arrivals go first, oldest first, while they
     fit (the starvation guard);
  2. then, repeatedly, the longest candidate that fits the gap (ties: the earliest);
  3. when none fits, the shortest candidate is split to fill the gap exactly, and the row is
     full. It is cut at its end (its suffix goes now, its prefix stays) when it is a document's
     prefix and the piece needed is shorter than what would stay; otherwise at its start;
- at a flush point and at the end, rows are built while the pool holds ``max_length`` tokens,
  then all remaining candidates, in arrival order, make one padded row.

Uncapped, every row but the flush tail is exactly full. A row is never more than one split.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from zephon_columnar.ops.pack.packer import Emission, HeldDocs, LazyRun, Packer
from zephon_columnar.ops.pack.stream import TokenRun
from zephon_columnar.references import state_column, with_state


@dataclass
class _Candidate:
    """A piece of a document waiting in the pool: tokens ``[start, start + length)`` of segment
    ``seg`` of run ``run``."""

    length: int
    arrival: int
    run: int
    seg: int
    start: int

    def key(self) -> tuple[int, int]:
        return (self.length, self.arrival)


class BestFitWrapPacker(Packer):
    """``best_fit_wrap`` for one stream (see the module docstring)."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self._reset()

    def _reset(self) -> None:
        self._pool: list[_Candidate] = []  # sorted by (length, arrival)
        self._keys: list[tuple[int, int]] = []  # the same order, for bisect
        self._by_arrival: deque[_Candidate] = deque()
        self._taken: set[int] = set()  # arrivals gone from the pool (lazy in _by_arrival)
        self._arrivals = 0
        self._tokens = 0
        self._docs = HeldDocs()

    # ------------------------------------------------------------------ the pool
    def _add(self, cand: _Candidate) -> None:
        i = bisect.bisect_left(self._keys, cand.key())
        self._keys.insert(i, cand.key())
        self._pool.insert(i, cand)
        self._tokens += cand.length

    def _add_all(self, cands: list[_Candidate]) -> None:
        """``_add`` of each of ``cands`` into an empty pool, with one sort."""
        self._pool = sorted(cands, key=_Candidate.key)
        self._keys = [c.key() for c in self._pool]
        self._tokens = sum(c.length for c in cands)

    def _remove_at(self, i: int) -> _Candidate:
        cand = self._pool.pop(i)
        del self._keys[i]
        self._tokens -= cand.length
        return cand

    def _take(self, cand: _Candidate) -> None:
        """``cand`` leaves the pool whole."""
        self._remove_at(bisect.bisect_left(self._keys, cand.key()))
        self._taken.add(cand.arrival)
        self._docs.drop(cand.run)

    def _oldest(self) -> _Candidate | None:
        while self._by_arrival and self._by_arrival[0].arrival in self._taken:
            self._taken.discard(self._by_arrival.popleft().arrival)
        return self._by_arrival[0] if self._by_arrival else None

    # ------------------------------------------------------------------ rows
    def _build(self) -> list[tuple[int, int, int, int]]:
        """One row: its pieces as (run, seg, start, length)."""
        spec = self.spec
        gap = spec.max_length
        cap = spec.max_sequences_per_bin
        limit = len(self._pool) if cap is None else min(len(self._pool), cap)
        out: list[tuple[int, int, int, int]] = []
        while gap > 0 and len(out) < limit:  # the starvation guard
            old = self._oldest()
            if old is None or self._arrivals - old.arrival <= spec.max_candidate_age or old.length > gap:
                break
            self._take(old)
            out.append((old.run, old.seg, old.start, old.length))
            gap -= old.length
        while gap > 0 and len(out) < limit:
            i = bisect.bisect_right(self._keys, (gap, float("inf"))) - 1  # the longest that fits...
            if i >= 0:
                i = bisect.bisect_left(self._keys, (self._keys[i][0], -1))  # ...the earliest of that length
                cand = self._pool[i]
                self._take(cand)
                out.append((cand.run, cand.seg, cand.start, cand.length))
                gap -= cand.length
                continue
            # Nothing fits: split the shortest candidate to fill the gap exactly.
            victim = self._remove_at(0)
            if victim.start == 0 and gap < victim.length - gap:
                out.append((victim.run, victim.seg, victim.start + victim.length - gap, gap))  # its suffix
            else:
                out.append((victim.run, victim.seg, victim.start, gap))
                victim.start += gap
            victim.length -= gap
            self._add(victim)  # the rest stays, ageing from its first arrival
            gap = 0
        return out

    def _ready(self) -> bool:
        cap = self.spec.max_sequences_per_bin
        return len(self._pool) >= self.spec.candidate_pool_size and (
            self._tokens >= self.spec.max_length or (cap is not None and len(self._pool) >= cap)
        )

    def push(self, run: TokenRun) -> list[Emission]:
        L = self.spec.max_length
        rid = self._docs.add(run)
        rows: list[list[tuple[int, int, int, int]]] = []
        triggers: list[int] = []
        for i, n in enumerate(run.seg_lengths().tolist()):
            start = 0
            while n - start >= L:  # full windows go out at once
                rows.append([(rid, i, start, L)])
                triggers.append(i)
                start += L
            if start < n:
                cand = _Candidate(length=n - start, arrival=self._arrivals, run=rid, seg=i, start=start)
                self._arrivals += 1
                self._add(cand)
                self._by_arrival.append(cand)
                self._docs.hold(rid)
                while self._ready():
                    rows.append(self._build())
                    triggers.append(i)
        out = [Emission(self._emit_rows(rows), np.array(triggers, np.int64))] if rows else []
        self._docs.release()
        return out

    def _emit_rows(self, rows: list[list[tuple[int, int, int, int]]]) -> pa.Table:
        run = self._docs.gather([p for row in rows for p in row])
        return self.emit(run, np.array([sum(p[3] for p in row) for row in rows], np.int64))

    def flush(self, *, end: bool) -> list[pa.Table]:
        cap = self.spec.max_sequences_per_bin
        rows = []
        while self._pool and (self._tokens >= self.spec.max_length or (cap is not None and len(self._pool) > cap)):
            rows.append(self._build())
        rest = sorted(self._pool, key=lambda c: c.arrival)
        if rest:
            rows.append([(c.run, c.seg, c.start, c.length) for c in rest])
        out = [self._emit_rows(rows)] if rows else []
        self._reset()
        return out

    def _live(self) -> list[_Candidate]:
        return [c for c in self._by_arrival if c.arrival not in self._taken]

    def snapshot(self) -> tuple[dict[str, Any], pa.Table | None]:
        """The arrival counter and the candidates in arrival order (documents by reference)."""
        live = self._live()
        refs = self._docs.refs([(c.run, c.seg) for c in live])
        if refs is not None:
            refs = with_state(
                refs, arrival=[c.arrival for c in live], start=[c.start for c in live], length=[c.length for c in live]
            )
        return {"arrivals": self._arrivals}, refs

    def restore(
        self, state: dict[str, Any], refs: pa.Table | None, materialize: Callable[[pa.Table], TokenRun]
    ) -> None:
        self._arrivals = int(state["arrivals"])
        if refs is None:
            return
        rid = self._docs.add(LazyRun(refs, materialize), held=refs.num_rows)  # computed when a row takes from them
        cands = [
            _Candidate(length=int(length), arrival=int(arrival), run=rid, seg=i, start=int(start))
            for i, (arrival, start, length) in enumerate(
                zip(state_column(refs, "arrival"), state_column(refs, "start"), state_column(refs, "length"))
            )
        ]
        self._by_arrival.extend(cands)  # the snapshot lists them in arrival order
        self._add_all(cands)
