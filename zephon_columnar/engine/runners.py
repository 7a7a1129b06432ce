"""Runners: where the stateless stages run, and the ordered map that re-sequences them.

A runner executes ``stage_index, frame -> frame`` for the parallel stages of a plan:

- ``inline``: in the calling thread, nothing in the background;
- ``threads``: a thread pool; each worker thread has its own deep copy of the operators,
  set up once (Arrow, Polars and tokenizers release the GIL in their kernels);
- ``process``: spawned worker processes holding cloudpickled operators; frames cross as
  Arrow IPC streams (no pickled rows).

The lanes submit frames ahead and read results in submission order (`engine.lane.ParallelStep`),
which is what makes the output independent of which worker finished first. They read them
through ``runner.result(future)``: on the threads and process runners that wait wakes every
0.1 s, so ``close()`` from another thread releases it, and ``options(op_timeout_s=...)`` turns
a call that never returns into an error naming its operators and first sample. Worker threads
are daemons and ``close()`` gives running calls a second, then leaves a stuck one behind; it
terminates the worker processes when a call is still running: a user function that never
returns cannot keep the process from exiting.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import queue
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import cloudpickle
import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.engine.children import die_with_parent, main_module_hidden, worker_environment
from zephon_columnar.engine.metrics import DeltaSink, Metrics, run_tracked
from zephon_columnar.errors import PipelineError, WrongTypeError, ZephonError, operator_failure, warn
from zephon_columnar.ops.base import BaseOp, OpContext, StageInfo


def setup_stages(stages: Sequence[Sequence[BaseOp]], services: dict[str, Any]) -> list[list[BaseOp]]:
    copies = []
    for si, ops in enumerate(stages):
        row = []
        for oi, op in enumerate(ops):
            clone = op.clone()
            clone.setup(
                OpContext(
                    services=services,
                    stage_info=StageInfo(
                        stage_index=si,
                        op_index=oi,
                        stage_name=op.op_name(),
                        collect_stats=bool(services.get("collect_stats")),
                    ),
                )
            )
            row.append(clone)
        copies.append(row)
    return copies


def _run_op(op: BaseOp, frame: pa.Table) -> pa.Table:
    try:
        out = op.process_frame(frame)
    except ZephonError:
        raise
    except Exception as err:
        where = ""
        if frame.num_rows and F.LANE in frame.column_names:
            where = (
                f" (lane {frame.column(F.LANE)[0].as_py()}, chunk {frame.column(F.CHUNK)[0].as_py()}, "
                f"{frame.num_rows} rows)"
            )
        raise operator_failure(err, f"operator {op.op_name()!r} failed{where}: {type(err).__name__}: {err}") from err
    if not isinstance(out, pa.Table):
        raise WrongTypeError(
            f"operator {op.op_name()!r}: process_frame returned {type(out).__name__}, not a pyarrow.Table"
        )
    if out.num_rows > frame.num_rows and (emits := op.traits().emits) != "any":
        # Checkpoints trust the declaration (they resume by input position): a wrong one must not pass.
        raise PipelineError(
            f"operator {op.op_name()!r} declares emits={emits!r} (OpTraits) but made "
            f"{out.num_rows} rows of {frame.num_rows}; declare emits='any' if a row may become several."
        )
    return out


def run_stage(
    ops: Sequence[BaseOp], frame: pa.Table, stage: int = -1, sink: Callable[..., None] | None = None
) -> pa.Table:
    """The operators of a stage on ``frame``; with ``sink`` (execution tracking), each one's
    counts are reported to it."""
    if sink is not None:
        return run_tracked(ops, frame, stage, _run_op, sink)
    for op in ops:
        frame = _run_op(op, frame)
    return frame


#: How often a wait for a worker's result wakes to see whether the iterator was closed or the
#: call ran past its time limit (a result that is ready is returned at once).
_WAKE_S = 0.1
#: How long close() lets running calls finish before it leaves them behind.
_CLOSE_GRACE_S = 1.0


class _WorkerWaits:
    """``result(future)`` for runners whose calls run elsewhere: released by ``cancel()``, and
    bounded by ``time_limit_s`` (from when the call started) when one is set."""

    def _init_waits(self, stages: Sequence[Sequence[BaseOp]], time_limit_s: float | None) -> None:
        self.cancelled = threading.Event()
        self.time_limit_s = time_limit_s
        self._stage_names = [" -> ".join(op.op_name() for op in ops) for ops in stages]

    def _mark(self, fut: cf.Future, stage: int, frame: pa.Table) -> cf.Future:
        fut.stage, fut.input = stage, frame  # type: ignore[attr-defined]  # for a timeout's message
        return fut

    def result(self, fut: cf.Future) -> pa.Table:
        while True:
            try:
                return fut.result(timeout=_WAKE_S)
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

    def _timed_out(self, fut: cf.Future) -> PipelineError:
        stage, frame = getattr(fut, "stage", -1), getattr(fut, "input", None)
        return PipelineError(
            f"{self.describe(stage, frame)} ran for more than options(op_timeout_s="
            f"{self.time_limit_s}) seconds: stuck, or slower than the limit allows. "
            "Raise op_timeout_s if it is only slow; the call is abandoned."
        )

    def describe(self, stage: int, frame: pa.Table | None) -> str:
        """``operator(s) a -> b (stage s) on N rows of lane l, chunk c ... (first sample: ...)``."""
        names = self._stage_names[stage] if 0 <= stage < len(self._stage_names) else "?"
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


class _DaemonPool:
    """A fixed set of daemon worker threads taking calls from a queue. Unlike a
    ``ThreadPoolExecutor``, whose threads the interpreter joins at exit, a call that never
    returns cannot keep the process alive. Each future gets ``started_at`` when its call starts."""

    def __init__(self, workers: int, name: str) -> None:
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._shut = False
        self.threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(workers)]
        for t in self.threads:
            t.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> cf.Future:
        if self._shut:
            raise PipelineError("the pipeline iterator was closed: no more work is taken.")
        fut: cf.Future = cf.Future()
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


class InlineRunner:
    """Runs stages in the calling thread; ``submit`` returns a finished future."""

    kind = "inline"

    def __init__(
        self,
        stages: Sequence[Sequence[BaseOp]],
        services: dict[str, Any],
        workers: int,
        metrics: Metrics | None = None,
        time_limit_s: float | None = None,
    ) -> None:
        # time_limit_s does not apply: a call here runs in the caller's own thread
        self._ops = setup_stages(stages, services)
        self.workers = 1
        self.metrics = metrics
        self._sink = metrics.add_op if metrics is not None else None

    def result(self, fut: cf.Future) -> pa.Table:
        return fut.result()

    def submit(self, stage: int, frame: pa.Table) -> cf.Future:
        fut: cf.Future = cf.Future()
        try:
            fut.set_result(run_stage(self._ops[stage], frame, stage, self._sink))
        except BaseException as err:  # noqa: BLE001 - delivered where the result is read, like other runners
            fut.set_exception(err)
        return fut

    def cancel(self) -> None:
        pass

    def close(self) -> None:
        for row in self._ops:
            for op in row:
                op.teardown()


class ThreadRunner(_WorkerWaits):
    """Daemon worker threads; each sets up its own copy of the operators once."""

    kind = "threads"

    def __init__(
        self,
        stages: Sequence[Sequence[BaseOp]],
        services: dict[str, Any],
        workers: int,
        metrics: Metrics | None = None,
        time_limit_s: float | None = None,
    ) -> None:
        self._init_waits(stages, time_limit_s)
        self.metrics = metrics
        self._sink = metrics.add_op if metrics is not None else None
        self._stages = stages
        self._services = services
        self._local = threading.local()
        self._copies: list[list[list[BaseOp]]] = []
        self._lock = threading.Lock()
        self.workers = workers
        self._pool = _DaemonPool(workers, "zephon-worker")

    def _ops(self) -> list[list[BaseOp]]:
        ops = getattr(self._local, "ops", None)
        if ops is None:
            ops = self._local.ops = setup_stages(self._stages, self._services)
            with self._lock:
                self._copies.append(ops)
        return ops

    def _call(self, stage: int, frame: pa.Table) -> pa.Table:
        return run_stage(self._ops()[stage], frame, stage, self._sink)

    def submit(self, stage: int, frame: pa.Table) -> cf.Future:
        return self._mark(self._pool.submit(self._call, stage, frame), stage, frame)

    def cancel(self) -> None:
        """Drop queued work and release a waiting caller; running calls finish."""
        self.cancelled.set()
        self._pool.shutdown(cancel_futures=True)

    def close(self) -> None:
        self.cancel()
        if not self._pool.join(_CLOSE_GRACE_S):
            stuck = [t.name for t in self._pool.threads if t.is_alive()]
            warn(
                f"closing the pipeline: worker thread(s) {stuck} still inside an operator after "
                f"{_CLOSE_GRACE_S} s are left behind (daemon threads: they do not keep the process alive); "
                "their operators are not torn down."
            )
            return
        with self._lock:
            for ops in self._copies:
                for row in ops:
                    for op in row:
                        op.teardown()
            self._copies = []


# ---------------------------------------------------------------------- process runner
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


class _WorkerFailure(Exception):
    """What a worker process sends back when an operator fails: the caller's message, and the
    original exception (cloudpickled, None if it cannot be) so the caller can re-raise it with
    its type (a dynamically made subclass would not unpickle in the parent)."""

    def __init__(self, message: str, original: bytes | None) -> None:
        super().__init__(message, original)
        self.message, self.original = message, original


def worker_failure(err: BaseException) -> BaseException:
    """What a worker process sends back for ``err`` raised by its operators (inside an
    ``except``): this library's own errors as they are (they pickle), else a `_WorkerFailure`."""
    if isinstance(err, ZephonError) and not isinstance(err, PipelineError):
        return err
    cause = err.__cause__ if isinstance(err, PipelineError) and err.__cause__ is not None else err
    try:
        original = cloudpickle.dumps(cause)
    except Exception:  # noqa: BLE001 - whatever does not pickle travels as its message alone
        original = None
    # Tracebacks do not survive pickling; keep the worker's in the message.
    return _WorkerFailure(f"{err}\n(in a worker process)\n{traceback.format_exc()}", original)


def raise_worker_failure(failure: _WorkerFailure) -> None:
    """Raise, in the caller, the error a worker's `_WorkerFailure` stands for (its original
    class when it unpickles, see `operator_failure`)."""
    original = None
    if failure.original is not None:
        try:
            original = cloudpickle.loads(failure.original)
        except Exception:  # noqa: BLE001 - an original that does not unpickle here: its message is raised
            original = None
    if original is None:
        raise PipelineError(failure.message) from None
    raise operator_failure(original, failure.message) from original


def _process_call(stage: int, ipc: bytes) -> bytes | tuple[bytes, dict]:
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


class _DecodedFuture(cf.Future):
    """Future of a process call whose IPC bytes are decoded on ``result()`` (and whose counts,
    with execution tracking, are added to ``metrics``)."""

    def __init__(self, inner: cf.Future, metrics: Metrics | None, describe: Callable[[], str]) -> None:
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
        except _WorkerFailure as failure:
            raise_worker_failure(failure)
        if isinstance(data, tuple):
            data, deltas = data
            if self._metrics is not None:
                self._metrics.merge(deltas)
        return F.frame_from_ipc(data)

    def cancel(self) -> bool:
        return self._inner.cancel()


class ProcessRunner(_WorkerWaits):
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

    kind = "process"

    def __init__(
        self,
        stages: Sequence[Sequence[BaseOp]],
        services: dict[str, Any],
        workers: int,
        metrics: Metrics | None = None,
        time_limit_s: float | None = None,
    ) -> None:
        self._init_waits(stages, time_limit_s)
        self.metrics = metrics
        self._sink = metrics.add_op if metrics is not None else None
        self._stages, self._services = stages, services
        self._driver_ops: list[list[BaseOp]] | None = None  # the driver's copies, while no worker is up
        self._driver: _DaemonPool | None = None  # the driver's thread for them
        self._up = threading.Event()
        payload = cloudpickle.dumps((list(stages), services, metrics is not None))
        self.workers = workers
        self._procs: list[Any] = []
        self._calls: set[cf.Future] = set()  # submitted to the workers, not finished
        self._pool = cf.ProcessPoolExecutor(
            max_workers=workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_process_init,
            initargs=(payload, os.getpid()),
        )
        with main_module_hidden(), worker_environment():
            for _ in range(workers):
                # done once the worker's initializer ran (or failed: the next submit then reports it)
                self._pool.submit(_ready).add_done_callback(lambda _: self._up.set())

    def submit(self, stage: int, frame: pa.Table) -> cf.Future:
        # With a time limit every call goes to a worker: the driver cannot interrupt itself.
        if not self._up.is_set() and self.time_limit_s is None:
            if self._driver is None:
                self._driver = _DaemonPool(1, "zephon-driver")
            return self._mark(self._driver.submit(self._driver_call, stage, frame), stage, frame)
        describe = lambda: self.describe(stage, frame)  # noqa: E731
        try:
            inner = self._pool.submit(_process_call, stage, F.frame_to_ipc(frame).to_pybytes())
        except cf.process.BrokenProcessPool as err:  # a worker died before this frame was sent
            raise PipelineError(_WORKER_DIED.format(where=f" before {describe()} was sent")) from err
        self._calls.add(inner)
        inner.add_done_callback(self._calls.discard)
        return self._mark(_DecodedFuture(inner, self.metrics, describe), stage, frame)

    def _driver_call(self, stage: int, frame: pa.Table) -> pa.Table:
        if self._driver_ops is None:
            self._driver_ops = setup_stages(self._stages, self._services)
        return run_stage(self._driver_ops[stage], frame, stage, self._sink)

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
        if self._driver is None or self._driver.join(_CLOSE_GRACE_S):
            for row in self._driver_ops or ():
                for op in row:
                    op.teardown()
        if any(not f.done() for f in list(self._calls)):
            for proc in self._procs:
                if proc.is_alive():
                    proc.terminate()
