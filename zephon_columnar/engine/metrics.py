"""Execution tracking: per-operator and per-stage counters of one pass, collected only when
``options(execution_tracking=...)`` (``Pipeline.enable_observability``) is on.

Off, nothing here runs: every hook checks for a `Metrics` object that does not exist. On:

- each operator of a parallel stage: calls, rows and bytes in and out, seconds processing
  (in the worker that ran it; process workers send their counts back with each frame);
- each stage: seconds the lane waited for its results, frames in flight (now and at most);
- each ordered stage (shuffle, packing, ...): rows in and out, seconds in its accumulator;
- each shard fetch read (its *fetch groups*, `FetchOp.take_group_counts`): rows, seconds, and
  the shard cache's hits, downloads and retries, summed per (stage, dataset, shard).

Example:
    >>> m = Metrics()
    >>> m.add_op((0, 0, "fetch"), calls=1, rows_in=4, rows_out=4, bytes_in=0, bytes_out=64, busy_s=0.5)
    >>> [(r["op"], r["rows_out"], r["busy_s"]) for r in m.records()]
    [('fetch', 4, 0.5)]
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from zephon_columnar.ops.fetch import FETCH_GROUP, FetchOp

OpKey = tuple[Any, ...]  # (stage index, op index, op name) or ("ordered", position, op name)
_FIELDS = ("calls", "rows_in", "rows_out", "bytes_in", "bytes_out", "busy_s")


class Metrics:
    """Counters of one pass; thread-safe; mergeable (a process worker's deltas)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ops: dict[OpKey, dict[str, float]] = {}
        self._waits: dict[int, float] = defaultdict(float)
        self._in_flight: dict[tuple[int, int], int] = {}  # (stage, lane) -> frames now
        self._max_in_flight: dict[int, int] = defaultdict(int)
        self._fetch_groups: dict[tuple[int, int, int], dict[str, float]] = {}

    def add_op(self, key: OpKey, **counts: float) -> None:
        """Add ``counts`` to an operator's row, or, for a ``(FETCH_GROUP, stage, dataset, shard)``
        key, to that shard's fetch groups."""
        with self._lock:
            if key[0] == FETCH_GROUP:
                _add(self._fetch_groups.setdefault(key[1:], {}), counts)
            else:
                _add(self._ops.setdefault(key, dict.fromkeys(_FIELDS, 0)), counts)

    def merge(self, deltas: dict[OpKey, dict[str, float]]) -> None:
        for key, counts in deltas.items():
            self.add_op(tuple(key), **counts)

    def waited(self, stage: int, seconds: float) -> None:
        with self._lock:
            self._waits[stage] += seconds

    def in_flight(self, stage: int, lane: int, frames: int) -> None:
        with self._lock:
            self._in_flight[(stage, lane)] = frames
            self._max_in_flight[stage] = max(self._max_in_flight[stage], frames)

    def records(self) -> list[dict[str, Any]]:
        """One record per operator (counters), then one per stage (waits, frames in flight)."""
        with self._lock:
            out = [
                {"stage": key[0], "index": key[1], "op": key[2], **{k: row[k] for k in _FIELDS}}
                for key, row in sorted(self._ops.items(), key=lambda kv: (str(kv[0][0]), kv[0][1]))
            ]
            stages = sorted(set(self._waits) | set(self._max_in_flight))
            out += [
                {
                    "stage": s,
                    "wait_s": self._waits.get(s, 0.0),
                    "in_flight": sum(n for (st, _), n in self._in_flight.items() if st == s),
                    "max_in_flight": self._max_in_flight.get(s, 0),
                }
                for s in stages
            ]
            return out

    def fetch_groups(self) -> dict[tuple[int, int, int], dict[str, float]]:
        """``{(stage, dataset_id, shard_id): summed counts}`` of the fetch groups read so far."""
        with self._lock:
            return {key: dict(counts) for key, counts in self._fetch_groups.items()}

    def in_flight_by_stage(self) -> dict[int, dict[int, int]]:
        with self._lock:
            out: dict[int, dict[int, int]] = defaultdict(dict)
            for (stage, lane), n in self._in_flight.items():
                out[stage][lane] = n
            return dict(out)


def run_tracked(
    ops: Sequence[Any],
    frame: pa.Table,
    stage: int,
    run_op: Callable[[Any, pa.Table], pa.Table],
    sink: Callable[..., None],
) -> pa.Table:
    """``run_op`` each operator of a stage on ``frame``, reporting its counts to ``sink``."""
    for i, op in enumerate(ops):
        rows_in, bytes_in = frame.num_rows, frame.nbytes
        t0 = time.perf_counter()
        frame = run_op(op, frame)
        sink(
            (stage, i, op.op_name()),
            calls=1,
            rows_in=rows_in,
            rows_out=frame.num_rows,
            bytes_in=bytes_in,
            bytes_out=frame.nbytes,
            busy_s=time.perf_counter() - t0,
        )
        if isinstance(op, FetchOp):
            for key, counts in op.take_group_counts():
                sink(key, **counts)
    return frame


def _add(row: dict[str, float], counts: dict[str, float]) -> None:
    for k, v in counts.items():
        row[k] = row.get(k, 0) + v


class DeltaSink:
    """A process worker's counts since its last frame (sent back with the frame's result)."""

    def __init__(self) -> None:
        self.deltas: dict[OpKey, dict[str, float]] = {}

    def __call__(self, key: OpKey, **counts: float) -> None:
        _add(self.deltas.setdefault(key, {}), counts)

    def take(self) -> dict[OpKey, dict[str, float]]:
        out, self.deltas = self.deltas, {}
        return out
