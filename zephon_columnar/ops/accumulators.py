"""Accumulators: all state that spans rows.

Two shapes live here:

- `LaneAccumulator`, the engine's own: one instance per lane, fed that lane's frames in order
  on one thread. ``push(frame)`` returns the frames ready to go on; ``flush()`` returns what
  is buffered; after ``flush(reset=True)`` it behaves exactly like a fresh one (what makes
  replay from a flush point exact).
- `Accumulator` / `CountingAccumulator` / `PassthroughAccumulator`, Zephon's public API for
  grouping records into calls of a custom operator (``ReadyBatch = (records, lane_id)``).

Example:
    >>> acc = CountingAccumulator(max_batch=2)
    >>> [len(b) for b, _ in acc.push_many([r0, r1, r2])]  # doctest: +SKIP
    [2]
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import defaultdict
from typing import Any, Generic, Protocol, TypeVar

import pyarrow as pa

T = TypeVar("T")
ReadyBatch = tuple[list[Any], int]


class LaneAccumulator(Protocol):
    """Per-lane ordered state of a stateful operator (see module docstring)."""

    def push(self, frame: pa.Table) -> list[pa.Table]: ...

    def flush(self, *, reset: bool) -> list[pa.Table]: ...


class Accumulator(ABC, Generic[T]):
    """Zephon's accumulator API: groups upstream items into ready batches, per lane."""

    @abstractmethod
    def push_many(self, elems: list[T]) -> list[ReadyBatch]: ...

    @abstractmethod
    def flush(self, *, reset: bool = False, lane_id: int | None = None) -> list[ReadyBatch]: ...

    @abstractmethod
    def has_pending_data(self, lane_id: int | None = None) -> bool: ...

    @property
    def reads_payload(self) -> bool:
        return False

    def on_source_exhausted(self, lane_id: int, component_id: int) -> list[ReadyBatch]:
        return []

    def try_epoch_reset(self, boundary_chunk_id: int, lane_id: int | None = None) -> bool:
        return False


def _lane_of(elem: Any) -> int:
    return int(getattr(getattr(elem, "meta", None), "lane_id", 0))


class CountingAccumulator(Accumulator[T]):
    """Per-lane buffers emitted every ``max_batch`` items (a group never mixes lanes)."""

    def __init__(self, max_batch: int, max_latency_ms: float | None = None, *, drop_last: bool = False) -> None:
        if max_batch < 1:
            raise ValueError(f"CountingAccumulator: max_batch={max_batch}; use a positive count.")
        self.max_batch = max_batch
        self.max_latency_ms = max_latency_ms
        self.drop_last = drop_last
        self._buffers: dict[int, list[T]] = defaultdict(list)

    def push_many(self, elems: list[T]) -> list[ReadyBatch]:
        ready = []
        for e in elems:
            lane = _lane_of(e)
            buf = self._buffers[lane]
            buf.append(e)
            if len(buf) >= self.max_batch:
                ready.append((buf, lane))
                self._buffers[lane] = []
        return ready

    def flush(self, *, reset: bool = False, lane_id: int | None = None) -> list[ReadyBatch]:
        lanes = list(self._buffers) if lane_id is None else [lane_id]
        ready = []
        for lane in lanes:
            buf = self._buffers.pop(lane, [])
            if buf and not self.drop_last:
                ready.append((buf, lane))
        return ready

    def has_pending_data(self, lane_id: int | None = None) -> bool:
        if lane_id is None:
            return any(self._buffers.values())
        return bool(self._buffers.get(lane_id))


class PassthroughAccumulator(Accumulator[T]):
    """Each upstream micro-batch becomes one ready batch, per lane."""

    def push_many(self, elems: list[T]) -> list[ReadyBatch]:
        by_lane: dict[int, list[T]] = defaultdict(list)
        for e in elems:
            by_lane[_lane_of(e)].append(e)
        return [(v, k) for k, v in by_lane.items()]

    def flush(self, *, reset: bool = False, lane_id: int | None = None) -> list[ReadyBatch]:
        return []

    def has_pending_data(self, lane_id: int | None = None) -> bool:
        return False
