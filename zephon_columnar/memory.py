"""Where the engine's large transient buffers come from.

Decoded row groups and packed ``positions`` are megabytes each, allocated and freed many times
a pass, often on different threads (a worker decodes, the consumer frees). `buffer_pool` picks
the Arrow memory pool for them: jemalloc where pyarrow has it, unless the user chose a pool with
``ARROW_DEFAULT_MEMORY_POOL`` (then Arrow's default pool, so that choice holds everywhere).

Why not Arrow's default (mimalloc on Linux): it returned such freed buffers to the OS, so the
next one faulted in and zeroed fresh pages. On the 2-vCPU benchmark VM a third of the decoding
thread's time went to zeroing pages, and the pre-tokenized pack pass took 97-276 ms (median 213)
instead of 97-117 ms (median 104) with jemalloc, which keeps freed pages for reuse
(benchmarks/RESULTS.md, "Issue 3").

Example:
    >>> import pyarrow as pa
    >>> buf = pa.allocate_buffer(1 << 20, memory_pool=buffer_pool())
"""

from __future__ import annotations

import os
from typing import Any

import pyarrow as pa

_UNSET: Any = object()
_POOL: Any = _UNSET


def buffer_pool() -> pa.MemoryPool | None:
    """The pool for large transient buffers, or None for Arrow's default pool."""
    global _POOL
    if _POOL is _UNSET:
        pool = None
        if not os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
            try:
                pool = pa.jemalloc_memory_pool()
            except (NotImplementedError, AttributeError):  # a pyarrow built without jemalloc
                pool = None
        _POOL = pool
    return _POOL
