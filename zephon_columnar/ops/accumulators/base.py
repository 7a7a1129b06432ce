"""Zephon's accumulator API for user operators: `Accumulator`, `ReadyBatch`, `SourceExhaustion`.

An accumulator decides how a lane's records are grouped into calls of an operator's
``process_many``; it holds all the operator's state that spans calls. The engine drives one per
lane (`zephon_columnar.ops.user`): ``push_many`` with the lane's records in stream order,
``on_source_exhausted`` when a mixture component of the lane runs out, ``flush(reset=True,
lane_id=...)`` at each flush point (after which it must be as good as new) and at the end.

A ready batch is ``(records, wait_ns)``: the records of one call, all of one lane, and how long
the first of them waited in the buffer (a metric; 0 when not measured).

Example:
    >>> class Pairs(Accumulator):
    ...     def __init__(self):
    ...         self.held = []
    ...     def push_many(self, elems):
    ...         self.held += elems
    ...         ready = [(self.held[i:i + 2], 0) for i in range(0, len(self.held) - 1, 2)]
    ...         self.held = self.held[len(ready) * 2:]
    ...         return ready
    ...     def flush(self, *, reset=False, lane_id=None):
    ...         ready, self.held = ([(self.held, 0)] if self.held else []), []
    ...         return ready
    >>> acc = Pairs()
    >>> acc.push_many([1, 2, 3]), acc.has_pending_data(), acc.flush()
    ([([1, 2], 0)], False, [([3], 0)])
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

ReadyBatch = tuple[list[T], int]
"""One call's elements and the nanoseconds the first of them waited (metrics only)."""


@dataclass(frozen=True)
class SourceExhaustion:
    """What one operator has seen of its lane's sources running out.

    ``exhausted``: the component ids whose end-of-data reached the operator. ``continuing``: those
    of them the work source goes on without (``WorkSource.continues_after_exhaustion``).
    ``final_component``: the component whose end completed the exhaustion of every component of
    the lane (None until then; buffered records may still follow).
    """

    exhausted: frozenset[int] = frozenset()
    continuing: frozenset[int] = frozenset()
    final_component: int | None = None


class Accumulator(ABC, Generic[T]):
    """Groups a lane's elements into ready batches; holds the operator's cross-call state.

    Called on one thread per lane, in stream order; ``process_many`` of each ready batch must
    be deterministic given the batch.
    """

    @abstractmethod
    def push_many(self, elems: Sequence[T]) -> list[ReadyBatch[T]]:
        """Take elements in stream order; return the batches now ready (possibly none)."""

    @abstractmethod
    def flush(self, *, reset: bool = False, lane_id: int | None = None) -> list[ReadyBatch[T]]:
        """Emit what is buffered (of ``lane_id``'s lane; all lanes when None). With
        ``reset=True`` (a flush point in mid-stream) the accumulator must afterwards behave
        exactly as a freshly constructed one."""

    @property
    def reads_payload(self) -> bool:
        """Whether ``push_many`` looks at payloads (not just metadata)."""
        return False

    def has_pending_data(self, lane_id: int | None = None) -> bool:
        """Whether ``flush`` would emit something (for ``lane_id``'s lane, or any lane)."""
        return False

    def on_source_exhausted(self, lane_id: int, component_id: int) -> list[ReadyBatch[T]]:
        """A mixture component of the lane has run out for good (at most once per component
        and lane; records of it may still be buffered upstream). Default: nothing to do."""
        return []

    def try_epoch_reset(self, boundary_chunk_id: int, lane_id: int | None = None) -> bool:
        """Reset now if the future output equals a fresh accumulator's fed only what is still
        buffered; True when it did. Default: only when nothing is buffered."""
        return not self.has_pending_data(lane_id)


__all__ = ["Accumulator", "ReadyBatch", "SourceExhaustion"]
