"""`MTPQueueStats`: occupancy of the hand-off queue between an ``mtp_mode`` side process and the
trainer (``Pipeline.mtp_queue_stats``).

Example:
    >>> MTPQueueStats(depth=2, capacity=8, staged_bytes=-1, prefetch_depth=0).capacity
    8
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MTPQueueStats:
    """``depth``: items the side process put and the consumer has not taken; ``capacity``: the
    most it holds; ``staged_bytes``: serialized bytes ready to read; ``prefetch_depth``: items
    already taken into the consumer's prefetch buffer. -1 where a value cannot be measured."""

    depth: int
    capacity: int
    staged_bytes: int
    prefetch_depth: int


__all__ = ["MTPQueueStats"]
