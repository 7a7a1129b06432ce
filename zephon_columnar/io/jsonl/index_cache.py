"""Where line indexes are kept: an in-process LRU in front of an on-disk cache.

Contract: :func:`line_index` returns the :class:`~zephon_columnar.io.jsonl.index.LineIndex` of a
file keyed by ``(url, size, version)``, so a rewritten file gets a new index; a miss scans the
file. The disk cache lives in ``cache_root()/jsonl_index`` (atomic writes, one ``.npz`` per
file); an index that cannot be read back (absent, older layout, corrupt) is rebuilt. If the
folder cannot be written the in-process LRU is the only cache (logged once). `INDEX_CACHE` is
the process's one cache.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from zephon_columnar.io import fs
from zephon_columnar.io.jsonl.index import LineIndex, _scan_file

# The package's name, as when this was one module: a user's logging configuration for
# "zephon_columnar.io.jsonl" still names the records.
log = logging.getLogger(__package__)


_MEMORY_INDEX_BYTES = 256 << 20  # in-process LRU of line indexes (also the fallback cache)


class _IndexCache:
    """Line indexes: an in-process LRU in front of an on-disk cache (atomic writes).

    The disk cache lives in ``cache_root()/jsonl_index``; if that folder cannot be written, the
    in-process LRU is the only cache (logged once), and other processes rebuild their own.
    """

    def __init__(self, max_bytes: int = _MEMORY_INDEX_BYTES) -> None:
        self._mem: OrderedDict[str, LineIndex] = OrderedDict()
        self._mem_bytes = 0
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self._warned = False
        self.scans = 0  # how many files were actually scanned (tests assert on this)

    def clear_memory(self) -> None:
        with self._lock:
            self._mem.clear()
            self._mem_bytes = 0

    def get(self, key: str, scan: Callable[[], LineIndex]) -> LineIndex:
        """The index for ``key``; ``scan()`` builds it on a miss."""
        with self._lock:
            hit = self._mem.get(key)
            if hit is not None:
                self._mem.move_to_end(key)
                return hit
        path = self._disk_path(key)
        index = _load_index(path)
        if index is None:
            index = scan()
            with self._lock:
                self.scans += 1
            self._save(path, index)
        with self._lock:
            if key not in self._mem:
                self._mem[key] = index
                self._mem_bytes += index.nbytes
            while self._mem_bytes > self._max_bytes and len(self._mem) > 1:
                _, old = self._mem.popitem(last=False)
                self._mem_bytes -= old.nbytes
        return index

    @staticmethod
    def _disk_path(key: str) -> str:
        digest = hashlib.sha256(key.encode()).hexdigest()[:40]
        return os.path.join(fs.cache_root(), "jsonl_index", f"{digest}.npz")

    def _save(self, path: str, index: LineIndex) -> None:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            out = io.BytesIO()
            np.savez(
                out,
                offsets=index.offsets,
                blank_before=index.blank_before,
                schema=np.frombuffer(index.schema.serialize(), dtype=np.uint8),
                bad_rows=index.bad_rows,
                bad_reasons=np.array(index.bad_reasons, dtype=np.str_),
            )
            fs.atomic_write(path, out.getbuffer())
        except OSError as err:
            if not self._warned:
                self._warned = True
                log.warning(
                    "JSONL line index cache %s is not writable (%s); keeping indexes in "
                    "memory only. Set ZEPHON_COLUMNAR_CACHE to a writable folder.",
                    os.path.dirname(path),
                    err,
                )


def _load_index(path: str) -> LineIndex | None:
    try:
        with np.load(path) as z:
            offsets, blank = z["offsets"], z["blank_before"]
            # An index written before schemas (or bad rows) were cached has none: rebuild it.
            schema = pa.ipc.read_schema(pa.py_buffer(z["schema"].tobytes()))
            bad_rows, bad_reasons = z["bad_rows"], z["bad_reasons"]
    except (OSError, KeyError, ValueError):  # pa.ArrowInvalid is a ValueError
        return None  # absent or unreadable: rebuild (and rewrite) it
    if offsets.ndim != 1 or len(offsets) == 0 or offsets.dtype != np.int64 or bad_rows.dtype != np.int64:
        return None
    return LineIndex(
        offsets=offsets,
        blank_before=blank.astype(np.int64, copy=False),
        schema=schema,
        bad_rows=bad_rows,
        bad_reasons=tuple(str(r) for r in bad_reasons.tolist()),
    )


INDEX_CACHE = _IndexCache()


def _index_key(url: str, size: int, version: str) -> str:
    return f"{fs.canonical(url)}\0{size}\0{version}"


def line_index(url: str, local: str, size: int, version: str) -> LineIndex:
    """The :class:`LineIndex` of ``url`` (whose bytes are at the local path ``local``).

    Cached in memory and on disk by ``(url, size, version)``: a rewritten file gets a new index.
    A truncated or corrupt ``.gz``/``.zst`` file is a DatasetFormatError naming it, as is a field
    whose type changes within the file; a file the OS cannot read (permissions, I/O error) an
    :class:`~zephon_columnar.io.fs.UnreadableFileError`.
    """
    return INDEX_CACHE.get(_index_key(url, size, version), lambda: _scan_file(url, local))
