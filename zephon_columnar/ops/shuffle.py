"""``Pipeline.shuffle``: a deterministic shuffle buffer per lane (`ShuffleOp`).

Randomness is a pure function of ``(seed, lane, the row's identity)`` (`frame.row_keys`: chunk,
offset and lineage), never of frame boundaries, worker count or wall time, so the same rows
come out in the same order after a restart, whatever the runner. Every flush point drains the
buffer (rows never cross a flush epoch), in an order that is again a hash of their identities.

Algorithms (``buffer_size`` B, warm-up W = ``max(1, min(128, B // 16))``, 0 for B = 1):

- ``"streaming"`` (default): a reservoir of slots. The first W rows only fill it. Then, while
  it holds fewer than B rows, every other arrival adds a slot and the others each evict one
  row; once full, every arrival evicts one. An evicting arrival picks slot
  ``hash(arrival) mod (fill + 1)``: the slot's row goes out and the arrival takes its place,
  or (index ``fill``) the arrival itself goes out. Uniform over the buffer and the arrival,
  like Zephon's reservoir; defined per arrival, and computed for a whole frame at once with
  numpy (the evicted row of each arrival is the last one written to its slot before it).
- ``"block"``: tumbling blocks of B rows, each emitted sorted by a hash of its rows'
  identities (a uniform random permutation of the block).
- ``"block_warmup"``: the same with block sizes W, then growing by ``warmup_growth`` per block
  (at least one more row each) up to B; the ramp restarts at every flush point.

Example:
    >>> from zephon_columnar.frame import frame_of
    >>> acc = ShuffleOp(4, seed=1, algorithm="block").lane_accumulator()
    >>> out = acc.push(frame_of({"x": list(range(6))}))
    >>> sorted(out[0].column("x").to_pylist()), len(acc.flush(reset=True, end=True)[0])
    ([0, 1, 2, 3], 2)
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, get_args

import numpy as np
import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.errors import ConfigError
from zephon_columnar.keywords import choice
from zephon_columnar.ops.accumulators.lane import LaneContext, RowSource
from zephon_columnar.ops.base import OpTraits, OrderedOp
from zephon_columnar.ops.config import ShuffleAlgorithm as ShuffleAlgorithm
from zephon_columnar.ops.store import RowStore
from zephon_columnar.references import schema_from_json, schema_to_json

DEFAULT_BUFFER = 8192
_DRAIN_SALT = np.uint64(0xD1B54A32D192ED03)
_NO_SALT = np.uint64(0)


def warmup_size(buffer_size: int) -> int:
    """Rows a buffer of ``buffer_size`` holds before its first emission (Zephon's rule).

    Example:
        >>> [warmup_size(b) for b in (1, 2, 100, 8192)]
        [0, 1, 6, 128]
    """
    return 0 if buffer_size <= 1 else max(1, min(128, buffer_size // 16))


class ShuffleOp(OrderedOp):
    """``shuffle(buffer_size=None, *, seed=0, algorithm="streaming", warmup_growth=1.5)``; see the
    module docstring. ``parallelism`` is accepted and has no effect: the buffer is per lane and
    its work is a few vectorized numpy passes per frame."""

    name = "shuffle"

    def __init__(
        self,
        buffer_size: int | None = None,
        *,
        seed: int = 0,
        algorithm: ShuffleAlgorithm = "streaming",
        warmup_growth: float = 1.5,
        parallelism: int | None = None,
    ) -> None:
        super().__init__()
        size = DEFAULT_BUFFER if buffer_size is None else buffer_size
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
            raise ConfigError(
                f"shuffle(buffer_size={buffer_size!r}): pass a positive int (rows per lane) or None ({DEFAULT_BUFFER})."
            )
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ConfigError(f"shuffle(seed={seed!r}): pass an int >= 0.")
        choice("shuffle", "algorithm", algorithm, get_args(ShuffleAlgorithm))
        if not isinstance(warmup_growth, (int, float)) or isinstance(warmup_growth, bool) or not warmup_growth > 1:
            raise ConfigError(
                f"shuffle(warmup_growth={warmup_growth!r}): pass a number > 1 (block size growth per "
                "block, for algorithm='block_warmup')."
            )
        self.buffer_size = int(size)
        self.seed = int(seed)
        self.algorithm = algorithm
        self.warmup_growth = float(warmup_growth)
        self.parallelism = parallelism

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=False, indexable=False)

    def lane_accumulator(self, ctx: LaneContext | None = None) -> ShuffleBuffer:
        ctx = ctx or LaneContext()
        if self.algorithm == "streaming":
            return StreamingShuffle(self, ctx)
        return BlockShuffle(self, ctx)

    def fingerprint(self) -> dict[str, Any]:
        return {
            "op": self.name,
            "buffer_size": self.buffer_size,
            "seed": self.seed,
            "algorithm": self.algorithm,
            "warmup_growth": self.warmup_growth if self.algorithm == "block_warmup" else None,
        }


class ShuffleBuffer(ABC):
    """What both algorithms share: the rows held (a `RowStore`) and the lane's hash seed."""

    def __init__(self, op: ShuffleOp, ctx: LaneContext) -> None:
        self.size = op.buffer_size
        self.warmup = warmup_size(op.buffer_size)
        self.growth = op.warmup_growth
        self.ramp = op.algorithm == "block_warmup"
        self.lane = ctx.lane
        with np.errstate(over="ignore"):
            self.key_seed = F.mix64(np.uint64(op.seed) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(ctx.lane + 1))
        self.store = RowStore()
        self._reset()

    def _reset(self) -> None:
        self.store.clear()

    def keys(self, frame: pa.Table, salt: np.uint64 = _NO_SALT) -> np.ndarray:
        """Per row, a 64-bit hash of (seed, lane, row identity, salt)."""
        return F.mix64(F.row_keys(frame) ^ self.key_seed ^ salt)

    def permuted(self, handles: np.ndarray, salt: np.uint64 = _NO_SALT) -> pa.Table:
        """The rows of ``handles`` sorted by their keys: the keys come from the rows' bookkeeping
        alone, so the payload is gathered once, already in order."""
        order = np.argsort(self.keys(self.store.refs(handles), salt), kind="stable")
        return self.store.take(handles[order])

    def emit(self, handles: np.ndarray) -> list[pa.Table]:
        if not len(handles):
            return []
        out = self.store.take(handles)
        self.store.release(handles)
        return [out]

    @abstractmethod
    def push(self, frame: pa.Table) -> list[pa.Table]: ...

    @abstractmethod
    def flush(self, *, reset: bool, end: bool = False) -> list[pa.Table]: ...

    def carry(self) -> pa.Table | None:
        return None

    # ------------------------------------------------------------------ checkpoints (by reference)
    def rebuild(self, refs: pa.Table, schema: pa.Schema | None, source: RowSource) -> pa.Table:
        """Rows this stage emitted, from their references: shuffling does not change rows."""
        return source(refs, schema)


class StreamingShuffle(ShuffleBuffer):
    """``algorithm="streaming"`` (see the module docstring)."""

    def _reset(self) -> None:
        super()._reset()
        self.slots = np.zeros(0, np.int64)  # handle held in each slot
        self.arrivals = 0  # rows pushed since the flush point

    def push(self, frame: pa.Table) -> list[pa.Table]:
        n = frame.num_rows
        if n == 0:
            return []
        if self.size == 1:
            return [frame]
        handles = self.store.add(frame)
        W, B = self.warmup, self.size
        i = self.arrivals + np.arange(n, dtype=np.int64)
        self.arrivals += n
        j = i - W
        growth_end = 2 * (B - W)
        fill = np.where(j < 0, i, np.minimum(W + np.maximum(j, 0) // 2, B))  # slots filled before arrival i
        append = (j < 0) | ((j < growth_end) & (j % 2 == 1))
        replace = ~append
        victim = (self.keys(frame) % (fill + 1).astype(np.uint64)).astype(np.int64)
        evicts = replace & (victim < fill)  # the arrival takes a slot and a held row goes out
        # Writes (slot, step): appends at slot `fill`, evictions at their victim slot.
        w_step = np.flatnonzero(append | evicts)
        w_slot = np.where(append, fill, victim)[w_step]
        r_step = np.flatnonzero(evicts)
        r_slot = victim[r_step]
        # Each read gets the last write to its slot before it: sort (slot, step, read before write).
        ev_slot = np.concatenate([r_slot, w_slot])
        ev_key = np.concatenate([r_step * 2, w_step * 2 + 1])
        is_write = np.concatenate([np.zeros(len(r_step), bool), np.ones(len(w_step), bool)])
        ev_step = np.concatenate([r_step, w_step])
        order = np.lexsort((ev_key, ev_slot))
        s_slot, s_write, s_step = ev_slot[order], is_write[order], ev_step[order]
        pos = np.arange(len(order))
        last_write = np.maximum.accumulate(np.where(s_write, pos, -1)) if len(order) else pos
        prev = np.full(len(order), -1, np.int64)
        prev[1:] = last_write[:-1]
        same = prev >= 0
        same[same] = s_slot[prev[same]] == s_slot[same]
        reads = ~s_write
        from_frame = reads & same
        evicted = np.empty(len(order), np.int64)
        evicted[from_frame] = handles[s_step[prev[from_frame]]]
        initial = reads & ~same
        evicted[initial] = self.slots[s_slot[initial]]
        out_handle = np.empty(n, np.int64)
        out_handle[replace & ~evicts] = handles[replace & ~evicts]  # the arrival passes through
        out_handle[s_step[reads]] = evicted[reads]
        # New slot contents: the last write to each slot.
        new_fill = int(fill[-1]) + int(append[-1])
        slots = np.empty(new_fill, np.int64)
        slots[: len(self.slots)] = self.slots
        last = np.flatnonzero(s_write & np.append(s_slot[1:] != s_slot[:-1], True)) if len(order) else pos
        slots[s_slot[last]] = handles[s_step[last]]
        self.slots = slots
        return self.emit(out_handle[replace])

    def flush(self, *, reset: bool, end: bool = False) -> list[pa.Table]:
        out = [self.permuted(self.slots, _DRAIN_SALT)] if len(self.slots) else []
        self._reset()
        return out

    def snapshot(self) -> tuple[dict[str, Any], pa.Table | None]:
        """``arrivals`` and the rows in the slots (by reference, in slot order)."""
        if not len(self.slots):
            return {"arrivals": self.arrivals}, None
        schema = schema_to_json(self.store.payload_schema())
        return {"arrivals": self.arrivals, "schema": schema}, self.store.refs(self.slots)

    def filled_after(self, arrivals: int) -> int:
        """Slots holding a row after ``arrivals`` rows since the flush point (every arrival
        appends during the warm-up, every other one while the buffer grows to its size)."""
        if arrivals <= self.warmup:
            return arrivals
        return self.warmup + min(arrivals - self.warmup, 2 * (self.size - self.warmup)) // 2

    def restore(self, state: dict[str, Any], rows: pa.Table | None, source: RowSource) -> None:
        arrivals = state["arrivals"]
        held = 0 if rows is None else rows.num_rows
        if (
            isinstance(arrivals, bool)
            or not isinstance(arrivals, int)
            or arrivals < 0
            or self.filled_after(arrivals) != held
        ):
            raise ValueError(
                f"arrivals = {arrivals!r} with {held} rows held: a streaming shuffle of size {self.size} "
                "holds another number of rows after that many arrivals"
            )
        self.arrivals = arrivals
        self.slots = self.store.restore(rows, schema_from_json(state.get("schema")), source)


class BlockShuffle(ShuffleBuffer):
    """``algorithm="block"`` and ``"block_warmup"`` (see the module docstring)."""

    def _reset(self) -> None:
        super()._reset()
        self.held = np.zeros(0, np.int64)
        self.target = min(self.size, max(1, self.warmup)) if self.ramp else self.size

    def _next_target(self) -> None:
        if self.ramp:
            self.target = min(self.size, max(self.target + 1, math.ceil(self.target * self.growth)))

    def _permuted(self, handles: np.ndarray) -> list[pa.Table]:
        block = self.permuted(handles)
        self.store.release(handles)
        return [block]

    def push(self, frame: pa.Table) -> list[pa.Table]:
        if frame.num_rows == 0:
            return []
        held = np.concatenate([self.held, self.store.add(frame)])
        out = []
        while len(held) >= self.target:
            block, held = held[: self.target], held[self.target :]
            out += self._permuted(block)
            self._next_target()
        self.held = held
        return out

    def flush(self, *, reset: bool, end: bool = False) -> list[pa.Table]:
        out = self._permuted(self.held) if len(self.held) else []
        self._reset()
        return out

    def snapshot(self) -> tuple[dict[str, Any], pa.Table | None]:
        """The current block size and the rows of the open block (by reference)."""
        if not len(self.held):
            return {"target": self.target}, None
        schema = schema_to_json(self.store.payload_schema())
        return {"target": self.target, "schema": schema}, self.store.refs(self.held)

    def restore(self, state: dict[str, Any], rows: pa.Table | None, source: RowSource) -> None:
        target = state["target"]
        held = 0 if rows is None else rows.num_rows
        if isinstance(target, bool) or not isinstance(target, int) or not held < target <= self.size:
            raise ValueError(
                f"target = {target!r} with {held} rows held: a block of this shuffle holds fewer rows "
                f"than its target, which is at most {self.size}"
            )
        self.target = target
        self.held = self.store.restore(rows, schema_from_json(state.get("schema")), source)
