"""Runners: where the stateless stages run, and the ordered map that re-sequences them.

A runner executes ``stage_index, frame -> frame`` for the parallel stages of a plan:

- ``inline``: in the calling thread, nothing in the background;
- ``threads``: a thread pool; each worker thread has its own deep copy of the operators,
  set up once (Arrow, Polars and tokenizers release the GIL in their kernels);
- ``process``: spawned worker processes holding cloudpickled operators; frames cross as
  Arrow IPC streams (no pickled rows).

`ordered_map` submits frames ahead (bounded window) and yields results in submission order,
which is what makes the output independent of which worker finished first.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import threading
import traceback
from collections import deque
from typing import Any, Callable, Iterator, Sequence

import cloudpickle
import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.engine.children import main_module_hidden, worker_environment
from zephon_columnar.engine.metrics import DeltaSink, Metrics, run_tracked
from zephon_columnar.errors import WrongTypeError, PipelineError, ZephonError, operator_failure
from zephon_columnar.ops.base import BaseOp, OpContext, StageInfo


def setup_stages(stages: Sequence[Sequence[BaseOp]], services: dict[str, Any]) -> list[list[BaseOp]]:
    copies = []
    for si, ops in enumerate(stages):
        row = []
        for oi, op in enumerate(ops):
            clone = op.clone()
            clone.setup(OpContext(services=services, stage_info=StageInfo(stage_index=si, op_index=oi,
                                                                         stage_name=op.op_name())))
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
            where = (f" (lane {frame.column(F.LANE)[0].as_py()}, chunk {frame.column(F.CHUNK)[0].as_py()}, "
                     f"{frame.num_rows} rows)")
        raise operator_failure(err, f"operator {op.op_name()!r} failed{where}: {type(err).__name__}: {err}") from err
    if not isinstance(out, pa.Table):
        raise WrongTypeError(f"operator {op.op_name()!r}: process_frame returned {type(out).__name__}, "
                             "not a pyarrow.Table")
    return out


def run_stage(ops: Sequence[BaseOp], frame: pa.Table, stage: int = -1, sink: Callable[..., None] | None = None
               ) -> pa.Table:
    """The operators of a stage on ``frame``; with ``sink`` (execution tracking), each one's
    counts are reported to it."""
    if sink is not None:
        return run_tracked(ops, frame, stage, _run_op, sink)
    for op in ops:
        frame = _run_op(op, frame)
    return frame


class InlineRunner:
    """Runs stages in the calling thread; ``submit`` returns a finished future."""

    kind = "inline"

    def __init__(self, stages: Sequence[Sequence[BaseOp]], services: dict[str, Any], workers: int,
                 metrics: Metrics | None = None) -> None:
        self._ops = setup_stages(stages, services)
        self.workers = 1
        self.metrics = metrics
        self._sink = metrics.add_op if metrics is not None else None

    def submit(self, stage: int, frame: pa.Table) -> cf.Future:
        fut: cf.Future = cf.Future()
        try:
            fut.set_result(run_stage(self._ops[stage], frame, stage, self._sink))
        except BaseException as err:  # delivered where the result is read, like other runners
            fut.set_exception(err)
        return fut

    def cancel(self) -> None:
        pass

    def close(self) -> None:
        for row in self._ops:
            for op in row:
                op.teardown()


class ThreadRunner:
    """A thread pool; each worker thread sets up its own copy of the operators once."""

    kind = "threads"

    def __init__(self, stages: Sequence[Sequence[BaseOp]], services: dict[str, Any], workers: int,
                 metrics: Metrics | None = None) -> None:
        self.metrics = metrics
        self._sink = metrics.add_op if metrics is not None else None
        self._stages = stages
        self._services = services
        self._local = threading.local()
        self._copies: list[list[list[BaseOp]]] = []
        self._lock = threading.Lock()
        self.workers = workers
        self._pool = cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="zephon-worker")

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
        return self._pool.submit(self._call, stage, frame)

    def cancel(self) -> None:
        """Drop queued work so a waiting caller is released; running calls finish."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            for ops in self._copies:
                for row in ops:
                    for op in row:
                        op.teardown()
            self._copies = []


# ---------------------------------------------------------------------- process runner
_WORKER_OPS: list[list[BaseOp]] | None = None
_WORKER_SINK: DeltaSink | None = None  # execution tracking: counts sent back with each frame


def _process_init(payload: bytes) -> None:
    global _WORKER_OPS, _WORKER_SINK
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


def _process_call(stage: int, ipc: bytes) -> bytes | tuple[bytes, dict]:
    assert _WORKER_OPS is not None
    try:
        out = run_stage(_WORKER_OPS[stage], F.frame_from_ipc(ipc), stage, _WORKER_SINK)
    except BaseException as err:
        cause = err.__cause__ if isinstance(err, PipelineError) and err.__cause__ is not None else err
        if isinstance(err, ZephonError) and not isinstance(err, PipelineError):
            raise  # this library's own errors pickle as they are
        try:
            original = cloudpickle.dumps(cause)
        except Exception:
            original = None
        # Tracebacks do not survive pickling; keep the worker's in the message.
        raise _WorkerFailure(f"{err}\n(in a worker process)\n{traceback.format_exc()}", original) from None
    data = F.frame_to_ipc(out).to_pybytes()
    return data if _WORKER_SINK is None else (data, _WORKER_SINK.take())


_WORKER_DIED = ("a worker process died (killed, crashed, or an operator's setup() failed in it); see its stderr "
                "above. Rerun with options(runner='threads') to see the error in-process.")


class _DecodedFuture(cf.Future):
    """Future of a process call whose IPC bytes are decoded on ``result()`` (and whose counts,
    with execution tracking, are added to ``metrics``)."""

    def __init__(self, inner: cf.Future, metrics: Metrics | None = None) -> None:
        super().__init__()
        self._inner = inner
        self._metrics = metrics

    def result(self, timeout: float | None = None) -> pa.Table:  # type: ignore[override]
        try:
            data = self._inner.result(timeout)
        except cf.process.BrokenProcessPool as err:
            raise PipelineError(_WORKER_DIED) from err
        except _WorkerFailure as failure:
            original = None
            if failure.original is not None:
                try:
                    original = cloudpickle.loads(failure.original)
                except Exception:
                    original = None
            if original is None:
                raise PipelineError(failure.message) from None
            raise operator_failure(original, failure.message) from original
        if isinstance(data, tuple):
            data, deltas = data
            if self._metrics is not None:
                self._metrics.merge(deltas)
        return F.frame_from_ipc(data)

    def cancel(self) -> bool:
        return self._inner.cancel()


class ProcessRunner:
    """Spawned worker processes; operators are cloudpickled once per worker, frames cross as
    Arrow IPC.

    Every worker is started with the runner (one no-op task each: the pool spawns a process for
    each task it cannot hand to an idle one), without re-running the training script in it.
    Until the first one is up (spawn, imports, ``setup``: a few tenths of a second), the driver
    runs the frames itself, as the inline runner would: stateless work gives the same rows
    wherever it runs, and a short job is never slower than inline for having asked for workers.
    """

    kind = "process"

    def __init__(self, stages: Sequence[Sequence[BaseOp]], services: dict[str, Any], workers: int,
                 metrics: Metrics | None = None) -> None:
        self.metrics = metrics
        self._sink = metrics.add_op if metrics is not None else None
        self._stages, self._services = stages, services
        self._driver_ops: list[list[BaseOp]] | None = None  # the driver's copies, while no worker is up
        self._up = threading.Event()
        payload = cloudpickle.dumps((list(stages), services, metrics is not None))
        self.workers = workers
        self._procs: list[Any] = []
        self._pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                            initializer=_process_init, initargs=(payload,))
        with main_module_hidden(), worker_environment():
            for _ in range(workers):
                # done once the worker's initializer ran (or failed: the next submit then reports it)
                self._pool.submit(_ready).add_done_callback(lambda _: self._up.set())

    def submit(self, stage: int, frame: pa.Table) -> cf.Future:
        if not self._up.is_set():
            fut: cf.Future = cf.Future()
            try:
                if self._driver_ops is None:
                    self._driver_ops = setup_stages(self._stages, self._services)
                fut.set_result(run_stage(self._driver_ops[stage], frame, stage, self._sink))
            except BaseException as err:  # delivered where the result is read, like the workers' errors
                fut.set_exception(err)
            return fut
        try:
            inner = self._pool.submit(_process_call, stage, F.frame_to_ipc(frame).to_pybytes())
        except cf.process.BrokenProcessPool as err:  # a worker died before this frame was sent
            raise PipelineError(_WORKER_DIED) from err
        return _DecodedFuture(inner, self.metrics)

    def cancel(self) -> None:
        # Keep handles on the workers: shutdown() forgets them, and close() must reap them.
        self._procs.extend((getattr(self._pool, "_processes", None) or {}).values())
        self._pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        """Tell the workers to exit and return: the pool's own manager thread reaps them (a
        worker ends within ~0.1-0.2 s, its interpreter's teardown, which the end of a pass need
        not wait for)."""
        self.cancel()
        for row in self._driver_ops or ():
            for op in row:
                op.teardown()


RUNNERS: dict[str, Callable[..., Any]] = {"inline": InlineRunner, "threads": ThreadRunner, "process": ProcessRunner}


def ordered_map(events: Iterator[Any], runner: Any, stage: int, window: int) -> Iterator[Any]:
    """Run frames of ``events`` through ``stage`` on ``runner``, up to ``window`` ahead, and
    yield results in input order. Non-frame events (markers) pass through in place.

    The look-ahead starts at zero (the first frame of a pass, or of a restore, gets the workers
    to itself instead of queueing behind look-ahead reads), then 1, 2, 4, ... up to ``window``
    frames in flight.
    """
    pending: deque[tuple[bool, Any]] = deque()
    ahead = 0
    try:
        for ev in events:
            if isinstance(ev, pa.Table):
                pending.append((True, runner.submit(stage, ev)))
            else:
                pending.append((False, ev))
            while pending and (not pending[0][0] or len(pending) > ahead):
                is_frame, v = pending.popleft()
                if is_frame:
                    ahead = min(window, max(1, ahead * 2))
                yield v.result() if is_frame else v
        while pending:
            is_frame, v = pending.popleft()
            yield v.result() if is_frame else v
    finally:
        for is_frame, v in pending:
            if is_frame:
                v.cancel()
