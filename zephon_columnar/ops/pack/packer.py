"""The packer contract shared by every algorithm, and `LanePacker`, the lane's accumulator.

A `Packer` packs one token stream (a lane's, or one domain group's within a lane). It is fed
runs (`stream.Run`: documents already read from frames) and returns the rows it closed as
`Emission`s: an output frame plus, per row, the *trigger*: the index (in the pushed run) of the
document whose arrival closed the row. `LanePacker` reads frames, routes documents to one
packer per group (``homogeneity``), and orders rows of different groups by trigger, which is
what keeps the output independent of how documents were cut into frames.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.ops.accumulators import LaneContext
from zephon_columnar.ops.pack.emit import emit_rows
from zephon_columnar.ops.pack.spec import PackSpec
from zephon_columnar.ops.pack.stream import FrameReader, Run, gather


@dataclass
class Emission:
    """Rows a packer closed: ``frame`` (packed rows in order) and ``triggers`` (int64, one per
    row: the index in the pushed run of the document that closed it)."""

    frame: pa.Table
    triggers: np.ndarray


class Packer:
    """One stream's packing state. Subclasses implement `push` and `flush`; ``carry`` when
    they keep rows across a flush point."""

    def __init__(self, spec: PackSpec, ctx: LaneContext, emit: Callable[[Run, np.ndarray], pa.Table]) -> None:
        self.spec = spec
        self.ctx = ctx
        self.emit = emit

    def push(self, run: Run) -> list[Emission]:
        raise NotImplementedError

    def flush(self, *, end: bool) -> list[pa.Table]:
        """Emit what is held (rows in order) and become fresh, but for what `carry` returns."""
        raise NotImplementedError

    def carry(self) -> Run | None:
        return None

    def count(self, stat: str, n: int) -> None:
        self.ctx.stats[stat] = self.ctx.stats.get(stat, 0) + int(n)


class LanePacker:
    """The `LaneAccumulator` of ``pack_flat`` / ``pack_sequences``: frames -> runs -> one packer
    per group -> rows in trigger order."""

    def __init__(self, spec: PackSpec, ctx: LaneContext, make: Callable[[PackSpec, LaneContext, Any], Packer],
                 *, op: str = "pack_flat", emit: Callable[[Run, np.ndarray], pa.Table] | None = None) -> None:
        self.spec = spec
        self.ctx = ctx
        self.op = op
        self.reader = FrameReader(spec, op=op)
        self._emit = emit or (lambda run, lengths: emit_rows(spec, run, lengths, op=op))
        self._make = make
        self._packers: dict[Any, Packer] = {}
        names = ctx.component_names
        groups = spec.groups

        def group_of(component: int) -> Any:
            if spec.homogeneity == "full":
                return component
            if spec.homogeneity == "group" and groups is not None:
                return groups.group_of(names.get(component, str(component)))
            return None

        self._group_of = group_of
        self._window = _ShuffleWindow(spec, ctx) if spec.shuffle_strategy is not None else None

    def _packer(self, group: Any) -> Packer:
        packer = self._packers.get(group)
        if packer is None:
            packer = self._packers[group] = self._make(self.spec, self.ctx, self._emit)
        return packer

    # ------------------------------------------------------------------ LaneAccumulator
    def push(self, frame: pa.Table) -> list[pa.Table]:
        run = self.reader.read(frame)
        if run is None:
            return []
        if self._window is not None:
            out: list[pa.Table] = []
            for ready in self._window.push(run):
                out.extend(self._place(ready))
            return out
        return self._place(run)

    def _place(self, run: Run) -> list[pa.Table]:
        if self.spec.homogeneity == "none":
            return [e.frame for e in self._packer(None).push(run)]
        components = run.book.column(F.COMPONENT).to_numpy()[run.seg_book]
        keys = [self._group_of(int(c)) for c in components.tolist()]
        emissions: list[tuple[np.ndarray, pa.Table]] = []
        order = list(dict.fromkeys(keys))
        key_array = np.array([order.index(k) for k in keys], np.int64)
        for g, key in enumerate(order):
            mine = np.flatnonzero(key_array == g)
            sub = gather([run], np.zeros(len(mine), np.int64), mine, np.zeros(len(mine), np.int64),
                         run.seg_lengths()[mine])
            for e in self._packer(key).push(sub):
                emissions.append((mine[e.triggers], e.frame))
        if not emissions:
            return []
        if len(emissions) == 1:
            return [emissions[0][1]]
        triggers = np.concatenate([t for t, _ in emissions])
        table = F.concat_frames([f for _, f in emissions])
        return [table.take(pa.array(np.argsort(triggers, kind="stable")))]

    def flush(self, *, reset: bool, end: bool = False) -> list[pa.Table]:
        out: list[pa.Table] = []
        dropped_before = self.ctx.stats.get("pack_dropped_final_tokens", 0)
        if self._window is not None:
            for ready in self._window.flush():
                out.extend(self._place(ready))
        for key in sorted(self._packers, key=repr):  # groups in a fixed order
            out.extend(self._packers[key].flush(end=end))
        carried = any(p.carry() is not None for p in self._packers.values())
        if end or not carried:
            # A fresh lane decides its packed columns again on its next document; a lane that
            # carries rows keeps the decisions they were read with (a fresh one primed with them
            # would make the same ones).
            self.reader.reset()
            self._packers = {}
        elif reset:
            self._packers = {k: p for k, p in self._packers.items() if p.carry() is not None}
        if end:
            dropped = self.ctx.stats.get("pack_dropped_final_tokens", 0) - dropped_before
            if dropped:
                warnings.warn(f"{self.op}(algorithm='wrap') dropped the final partial row of lane {self.ctx.lane} "
                              f"({dropped} tokens, fewer than max_length={self.spec.max_length}): uncapped wrap "
                              "emits only full rows.", stacklevel=2)
        return out

    def carry(self) -> pa.Table | None:
        runs = [(k, p.carry()) for k, p in sorted(self._packers.items(), key=lambda kv: repr(kv[0]))]
        runs = [r for _, r in runs if r is not None]
        if not runs:
            return None
        return F.concat_frames([r.to_frame(self.reader.tokens or "input_ids") for r in runs])


class _ShuffleWindow:
    """``shuffle_strategy``: documents are reordered within consecutive windows of `WINDOW`
    documents counted from the flush point ('random': by a hash of the seed, lane and each
    document's identity; 'length': longest first, ties in arrival order). Windows are counted in
    documents, never in frames, so frame sizes do not change the packing."""

    WINDOW = 64

    def __init__(self, spec: PackSpec, ctx: LaneContext) -> None:
        self.spec = spec
        self.ctx = ctx
        self._held: list[Run] = []
        self._count = 0

    def push(self, run: Run) -> list[Run]:
        ready = []
        pos = 0
        n = len(run.seg_starts)
        while pos < n:
            take = min(self.WINDOW - self._count, n - pos)
            piece = run if (pos == 0 and take == n) else _segments(run, np.arange(pos, pos + take))
            self._held.append(piece)
            self._count += take
            pos += take
            if self._count == self.WINDOW:
                ready.append(self._release())
        return ready

    def flush(self) -> list[Run]:
        return [self._release()] if self._count else []

    def _release(self) -> Run:
        run = Run.concat(self._held)
        self._held, self._count = [], 0
        n = len(run.seg_starts)
        if self.spec.shuffle_strategy == "length":
            order = np.argsort(-run.seg_lengths(), kind="stable")
        else:
            book = run.book.take(pa.array(run.seg_book))
            keys = F.mix64(F.row_keys(book) ^ F.mix64(np.full(n, self.spec.shuffle_seed * 0x9E3779B1 + self.ctx.lane,
                                                                    np.uint64)))
            order = np.argsort(keys, kind="stable")
        return _segments(run, order)


def _segments(run: Run, index: np.ndarray) -> Run:
    """The whole segments ``index`` of ``run``, in that order (a copy)."""
    return gather([run], np.zeros(len(index), np.int64), index, np.zeros(len(index), np.int64),
                  run.seg_lengths()[index])
