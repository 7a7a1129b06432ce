"""`ReaderPool`: one shard reader per process and dataset, shared by the worker threads, for the
formats whose readers cache decoded data (`Format.shared_readers`).

Example:
    >>> pool = ReaderPool()
    >>> web, chat = Dataset.from_path("web", "data/web"), Dataset.from_path("chat", "data/chat")
    >>> pool.shared_reader(0, web) is pool.shared_reader(0, web), pool.shared_reader(1, chat)
    (True, None)
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from zephon_columnar.io.base import ShardReader
from zephon_columnar.io.dataset import Dataset


class _LockedReader:
    """A reader shared by threads: takes are serialized, so each row group is decoded once.

    Parquet decodes several row groups per call on Arrow's own threads, so serializing the
    Python side loses little parallelism, and sequential read-ahead serves every thread.
    """

    def __init__(self, reader: ShardReader) -> None:
        self._reader = reader
        self._lock = threading.Lock()

    def take(self, shard_id: int, rows: Any) -> Any:
        with self._lock:
            return self._reader.take(shard_id, rows)

    def close(self) -> None:
        # At interpreter exit (an iterator never closed, collected with the module) a daemon
        # worker thread can be frozen inside a take, holding the lock for ever: waiting for it
        # hung the exit. The process is ending; its files close with it.
        if not self._lock.acquire(blocking=not sys.is_finalizing()):
            return
        try:
            self._reader.close()
        finally:
            self._lock.release()


class ReaderPool:
    """Per-process readers shared by worker threads, for the datasets whose format says so
    (`Format.shared_readers`: Parquet row groups, memory-mapped Arrow files).

    The engine makes one pool per pass; `FetchOp` asks it first and opens a private reader
    for other formats (JSONL parsing gains from parallel readers, not from a shared cache).
    Pickling (process runner) gives each worker process an empty pool of its own.
    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._readers: dict[int, _LockedReader] = {}

    @staticmethod
    def shares(dataset: Any) -> bool:
        """Whether ``dataset``'s reader is one the pool shares (its format's `shared_readers`)."""
        return isinstance(dataset, Dataset) and dataset.format is not None and dataset.format.shared_readers

    def shared_reader(self, dataset_id: int, dataset: Dataset) -> ShardReader | None:
        if not self.shares(dataset):
            return None
        with self._lock:
            reader = self._readers.get(dataset_id)
            if reader is None:
                reader = self._readers[dataset_id] = _LockedReader(dataset.open_reader())
            return reader

    def close(self) -> None:
        with self._lock:
            for reader in self._readers.values():
                reader.close()
            self._readers.clear()

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._reset()
