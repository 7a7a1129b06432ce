"""What the runners whose calls run elsewhere share: `WorkerWaits` (a wait for a result that
``cancel()`` releases and ``time_limit_s`` bounds, and the message that names a call) and
`DaemonPool` (worker threads the interpreter does not wait for at exit)."""

from __future__ import annotations

import concurrent.futures as cf
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.engine.runners.base import RunnerBase
from zephon_columnar.errors import PipelineError

#: How often a wait for a worker's result wakes to see whether the iterator was closed or the
#: call ran past its time limit (a result that is ready is returned at once).
WAKE_S = 0.1
#: How long close() lets running calls finish before it leaves them behind.
CLOSE_GRACE_S = 1.0


class WorkerWaits(RunnerBase):
    """A runner whose calls run elsewhere (threads, processes, actors): ``result(future)``
    released by ``cancel()``, and bounded by ``time_limit_s`` (from when the call started) when
    one is set."""

    def _mark(self, fut: cf.Future[Any], stage: int, frame: pa.Table) -> cf.Future[Any]:
        fut.stage, fut.input = stage, frame  # type: ignore[attr-defined]  # for a timeout's message
        return fut

    def result(self, fut: cf.Future[Any]) -> pa.Table:
        while True:
            try:
                return fut.result(timeout=WAKE_S)
            except cf.TimeoutError:
                pass
            if self.cancelled.is_set():
                raise PipelineError("the pipeline iterator was closed while this call waited for a worker.")
            if self.time_limit_s is not None:
                started = getattr(fut, "started_at", None)
                if started is None and fut.running():  # a process call: from when a worker took it
                    fut.started_at = started = time.monotonic()  # type: ignore[attr-defined]
                if started is not None and time.monotonic() - started > self.time_limit_s:
                    raise self._timed_out(fut)

    def _timed_out(self, fut: cf.Future[Any]) -> PipelineError:
        stage, frame = getattr(fut, "stage", -1), getattr(fut, "input", None)
        return PipelineError(
            f"{self.describe(stage, frame)} ran for more than options(op_timeout_s="
            f"{self.time_limit_s}) seconds: stuck, or slower than the limit allows. "
            "Raise op_timeout_s if it is only slow; the call is abandoned."
        )

    def describe(self, stage: int, frame: pa.Table | None) -> str:
        """``operator(s) a -> b (stage s) on N rows of lane l, chunk c ... (first sample: ...)``."""
        names = self.stage_names[stage] if 0 <= stage < len(self.stage_names) else "?"
        where = ""
        if frame is not None and frame.num_rows:
            first = {
                n: frame.column(n)[0].as_py()
                for n in (F.LANE, F.CHUNK, F.OFFSET, F.DATASET, F.SHARD, F.ROW)
                if n in frame.column_names
            }
            where = (
                f" on {frame.num_rows} rows of lane {first.get(F.LANE)}, chunk {first.get(F.CHUNK)} from offset "
                f"{first.get(F.OFFSET)} (first sample: dataset id {first.get(F.DATASET)}, shard "
                f"{first.get(F.SHARD)}, row {first.get(F.ROW)})"
            )
        return f"operator(s) {names} (stage {stage}){where}"


class DaemonPool:
    """A fixed set of daemon worker threads taking calls from a queue. Unlike a
    ``ThreadPoolExecutor``, whose threads the interpreter joins at exit, a call that never
    returns cannot keep the process alive. Each future gets ``started_at`` when its call starts."""

    def __init__(self, workers: int, name: str) -> None:
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._shut = False
        self.threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(workers)]
        for t in self.threads:
            t.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> cf.Future[Any]:
        if self._shut:
            raise PipelineError("the pipeline iterator was closed: no more work is taken.")
        fut: cf.Future[Any] = cf.Future()
        self._calls.put((fut, fn, args))
        return fut

    def _work(self) -> None:
        while True:
            job = self._calls.get()
            if job is None:
                return
            fut, fn, args = job
            del job
            if not fut.set_running_or_notify_cancel():
                continue
            fut.started_at = time.monotonic()
            try:
                fut.set_result(fn(*args))
            except BaseException as err:  # noqa: BLE001 - delivered where the result is read
                fut.set_exception(err)
            del fut, args

    def shutdown(self, *, cancel_futures: bool) -> None:
        """Take no more calls; drop the queued ones; let each thread end after its current call."""
        self._shut = True
        if cancel_futures:
            while True:
                try:
                    job = self._calls.get_nowait()
                except queue.Empty:
                    break
                if job is not None:
                    job[0].cancel()
        for _ in self.threads:
            self._calls.put(None)

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds in all for the threads to end; whether they all did."""
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self.threads)
