"""The threads runner: a pool of daemon worker threads, each with its own copy of the
operators, set up once (Arrow, Polars and tokenizers release the GIL in their kernels)."""

from __future__ import annotations

import concurrent.futures as cf
import threading
from typing import Any

import pyarrow as pa

from zephon_columnar.engine.runners.base import RunnerTraits
from zephon_columnar.engine.runners.stages import run_stage, setup_stages
from zephon_columnar.engine.runners.waits import CLOSE_GRACE_S, DaemonPool, WorkerWaits
from zephon_columnar.errors import warn
from zephon_columnar.ops.base import BaseOp


class ThreadRunner(WorkerWaits):
    """Daemon worker threads; each sets up its own copy of the operators once."""

    traits = RunnerTraits(
        name="threads", place="local", computes_at_submit=False, own_readers=False, starts_processes=False
    )

    def start_workers(self) -> None:
        self._local = threading.local()
        self._copies: list[list[list[BaseOp]]] = []
        self._lock = threading.Lock()
        self._pool = DaemonPool(self.workers, "zephon-worker")

    def _ops(self) -> list[list[BaseOp]]:
        ops: list[list[BaseOp]] | None = getattr(self._local, "ops", None)
        if ops is None:
            ops = self._local.ops = setup_stages(self.stages, self.services)
            with self._lock:
                self._copies.append(ops)
        return ops

    def _call(self, stage: int, frame: pa.Table) -> pa.Table:
        return run_stage(self._ops()[stage], frame, stage, self.sink)

    def submit(self, stage: int, frame: pa.Table) -> cf.Future[Any]:
        return self._mark(self._pool.submit(self._call, stage, frame), stage, frame)

    def cancel(self) -> None:
        """Drop queued work and release a waiting caller; running calls finish."""
        self.cancelled.set()
        self._pool.shutdown(cancel_futures=True)

    def close(self) -> None:
        self.cancel()
        if not self._pool.join(CLOSE_GRACE_S):
            stuck = [t.name for t in self._pool.threads if t.is_alive()]
            warn(
                f"closing the pipeline: worker thread(s) {stuck} still inside an operator after "
                f"{CLOSE_GRACE_S} s are left behind (daemon threads: they do not keep the process alive); "
                "their operators are not torn down."
            )
            return
        with self._lock:
            for ops in self._copies:
                for row in ops:
                    for op in row:
                        op.teardown()
            self._copies = []
