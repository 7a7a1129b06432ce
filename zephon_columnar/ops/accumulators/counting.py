"""`CountingAccumulator`: calls of ``max_batch`` records, per lane.

Example:
    >>> from zephon_columnar.records import SampleMeta, SampleRecord
    >>> recs = [SampleRecord(SampleMeta(sample_id=(0, 0, i), lane_id=i % 2, chunk_id=0), {}) for i in range(5)]
    >>> acc = CountingAccumulator(max_batch=2)
    >>> [[r.meta.sample_id[2] for r in batch] for batch, _ in acc.push_many(recs)]
    [[0, 2], [1, 3]]
    >>> [[r.meta.sample_id[2] for r in batch] for batch, _ in acc.flush()]
    [[4]]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from zephon_columnar.ops.accumulators.base import Accumulator, ReadyBatch

T = TypeVar("T")


def lane_of(elem: Any) -> int:
    """The lane of a record (``elem.meta.lane_id``), or of Zephon's ``EngineSample`` tuple
    ``(sample_id, lane_id, chunk_id, offset, component_id)``."""
    return int(elem[1]) if isinstance(elem, tuple) else int(elem.meta.lane_id)


class CountingAccumulator(Accumulator[T]):
    """Per-lane buffers emitted every ``max_batch`` elements: a batch never mixes lanes.

    ``max_latency_ms`` is accepted for Zephon's signature and never cuts a group: Zephon emits a
    buffer that waited that long, which makes calls depend on timing; this engine is always
    deterministic, so groups are cut by count only. ``drop_last``: ``flush`` discards partial
    buffers instead of emitting them.
    """

    def __init__(self, max_batch: int, max_latency_ms: int | None = None, *, drop_last: bool = False) -> None:
        if max_batch <= 0:
            raise ValueError(f"CountingAccumulator: max_batch must be positive, got {max_batch}.")
        self.max_batch = max_batch
        self.max_latency_ms = max_latency_ms
        self.drop_last = drop_last
        self._buffers: dict[int, list[T]] = {}

    def has_pending_data(self, lane_id: int | None = None) -> bool:
        if lane_id is None:
            return any(self._buffers.values())
        return bool(self._buffers.get(lane_id))

    def push_many(self, elems: Sequence[T]) -> list[ReadyBatch[T]]:
        ready: list[ReadyBatch[T]] = []
        for elem in elems:
            lane = lane_of(elem)
            buf = self._buffers.setdefault(lane, [])
            buf.append(elem)
            if len(buf) >= self.max_batch:
                ready.append((buf, 0))
                self._buffers[lane] = []
        return ready

    def flush(self, *, reset: bool = False, lane_id: int | None = None) -> list[ReadyBatch[T]]:
        lanes = list(self._buffers) if lane_id is None else [lane_id]
        ready: list[ReadyBatch[T]] = []
        for lane in lanes:
            buf = self._buffers.pop(lane, None)
            if buf and not self.drop_last:
                ready.append((buf, 0))
        return ready


__all__ = ["CountingAccumulator"]
