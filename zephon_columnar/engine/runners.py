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
from zephon_columnar.errors import WrongTypeError, PipelineError, ZephonError, operator_failure
from zephon_columnar.ops.base import BaseOp, OpContext, StageInfo


def _setup_stages(stages: Sequence[Sequence[BaseOp]], services: dict[str, Any]) -> list[list[BaseOp]]:
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


def _run_stage(ops: Sequence[BaseOp], frame: pa.Table) -> pa.Table:
    for op in ops:
        try:
            frame = op.process_frame(frame)
        except ZephonError:
            raise
        except Exception as err:
            where = ""
            if frame.num_rows and F.LANE in frame.column_names:
                where = (f" (lane {frame.column(F.LANE)[0].as_py()}, chunk {frame.column(F.CHUNK)[0].as_py()}, "
                         f"{frame.num_rows} rows)")
            raise operator_failure(err, f"operator {op.op_name()!r} failed{where}: {type(err).__name__}: {err}") from err
        if not isinstance(frame, pa.Table):
            raise WrongTypeError(f"operator {op.op_name()!r}: process_frame returned {type(frame).__name__}, "
                                      "not a pyarrow.Table")
    return frame


class InlineRunner:
    """Runs stages in the calling thread; ``submit`` returns a finished future."""

    kind = "inline"

    def __init__(self, stages: Sequence[Sequence[BaseOp]], services: dict[str, Any], workers: int) -> None:
        self._ops = _setup_stages(stages, services)
        self.workers = 1

    def submit(self, stage: int, frame: pa.Table) -> cf.Future:
        fut: cf.Future = cf.Future()
        try:
            fut.set_result(_run_stage(self._ops[stage], frame))
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

    def __init__(self, stages: Sequence[Sequence[BaseOp]], services: dict[str, Any], workers: int) -> None:
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
            ops = self._local.ops = _setup_stages(self._stages, self._services)
            with self._lock:
                self._copies.append(ops)
        return ops

    def _call(self, stage: int, frame: pa.Table) -> pa.Table:
        return _run_stage(self._ops()[stage], frame)

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


def _process_init(payload: bytes) -> None:
    global _WORKER_OPS
    stages, services = cloudpickle.loads(payload)
    _WORKER_OPS = _setup_stages(stages, services)


class _WorkerFailure(Exception):
    """What a worker process sends back when an operator fails: the caller's message, and the
    original exception (cloudpickled, None if it cannot be) so the caller can re-raise it with
    its type (a dynamically made subclass would not unpickle in the parent)."""

    def __init__(self, message: str, original: bytes | None) -> None:
        super().__init__(message, original)
        self.message, self.original = message, original


def _process_call(stage: int, ipc: bytes) -> bytes:
    assert _WORKER_OPS is not None
    try:
        out = _run_stage(_WORKER_OPS[stage], F.frame_from_ipc(ipc))
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
    return F.frame_to_ipc(out).to_pybytes()


class _DecodedFuture(cf.Future):
    """Future of a process call whose IPC bytes are decoded on ``result()``."""

    def __init__(self, inner: cf.Future) -> None:
        super().__init__()
        self._inner = inner

    def result(self, timeout: float | None = None) -> pa.Table:  # type: ignore[override]
        try:
            data = self._inner.result(timeout)
        except cf.process.BrokenProcessPool as err:
            raise PipelineError("a worker process died (killed or crashed); see its stderr above. "
                                "Rerun with options(runner='threads') to see the error in-process.") from err
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
        return F.frame_from_ipc(data)

    def cancel(self) -> bool:
        return self._inner.cancel()


class ProcessRunner:
    """Spawned worker processes; operators are cloudpickled once per worker, frames cross as
    Arrow IPC."""

    kind = "process"

    def __init__(self, stages: Sequence[Sequence[BaseOp]], services: dict[str, Any], workers: int) -> None:
        payload = cloudpickle.dumps((list(stages), services))
        self.workers = workers
        self._procs: list[Any] = []
        self._pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                            initializer=_process_init, initargs=(payload,))

    def submit(self, stage: int, frame: pa.Table) -> cf.Future:
        return _DecodedFuture(self._pool.submit(_process_call, stage, F.frame_to_ipc(frame).to_pybytes()))

    def cancel(self) -> None:
        # Keep handles on the workers: shutdown() forgets them, and close() must reap them.
        self._procs.extend((getattr(self._pool, "_processes", None) or {}).values())
        self._pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        self.cancel()
        for p in self._procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)


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
