"""The process runner: spawned worker processes holding cloudpickled operators; frames cross
as Arrow IPC streams (no pickled rows).

Until the first worker is up the driver runs the frames itself (see `ProcessRunner`); a worker
that dies fails the call that was on it with a `PipelineError`; ``close()`` terminates the
workers when a call is still running, so a user function that never returns cannot keep the
process from exiting.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import threading
from collections.abc import Callable
from typing import Any

import cloudpickle
import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.engine.children import die_with_parent, main_module_hidden, worker_environment
from zephon_columnar.engine.metrics import DeltaSink, Metrics
from zephon_columnar.engine.runners.base import RunnerTraits
from zephon_columnar.engine.runners.failures import WorkerFailure, raise_worker_failure, worker_failure
from zephon_columnar.engine.runners.stages import run_stage, setup_stages
from zephon_columnar.engine.runners.waits import CLOSE_GRACE_S, DaemonPool, WorkerWaits
from zephon_columnar.errors import PipelineError
from zephon_columnar.ops.base import BaseOp

_WORKER_OPS: list[list[BaseOp]] | None = None
_WORKER_SINK: DeltaSink | None = None  # execution tracking: counts sent back with each frame


def _process_init(payload: bytes, parent_pid: int) -> None:
    global _WORKER_OPS, _WORKER_SINK
    die_with_parent(parent_pid)
    stages, services, track = cloudpickle.loads(payload)
    _WORKER_OPS = setup_stages(stages, services)
    _WORKER_SINK = DeltaSink() if track else None


def _ready() -> None:
    """The task that starts a worker process."""


def _process_call(stage: int, ipc: bytes) -> bytes | tuple[bytes, dict[tuple[Any, ...], dict[str, float]]]:
    assert _WORKER_OPS is not None
    try:
        out = run_stage(_WORKER_OPS[stage], F.frame_from_ipc(ipc), stage, _WORKER_SINK)
    except BaseException as err:  # noqa: BLE001 - every failure is re-raised as what the worker sends back
        raise worker_failure(err) from None
    data = F.frame_to_ipc(out).to_pybytes()
    return data if _WORKER_SINK is None else (data, _WORKER_SINK.take())


_WORKER_DIED = (
    "a worker process died (killed, crashed, os._exit, or an operator's setup() failed in it){where}; see "
    "its stderr above. Rerun with options(runner='threads') to see the error in-process."
)


class _DecodedFuture(cf.Future[Any]):
    """Future of a process call whose IPC bytes are decoded on ``result()`` (and whose counts,
    with execution tracking, are added to ``metrics``)."""

    def __init__(self, inner: cf.Future[Any], metrics: Metrics | None, describe: Callable[[], str]) -> None:
        super().__init__()
        self._inner = inner
        self._metrics = metrics
        self._describe = describe  # what the call computes, for the error if its worker dies

    def done(self) -> bool:
        return self._inner.done()

    def running(self) -> bool:
        return self._inner.running()

    def result(self, timeout: float | None = None) -> pa.Table:
        try:
            data = self._inner.result(timeout)
        except cf.process.BrokenProcessPool as err:
            raise PipelineError(_WORKER_DIED.format(where=f" while computing {self._describe()}")) from err
        except WorkerFailure as failure:
            raise_worker_failure(failure)
        if isinstance(data, tuple):
            data, deltas = data
            if self._metrics is not None:
                self._metrics.merge(deltas)
        return F.frame_from_ipc(data)

    def cancel(self) -> bool:
        return self._inner.cancel()


class ProcessRunner(WorkerWaits):
    """Spawned worker processes; operators are cloudpickled once per worker, frames cross as
    Arrow IPC.

    Every worker is started with the runner (one no-op task each: the pool spawns a process for
    each task it cannot hand to an idle one), without re-running the training script in it.
    Until the first one is up (spawn, imports, ``setup``: a few tenths of a second), the driver
    runs the frames itself, on one daemon thread of its own: stateless work gives the same rows
    wherever it runs, a short job is never slower than inline for having asked for workers, and
    the caller waits for those frames as for the workers' (``close()`` from another thread
    releases it). (Not with ``op_timeout_s``: a call the driver runs could not be interrupted.)
    """

    traits = RunnerTraits(
        name="process", place="local", computes_at_submit=False, own_readers=True, starts_processes=True
    )

    def start_workers(self) -> None:
        self._driver_ops: list[list[BaseOp]] | None = None  # the driver's copies, while no worker is up
        self._driver: DaemonPool | None = None  # the driver's thread for them
        self._up = threading.Event()
        payload = cloudpickle.dumps((list(self.stages), self.services, self.metrics is not None))
        self._procs: list[Any] = []
        self._calls: set[cf.Future[Any]] = set()  # submitted to the workers, not finished
        self._pool = cf.ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_process_init,
            initargs=(payload, os.getpid()),
        )
        with main_module_hidden(), worker_environment():
            for _ in range(self.workers):
                # done once the worker's initializer ran (or failed: the next submit then reports it)
                self._pool.submit(_ready).add_done_callback(lambda _: self._up.set())

    def submit(self, stage: int, frame: pa.Table) -> cf.Future[Any]:
        # With a time limit every call goes to a worker: the driver cannot interrupt itself.
        if not self._up.is_set() and self.time_limit_s is None:
            if self._driver is None:
                self._driver = DaemonPool(1, "zephon-driver")
            return self._mark(self._driver.submit(self._driver_call, stage, frame), stage, frame)

        def describe() -> str:
            return self.describe(stage, frame)

        try:
            inner = self._pool.submit(_process_call, stage, F.frame_to_ipc(frame).to_pybytes())
        except cf.process.BrokenProcessPool as err:  # a worker died before this frame was sent
            raise PipelineError(_WORKER_DIED.format(where=f" before {describe()} was sent")) from err
        self._calls.add(inner)
        inner.add_done_callback(self._calls.discard)
        return self._mark(_DecodedFuture(inner, self.metrics, describe), stage, frame)

    def _driver_call(self, stage: int, frame: pa.Table) -> pa.Table:
        if self._driver_ops is None:
            self._driver_ops = setup_stages(self.stages, self.services)
        return run_stage(self._driver_ops[stage], frame, stage, self.sink)

    def cancel(self) -> None:
        self.cancelled.set()
        if self._driver is not None:
            self._driver.shutdown(cancel_futures=True)
        # Keep handles on the workers: shutdown() forgets them, and close() must reap them.
        self._procs.extend((getattr(self._pool, "_processes", None) or {}).values())
        self._pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        """Tell the workers to exit and return: idle workers end within ~0.1-0.2 s (their
        interpreter's teardown, which the end of a pass need not wait for; the pool's manager
        thread reaps them). If a call is still running (its result is abandoned: the work is
        stateless), the workers are terminated instead, so one stuck in an operator neither
        outlives the pass nor holds the interpreter's exit."""
        self.cancel()
        if self._driver is None or self._driver.join(CLOSE_GRACE_S):
            for row in self._driver_ops or ():
                for op in row:
                    op.teardown()
        if any(not f.done() for f in list(self._calls)):
            for proc in self._procs:
                if proc.is_alive():
                    proc.terminate()
