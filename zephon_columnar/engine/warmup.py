"""Restore warm-up: start reading what a restored run needs first, while the pipeline is built.

A checkpoint taken by reference names the rows a lane's collector held but had not batched
yet (`LaneSnapshot.pending`): the first batch after a restore is made of the first of them
(a batch's worth is what the pipeline warms; more would only compete with the fetch). Computing them
again means reading their source samples, often scattered over several shards and row groups
(a packed row's pieces come from many documents), which a cold start never pays.
`RestoreWarmup` reads those samples in a background thread as soon as ``restore()`` is
called, into the `ReaderPool` the engine's fetch then uses: the decode (Arrow releases the GIL)
overlaps with building the engine, and with whatever the training script does between
``restore()`` and its first ``next()``. It only warms a cache: whatever it reads or fails to
read, the fetch reads (and reports errors) exactly as without it.

Example:
    >>> warm = RestoreWarmup.start({}, [])  # nothing to read: no thread
    >>> warm is None
    True
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from itertools import pairwise
from typing import Any

import numpy as np
import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.io.readers import ReaderPool


def sample_pointers(refs: pa.Table) -> np.ndarray:
    """``(dataset, shard, row)`` of the source samples rows computed from ``refs`` read: a packed
    row's pieces (``__segments``), else each row's own sample. Unique, sorted."""
    if F.SEGMENTS in refs.column_names:
        import pyarrow.compute as pc

        pieces = pc.list_flatten(refs.column(F.SEGMENTS))
        cols = [pc.struct_field(pieces, name) for name in ("dataset", "shard", "row")]
    else:
        cols = [refs.column(name) for name in (F.DATASET, F.SHARD, F.ROW)]
    if not len(cols[0]):
        return np.zeros((0, 3), np.int64)
    stacked = np.stack([np.asarray(c.to_numpy(zero_copy_only=False), np.int64) for c in cols], axis=1)
    return np.unique(stacked, axis=0)


class RestoreWarmup:
    """A background read of the samples named by restored lanes' pending rows (see the module
    docstring). ``pool`` is what the engine's fetch should read through."""

    def __init__(self, datasets_by_id: Mapping[int, Any], pointers: np.ndarray) -> None:
        self.pool = ReaderPool()
        self._datasets = datasets_by_id
        self._pointers = pointers
        self._cancelled = threading.Event()
        self._thread = threading.Thread(target=self._run, name="zephon-restore-warmup", daemon=True)

    @classmethod
    def start(cls, datasets_by_id: Mapping[int, Any], pending: Iterable[pa.Table]) -> RestoreWarmup | None:
        """A started warm-up of the samples ``pending`` (tables of row references) name, or None
        when there is nothing a shared reader would cache."""
        tables = [t for t in pending if t is not None and t.num_rows]
        if not tables:
            return None
        pointers = np.unique(np.concatenate([sample_pointers(t) for t in tables]), axis=0)
        if not any(ReaderPool.shares(datasets_by_id.get(int(d))) for d in np.unique(pointers[:, 0])):
            return None
        warm = cls(datasets_by_id, pointers)
        warm._thread.start()
        return warm

    def _run(self) -> None:
        p = self._pointers
        for start, end in _runs(p[:, :2]):
            if self._cancelled.is_set():
                return
            dataset_id, shard = int(p[start, 0]), int(p[start, 1])
            dataset = self._datasets.get(dataset_id)
            reader = self.pool.shared_reader(dataset_id, dataset) if dataset is not None else None
            if reader is None:
                continue
            try:
                reader.take(shard, p[start:end, 2])
            except Exception:  # noqa: BLE001 - the fetch reads these rows again and reports it
                return

    def cancel(self) -> None:
        """Stop reading (after the current take) and close the readers: nobody will use them."""
        self._cancelled.set()
        self.pool.close()


def _runs(keys: np.ndarray) -> list[tuple[int, int]]:
    """``[start, end)`` of each run of equal rows of the sorted ``keys``."""
    if not len(keys):
        return []
    change = np.flatnonzero(np.any(keys[1:] != keys[:-1], axis=1)) + 1
    bounds = np.concatenate(([0], change, [len(keys)])).tolist()
    return list(pairwise(bounds))
