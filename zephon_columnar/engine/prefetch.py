"""Shard prefetch: download remote shards into the local cache ahead of fetch.

The lane sources call `ShardPrefetcher.warm` with each chunk's pointers as soon as they pull
the chunk, which is ``op_queue_capacity`` frames ahead of the fetch workers; the downloads run
on background threads. Fetch reads through the same cache, so a shard whose download is still
running is waited for, never read twice. Local shards are skipped. Prefetch never changes data.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from zephon_columnar.io import fs
from zephon_columnar.observability.stats import PrefetchTimingTotals

log = logging.getLogger(__name__)


class ShardPrefetcher:
    def __init__(self, datasets_by_id: Mapping[int, Any], *, parallelism: int, buffer_size: int) -> None:
        self._datasets = datasets_by_id
        self._parallelism = parallelism
        self.buffer_size = buffer_size
        self._seen: set[tuple[int, int]] = set()
        self._lock = threading.Lock()
        self._pool: cf.ThreadPoolExecutor | None = None
        # counters (Pipeline.prefetch_timing_snapshot)
        self.batches = self.samples = 0
        self.submitted = self.completed = self.failed = 0
        self.bytes = 0
        self.seconds = 0.0

    def warm(self, pointers: np.ndarray) -> None:
        """Start downloading the remote shards ``pointers`` (n, 3) refer to, once each."""
        if len(pointers) == 0:
            return
        with self._lock:
            self.batches += 1
            self.samples += len(pointers)
        pairs = np.unique(pointers[:, :2], axis=0)
        for d, s in pairs.tolist():
            with self._lock:
                if (d, s) in self._seen:
                    continue
                self._seen.add((d, s))
            info = self._datasets[d].shard(s)
            if info.path is None or fs.is_local(info.path):
                continue
            if self._pool is None:
                self._pool = cf.ThreadPoolExecutor(self._parallelism, thread_name_prefix="zephon-prefetch-shard")
            self.submitted += 1
            fut = self._pool.submit(self._download, info.path, info.num_bytes or None)
            fut.add_done_callback(_log_failure)

    def _download(self, url: str, size: int | None) -> str:
        cache = fs.default_shard_cache()
        before, t0 = cache.thread_counts(), time.perf_counter()
        try:
            path = fs.local_path(url, size)
        except BaseException:
            with self._lock:
                self.failed += 1
            raise
        # A shard fetch downloaded first is found in the cache: the request succeeds, but it
        # moved nothing (the bytes and seconds are the downloads' only).
        downloaded = cache.thread_counts().since(before).downloads > 0
        with self._lock:
            self.completed += 1
            if downloaded:
                self.bytes += size or 0
                self.seconds += time.perf_counter() - t0
        return path

    def timing(self) -> PrefetchTimingTotals:
        """Chunks of pointers seen (``batches``, ``samples``); shards submitted, downloaded (with
        their bytes and seconds, summed over threads), failed."""
        with self._lock:
            return PrefetchTimingTotals(
                batches=self.batches,
                samples=self.samples,
                prefetch_requests=self.submitted,
                prefetch_succeeded=self.completed,
                prefetch_failed=self.failed,
                bytes=self.bytes,
                seconds=self.seconds,
            )

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _log_failure(fut: cf.Future[str]) -> None:
    # A failed download is retried (and raised, naming the file) by the fetch that needs it.
    if not fut.cancelled() and fut.exception() is not None:
        log.debug("shard prefetch failed: %s", fut.exception())
