"""`PassthroughAccumulator`: each incoming micro-batch is one call, unbuffered.

Example:
    >>> PassthroughAccumulator().push_many([1, 2, 3])
    [([1, 2, 3], 0)]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from zephon_columnar.ops.accumulators.base import Accumulator, ReadyBatch

T = TypeVar("T")


class PassthroughAccumulator(Accumulator[T]):
    """The default of stateless operators: calls keep the upstream batching."""

    def push_many(self, elems: Sequence[T]) -> list[ReadyBatch[T]]:
        return [(list(elems), 0)] if elems else []

    def flush(self, *, reset: bool = False, lane_id: int | None = None) -> list[ReadyBatch[T]]:
        return []


__all__ = ["PassthroughAccumulator"]
