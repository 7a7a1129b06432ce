"""The engine in a side process: ``options(mtp_mode=True)``.

A training step that holds the GIL (Python-side work in the loop, a tokenizer call, logging)
stops every loader thread in its process, and loader threads slow the step in turn. In mtp mode
the whole engine (fetch, transforms, packing, batching, with any runner) runs in a spawned
child process, and finished items cross to the trainer as Arrow IPC through a shared-memory
ring; only a few numbers per item travel through a pipe, never pickled rows.

How the two sides stay exact:

- the child delivers items ahead of the trainer, at most ``mtp_buffer`` items and
  ``mtp_buffer_bytes`` bytes ahead (shared counters of items taken and bytes read);
- ``checkpoint()`` asks the child for its state *as of the items the trainer took*: the items
  still in the ring count as not delivered (their rows go back in front of the lanes' pending
  rows, exactly as the in-process prefetch thread's queue does);
- ``restore()`` state is handed to the child at start; ``map_batch`` functions run here, on
  the trainer's side, so they may close over anything.

The child never outlives the trainer: it exits when told to close, when its control pipe
breaks, and (Linux) the kernel kills it when the trainer dies (``PR_SET_PDEATHSIG``); a
watchdog thread covers the rest by polling the parent's pid.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
import weakref
from collections import deque
from multiprocessing import shared_memory
from typing import TYPE_CHECKING, Any, Mapping

import cloudpickle
import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.errors import PipelineError

if TYPE_CHECKING:
    from zephon_columnar.engine.engine import Engine
    from zephon_columnar.engine.replay import LaneCursor, LaneSnapshot
    from zephon_columnar.pipeline import Pipeline

#: Items the child may deliver ahead of the trainer when ``mtp_buffer`` is not set.
DEFAULT_MTP_BUFFER = 16
#: Shared counters: bytes written to the ring, bytes read from it, items sent, items taken.
_WRITTEN, _READ, _SENT, _TAKEN = range(4)
#: How long a side waits between looks at the other (also the control pipe's poll interval).
_POLL_S = 0.001
#: How long the trainer waits for a reply before checking that the child still lives.
_REPLY_POLL_S = 0.5


class MtpRun:
    """The trainer's side of an mtp-mode pass; the same interface as `EngineRun`."""

    def __init__(self, pipeline: "Pipeline", engine: "Engine", cursors: Mapping[int, Any] | None) -> None:
        self.engine = engine
        opts = engine.options
        self.capacity = opts.mtp_buffer or DEFAULT_MTP_BUFFER
        self._closed = False
        self._final: dict[int, Any] | None = None  # the state at the end, kept after the child exits
        self._final_stats: dict[int, dict[str, int]] = {}
        self._taken = 0
        child = copy.copy(pipeline)
        child._options = opts.updated(mtp_mode=False)  # noqa: SLF001
        child._run = child._warmup = child._pending = None  # noqa: SLF001
        child._ops = _ops_up_to_batch(child._ops)  # noqa: SLF001 - map_batch runs here, on this side
        state = None if cursors is None else {lane: cur.to_json() for lane, cur in cursors.items()}
        ctx = multiprocessing.get_context("spawn")
        self._shm = shared_memory.SharedMemory(create=True, size=max(1 << 16, int(opts.mtp_buffer_bytes)))
        self._counters = ctx.Array("q", 4, lock=False)
        self._items, child_items = ctx.Pipe(duplex=False)
        self._ctrl, child_ctrl = ctx.Pipe()
        # Not a daemon: a daemon may not start processes, and runner="process" inside needs to.
        # An exit hook closes runs left open instead (before multiprocessing joins children).
        self._proc = ctx.Process(target=_child_main, name="zephon-mtp", daemon=False, args=(
            cloudpickle.dumps((child, state)), self._shm.name, self._counters, child_items, child_ctrl,
            self.capacity, os.getpid()))
        with _main_module_hidden():
            self._proc.start()
        child_items.close()
        child_ctrl.close()
        self._ctrl_lock = threading.Lock()
        _OPEN_RUNS.add(self)

    # ------------------------------------------------------------------ iterator
    def __iter__(self) -> "MtpRun":
        return self

    def __next__(self) -> Any:
        while True:
            value = self._next_value()
            for op in self.engine.plan.after_batch:
                value = op.apply(value)
                if value is None:  # dropped by map_batch: it counts as delivered
                    break
            else:
                return value

    def _next_value(self) -> Any:
        if self._closed:
            raise StopIteration
        msg = self._receive()
        kind = msg[0]
        if kind == "end":
            self._finish()
            raise StopIteration
        if kind == "error":
            self._finish(final_state=False)
            raise _rebuild_error(msg[1], msg[2])
        _, lane, start, length, end = msg[:5]
        data = msg[5] if len(msg) > 5 else bytes(self._shm.buf[start:start + length])
        if len(msg) == 5:
            self._counters[_READ] = end  # the slot may be written again
        self._taken += 1
        self._counters[_TAKEN] = self._taken
        table = F.frame_from_ipc(pa.py_buffer(data))
        return self._value_of(table)

    def _value_of(self, table: pa.Table) -> Any:
        from zephon_columnar.records import records_of
        from zephon_columnar.types import SampleBatch

        fields = self.engine.fields or None
        if self.engine.plan.batch is not None:
            return SampleBatch(table, fields=fields)
        return records_of(table, fields)[0]

    def _receive(self) -> tuple:
        while not self._items.poll(_REPLY_POLL_S):
            if not self._proc.is_alive():
                code = self._proc.exitcode
                self._finish(final_state=False)
                raise PipelineError(f"the engine's side process (mtp_mode) exited with code {code} without a "
                                    "result; run with options(mtp_mode=False) to see the failure in this process.")
        try:
            return self._items.recv()
        except EOFError:
            self._finish(final_state=False)
            raise PipelineError("the engine's side process (mtp_mode) closed its pipe mid-stream.") from None

    # ------------------------------------------------------------------ state
    def snapshot(self) -> dict[int, "LaneCursor | LaneSnapshot"]:
        """Every lane's state after the items this process took."""
        if self._final is not None:
            return dict(self._final)
        if self._closed:
            raise RuntimeError("checkpoint(): the mtp_mode pass was closed before it ended; take the "
                               "checkpoint before closing the iterator.")
        return self._ask("snapshot", self._taken)

    def stats(self) -> dict[int, dict[str, int]]:
        if self._closed:
            return dict(self._final_stats)
        return self._ask("stats")

    def queue_stats(self) -> dict[str, int]:
        """Items ready in the ring and their bytes, against the ring's capacity."""
        c = self._counters
        return {"depth": int(c[_SENT] - c[_TAKEN]), "capacity": self.capacity,
                "staged_bytes": int(c[_WRITTEN] - c[_READ]), "capacity_bytes": self._shm.size}

    def _ask(self, *request: Any) -> Any:
        from zephon_columnar.engine.replay import lane_from_json

        with self._ctrl_lock:
            self._ctrl.send(request)
            while not self._ctrl.poll(_REPLY_POLL_S):
                if not self._proc.is_alive():
                    raise PipelineError(f"the engine's side process (mtp_mode) exited with code "
                                        f"{self._proc.exitcode} while asked for {request[0]}.")
            kind, reply = self._ctrl.recv()
        if kind == "error":
            raise _rebuild_error(*reply)
        if request[0] == "snapshot":
            return {int(lane): lane_from_json(lane, js) for lane, js in reply.items()}
        return reply

    # ------------------------------------------------------------------ shutdown
    def _finish(self, *, final_state: bool = True) -> None:
        """End of the pass: keep its final state (a checkpoint after it still works), then close."""
        if final_state and not self._closed:
            try:
                self._final = self._ask("snapshot", self._taken)
                self._final_stats = self._ask("stats")
            except PipelineError:
                pass
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        _OPEN_RUNS.discard(self)
        try:
            self._ctrl.send(("close",))
        except (OSError, ValueError):
            pass
        self._proc.join(timeout=5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout=5)
        for conn in (self._items, self._ctrl):
            conn.close()
        try:
            self._shm.close()
            self._shm.unlink()
        except (FileNotFoundError, BufferError):
            pass

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def _ops_up_to_batch(ops: list) -> list:
    """The operators the side process runs: everything up to ``batch`` (``map_batch`` after it
    runs on the trainer's side)."""
    from zephon_columnar.ops.batch import BatchOp

    for i, op in enumerate(ops):
        if isinstance(op, BatchOp):
            return ops[:i + 1]
    return list(ops)


@contextlib.contextmanager
def _main_module_hidden() -> Any:
    """Start a spawned child without re-running the training script in it: spawn imports the
    parent's ``__main__`` (by path or module name) first, and a script without an
    ``if __name__ == "__main__"`` guard would start training again there. The child needs
    nothing from it (functions defined there travel by value, cloudpickled)."""
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if main is not None and k in main.__dict__}
    try:
        for k in saved:
            setattr(main, k, None) if k == "__spec__" else delattr(main, k)
        yield
    finally:
        for k, v in saved.items():
            setattr(main, k, v)


_OPEN_RUNS: "weakref.WeakSet[MtpRun]" = weakref.WeakSet()


@atexit.register
def _close_open_runs() -> None:
    """At interpreter exit, stop side processes whose iterator was never closed (registered after
    multiprocessing's own exit hook, so it runs first and that hook's join returns)."""
    for run in list(_OPEN_RUNS):
        run.close()


def _rebuild_error(blob: bytes | None, text: str) -> BaseException:
    """The child's exception (its own type when it unpickles), else a PipelineError with its text."""
    if blob is not None:
        try:
            err = pickle.loads(blob)
            if isinstance(err, BaseException):
                return err
        except Exception:  # noqa: BLE001 - an exception that does not travel: its text does
            pass
    return PipelineError(f"in the engine's side process (mtp_mode): {text}")


def _error_message(err: BaseException) -> tuple[bytes | None, str]:
    try:
        blob: bytes | None = cloudpickle.dumps(err)
    except Exception:  # noqa: BLE001
        blob = None
    return blob, f"{type(err).__name__}: {err}"


# ---------------------------------------------------------------------- the child
def _die_with_parent(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass

    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(0)
            time.sleep(0.5)

    threading.Thread(target=watch, name="zephon-mtp-watchdog", daemon=True).start()


class _Child:
    """The child's loop: deliver items into the ring, answer the trainer between items."""

    def __init__(self, payload: bytes, shm_name: str, counters: Any, items: Any, ctrl: Any, capacity: int) -> None:
        from zephon_columnar.engine.replay import lane_from_json

        pipeline, state = cloudpickle.loads(payload)
        cursors = None if state is None else {int(lane): lane_from_json(str(lane), js) for lane, js in state.items()}
        self.engine = pipeline._engine()  # noqa: SLF001
        self.run = self.engine.start(cursors)
        self.replay = self.engine.mode == "replay"
        self.delivered = dict(self.run.delivered)  # replay mode: cursors as of the trainer's items
        self.in_transit: deque = deque()  # (sequence number, LaneItem, its cursor) not taken yet
        self.shm = shared_memory.SharedMemory(name=shm_name)
        self.counters, self.items, self.ctrl, self.capacity = counters, items, ctrl, capacity
        self.sent = 0
        self.closing = False

    def serve(self) -> None:
        try:
            while not self.closing:
                self._wait(lambda: self.sent - self.counters[_TAKEN] < self.capacity)
                if self.closing:
                    break
                try:
                    item = self.run.next_lane_item()
                except StopIteration:
                    self.items.send(("end",))
                    break
                self._send(item)
        except BaseException as err:  # noqa: BLE001 - it reaches the trainer's next()
            if not self.closing:
                self.items.send(("error", *_error_message(err)))
        while not self.closing:  # answer checkpoint requests until told to close
            self._handle(self.ctrl.recv())

    def _send(self, item: Any) -> None:
        data = F.frame_to_ipc(item.table)
        n, size = data.size, self.shm.size
        cursor = self.run.delivered.get(item.lane) if self.replay else None
        if n > size // 2:  # too large for the ring: through the pipe (a copy more, no pickled rows)
            self.items.send(("item", item.lane, 0, n, self.counters[_WRITTEN], data.to_pybytes()))
        else:
            written = self.counters[_WRITTEN]
            start = written % size
            if start + n > size:  # no room before the end of the ring: skip to its start
                written += size - start
                start = 0
            self._wait(lambda: written + n - self.counters[_READ] <= size)
            if self.closing:
                return
            self.shm.buf[start:start + n] = memoryview(data).cast("B")
            self.counters[_WRITTEN] = written + n
            self.items.send(("item", item.lane, start, n, written + n))
        self.in_transit.append((self.sent, item, cursor))
        self.sent += 1
        self.counters[_SENT] = self.sent

    def _wait(self, ready: Any) -> None:
        """Until ``ready()``, answering the trainer meanwhile."""
        while not ready() and not self.closing:
            if self.ctrl.poll(_POLL_S):
                self._handle(self.ctrl.recv())

    def _handle(self, request: tuple) -> None:
        kind = request[0]
        if kind == "close":
            self.closing = True
            return
        try:
            if kind == "snapshot":
                reply = {str(lane): cur.to_json() for lane, cur in self._snapshot(request[1]).items()}
            elif kind == "stats":
                reply = self.run.stats()
            else:
                raise ValueError(f"unknown request {kind!r}")
            self.ctrl.send(("ok", reply))
        except BaseException as err:  # noqa: BLE001
            self.ctrl.send(("error", _error_message(err)))

    def _snapshot(self, taken: int) -> dict[int, Any]:
        while self.in_transit and self.in_transit[0][0] < taken:
            _, item, cursor = self.in_transit.popleft()
            if cursor is not None:
                self.delivered[item.lane] = cursor
        if self.replay:
            return dict(self.delivered)
        return self.run.snapshot(in_transit=[item for _, item, _ in self.in_transit])

    def close(self) -> None:
        try:
            self.run.close()
        finally:
            self.shm.close()


def _child_main(payload: bytes, shm_name: str, counters: Any, items: Any, ctrl: Any, capacity: int,
                parent_pid: int) -> None:
    _die_with_parent(parent_pid)
    try:
        child = _Child(payload, shm_name, counters, items, ctrl, capacity)
    except BaseException as err:  # noqa: BLE001 - a start-up failure reaches the first next()
        message = _error_message(err)
        items.send(("error", *message))
        try:
            while ctrl.recv()[0] != "close":
                ctrl.send(("error", message))
        except (EOFError, OSError):
            pass
        return
    try:
        child.serve()
    except (EOFError, OSError):
        pass  # the trainer went away
    finally:
        child.close()
