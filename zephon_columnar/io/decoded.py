"""`DecodedCache`: decoded shard data (Parquet row groups, compressed JSON Lines files, Vortex
files decoded whole) kept in memory, one cache for every reader of a process, so that memory is
bounded by one setting whatever the number of datasets.

A reader keeps what it decoded for the takes that follow (a scan sliced finer than a row group,
rows of one group asked for by two chunks). With a reader per dataset and a budget per reader,
a mixture of 1,000 datasets held 1,000 budgets' worth (at least one group each); here every
reader's entries share ``limit_bytes`` (`configure_decoded_cache`, ``options(decoded_cache_bytes=)``),
evicted least recently used first across readers, and each reader also keeps to its own
``owner_limit`` (its read-ahead window fits in it). What a take is using is never evicted from
under it: a take holds its tables, and the entry just put always stays.

Entries are keyed ``(owner, ...)`` with ``owner`` a token from `new_owner`; `release` drops an
owner's entries (a reader closing). Thread-safe: the readers of a process run on many threads.

Example:
    >>> cache = DecodedCache(limit_bytes=100)
    >>> a, b = new_owner(), new_owner()
    >>> cache.put((a, 0, 0), "group a0", 60, owner_limit=100)
    >>> cache.put((b, 0, 0), "group b0", 60, owner_limit=100)  # 120 > 100: a's older entry goes
    >>> cache.get((a, 0, 0)), cache.get((b, 0, 0)), cache.held_bytes
    (None, 'group b0', 60)
    >>> cache.release(b); cache.held_bytes
    0
"""

from __future__ import annotations

import itertools
import os
import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

DEFAULT_LIMIT_BYTES = 256 << 20
"""The process-wide default: decoded data of every dataset a process reads, together."""

_owners = itertools.count(1)


def new_owner() -> int:
    """A token naming one reader's entries (unique in this process)."""
    return next(_owners)


class DecodedCache:
    """An LRU of decoded values shared by the readers of a process (see the module docstring).

    ``limit_bytes`` bounds the sum of the entries' sizes (as the caller states them); an entry
    larger than the limit is kept alone until the next ``put``.
    """

    def __init__(self, limit_bytes: int = DEFAULT_LIMIT_BYTES) -> None:
        self.limit_bytes = int(limit_bytes)
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[Hashable, ...], tuple[Any, int]] = OrderedDict()
        self._by_owner: dict[Hashable, OrderedDict[tuple[Hashable, ...], None]] = {}
        self._owner_bytes: dict[Hashable, int] = {}
        self.held_bytes = 0
        self.evictions = 0

    def get(self, key: tuple[Hashable, ...]) -> Any | None:
        """The value kept under ``key`` (now the most recently used), or None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            self._by_owner[key[0]].move_to_end(key)
            return entry[0]

    def __contains__(self, key: tuple[Hashable, ...]) -> bool:
        with self._lock:
            return key in self._entries

    def put(self, key: tuple[Hashable, ...], value: Any, nbytes: int, *, owner_limit: int) -> None:
        """Keep ``value`` (``nbytes`` big) under ``key``; then evict the owner's oldest entries
        past ``owner_limit`` and everyone's oldest past ``limit_bytes``, never ``key`` itself
        (the newest entry: the oldest only when it is the last one left, which stays)."""
        owner = key[0]
        with self._lock:
            if key in self._entries:
                self._forget(key)
            self._entries[key] = (value, nbytes)
            self._by_owner.setdefault(owner, OrderedDict())[key] = None
            self._owner_bytes[owner] = self._owner_bytes.get(owner, 0) + nbytes
            self.held_bytes += nbytes
            mine = self._by_owner[owner]
            while self._owner_bytes[owner] > owner_limit and len(mine) > 1:
                self._forget(next(iter(mine)))
            while self.held_bytes > self.limit_bytes and len(self._entries) > 1:
                self._forget(next(iter(self._entries)))

    def fair_share(self) -> int:
        """The limit divided among the owners holding entries now (the whole limit for one):
        what one reader can read ahead without pushing out what the others hold."""
        with self._lock:
            return self.limit_bytes // max(1, len(self._by_owner))

    def held_by(self, owner: Hashable) -> tuple[int, int]:
        """``(entries, bytes)`` that ``owner`` has in the cache now."""
        with self._lock:
            return len(self._by_owner.get(owner, ())), self._owner_bytes.get(owner, 0)

    def release(self, owner: Hashable) -> None:
        """Drop every entry of ``owner``."""
        with self._lock:
            for key in list(self._by_owner.get(owner, ())):
                self._forget(key, evicted=False)

    def _forget(self, key: tuple[Hashable, ...], *, evicted: bool = True) -> None:
        _, nbytes = self._entries.pop(key)
        owner = key[0]
        mine = self._by_owner[owner]
        del mine[key]
        self._owner_bytes[owner] -= nbytes
        if not mine:
            del self._by_owner[owner], self._owner_bytes[owner]
        self.held_bytes -= nbytes
        self.evictions += evicted


_default: DecodedCache | None = None
_default_guard = threading.Lock()


def decoded_cache() -> DecodedCache:
    """This process's cache (made on first use, with `DEFAULT_LIMIT_BYTES`)."""
    global _default
    with _default_guard:
        if _default is None:
            _default = DecodedCache()
        return _default


def _forget_after_fork() -> None:
    """A forked child starts with an empty cache of the same limit: the parent's entries are its
    readers', and a lock held by a parent's thread at the fork would never be released here."""
    global _default, _default_guard
    _default_guard = threading.Lock()
    if _default is not None:
        _default = DecodedCache(_default.limit_bytes)


os.register_at_fork(after_in_child=_forget_after_fork)


def configure_decoded_cache(limit_bytes: int) -> None:
    """Set this process's limit (what is kept is evicted down to it at the next ``put``)."""
    if int(limit_bytes) < 0:
        raise ValueError(f"decoded_cache_bytes={limit_bytes}: give a size in bytes >= 0 (0: keep only what is in use).")
    decoded_cache().limit_bytes = int(limit_bytes)
