"""A bounded single-producer, single-consumer hand-off between the prefetch thread and the caller.

`queue.Queue` wakes the other side on every item; in a tight training loop that costs more
than producing a batch. Here items pass through a deque (atomic append/popleft) and a side
sleeps only when it must: the consumer when the channel is empty, the producer when it is full,
and the producer is woken once the consumer drained it to half, not after every item.
Every wait has a short timeout, so a stop request or a dead peer is noticed promptly.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

_POLL_S = 0.05


class Channel:
    def __init__(self, capacity: int) -> None:
        self._items: deque[Any] = deque()
        self._capacity = max(1, capacity)
        self._low = self._capacity // 2
        self._cond = threading.Condition()
        self._producer_waiting = False
        self._consumer_waiting = False

    def put(self, item: Any, stopped: Callable[[], bool]) -> bool:
        """Append ``item``, waiting while the channel is full. False if stopped meanwhile."""
        if len(self._items) >= self._capacity:
            with self._cond:
                self._producer_waiting = True
                while len(self._items) > self._low:
                    if stopped():
                        self._producer_waiting = False
                        return False
                    self._cond.wait(_POLL_S)
                self._producer_waiting = False
        self._items.append(item)
        if self._consumer_waiting:
            with self._cond:
                self._cond.notify()
        return True

    def get(self, alive: Callable[[], bool]) -> Any:
        """Pop the next item, waiting while the channel is empty; raises if the producer died."""
        try:
            item = self._items.popleft()
        except IndexError:
            with self._cond:
                self._consumer_waiting = True
                while not self._items:
                    if not alive() and not self._items:
                        self._consumer_waiting = False
                        raise RuntimeError("prefetch thread ended without a result") from None
                    self._cond.wait(_POLL_S)
                self._consumer_waiting = False
            item = self._items.popleft()
        if self._producer_waiting and len(self._items) <= self._low:
            with self._cond:
                self._cond.notify()
        return item

    def snapshot(self) -> list[Any]:
        """The items queued now, oldest first (a copy; the producer may append meanwhile)."""
        return list(self._items)

    def clear(self) -> list[Any]:
        """Remove every queued item (waking a producer waiting for room); the items removed,
        oldest first."""
        removed = []
        while True:
            try:
                removed.append(self._items.popleft())
            except IndexError:
                break
        with self._cond:
            self._cond.notify_all()
        return removed
