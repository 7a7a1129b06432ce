"""The engine in a side process: ``options(mtp_mode=True)``.

A training step that holds the GIL (Python-side work in the loop, a tokenizer call, logging)
stops every loader thread in its process, and loader threads slow the step in turn. In mtp mode
the whole engine (fetch, transforms, packing, batching, with any runner) runs in a spawned
child process, and finished items cross to the trainer as Arrow record batches through a
shared-memory ring. Per item the trainer reads a slot of shared counters (where the bytes are,
which schema) and copies the bytes out; no system call when an item is ready, and the schema,
the end of the stream and errors come through a pipe. No rows are ever pickled.

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
import multiprocessing
import os
import pickle
import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping
from multiprocessing import shared_memory
from typing import TYPE_CHECKING, Any, cast

import cloudpickle
import pyarrow as pa

from zephon_columnar.engine.checkpoint import LaneState, lane_from_json, lane_to_json
from zephon_columnar.engine.children import die_with_parent, main_module_hidden
from zephon_columnar.engine.engine import deliver
from zephon_columnar.engine.pass_report import PassReport
from zephon_columnar.errors import PipelineError
from zephon_columnar.losses import say

if TYPE_CHECKING:
    from zephon_columnar.engine.engine import Engine, EngineRun
    from zephon_columnar.engine.lane import LaneItem
    from zephon_columnar.engine.spec import PipelineSpec
    from zephon_columnar.observability.stats import PrefetchTimingTotals

#: Items the child may deliver ahead of the trainer when ``mtp_buffer`` is not set.
DEFAULT_MTP_BUFFER = 16
#: Shared counters: bytes written to the ring, bytes read from it, items published, items
#: taken, and whether the trainer sleeps on the pipe waiting for an item (then the child wakes it).
_WRITTEN, _READ, _SENT, _TAKEN, _WAITING = range(5)
#: Per item, in slot ``sequence % capacity`` of a shared array: where its bytes start in the ring
#: and how many (-n: they came through the pipe, too large for the ring), the ring position
#: after it, and the version of the schema it is encoded with (sent once through the pipe).
_SLOT = 4
#: How long a side waits between looks at the other (also the control pipe's poll interval).
_POLL_S = 0.001
#: How long the trainer waits for a reply before checking that the child still lives.
_REPLY_POLL_S = 0.5
#: How long the trainer spins on the shared counter before it sleeps on the pipe.
_SPIN_S = 50e-6


class MtpRun:
    """The trainer's side of an mtp-mode pass (a `~zephon_columnar.engine.run.Run`, as `EngineRun`)."""

    def __init__(
        self, side: PipelineSpec, engine: Engine, cursors: Mapping[int, Any] | None, *, says_losses: bool = True
    ) -> None:
        """``side``: what the side process runs (`PipelineSpec.for_side_process`: the operators
        up to ``batch``, without mtp_mode). ``engine``: this side's, for the lanes and the
        operators after ``batch``. ``cursors``: where to start. ``says_losses``: whether the end
        of the pass says what it dropped here (the side process never does: it hands its
        `~zephon_columnar.engine.pass_report.PassReport` over)."""
        self.engine = engine
        self.says_losses = says_losses
        self._report: PassReport | None = None
        opts = engine.options
        self.capacity = opts.mtp_buffer or DEFAULT_MTP_BUFFER
        self._closed = False
        self._stopped = False  # close() was called (not just the end of the stream)
        self._final: dict[int, Any] | None = None  # the state at the end, kept after the child exits
        self._final_stats: dict[int, dict[str, int]] = {}
        self._final_tracked: list[dict[str, Any]] = []
        self._final_fetch_groups: dict[tuple[int, int, int], dict[str, float]] = {}
        self._final_prefetch: PrefetchTimingTotals | None = None
        self._taken = 0
        state = None if cursors is None else {lane: lane_to_json(cur) for lane, cur in cursors.items()}
        ctx = multiprocessing.get_context("spawn")
        self._shm = shared_memory.SharedMemory(create=True, size=max(1 << 16, int(opts.mtp_buffer_bytes)))
        self._counters = ctx.Array("q", 5, lock=False)
        self._slots = ctx.Array("q", _SLOT * self.capacity, lock=False)
        self._schemas: dict[int, pa.Schema] = {}
        self._oversize: deque[bytes] = deque()  # bytes of items too large for the ring, in order
        self._ended: tuple[Any, ...] | None = None  # the child's ("end",) or ("error", ...) once read
        self._items, child_items = ctx.Pipe(duplex=False)
        self._ctrl, child_ctrl = ctx.Pipe()
        # Not a daemon: a daemon may not start processes, and runner="process" inside needs to.
        # An exit hook closes runs left open instead (before multiprocessing joins children).
        self._proc = ctx.Process(
            target=_child_main,
            name="zephon-mtp",
            daemon=False,
            args=(
                cloudpickle.dumps((side, state)),
                self._shm.name,
                self._counters,
                self._slots,
                child_items,
                child_ctrl,
                self.capacity,
                os.getpid(),
            ),
        )
        try:
            with main_module_hidden():
                self._proc.start()
        except BaseException:
            self._shm.close()
            self._shm.unlink()
            raise
        child_items.close()
        child_ctrl.close()
        self._ctrl_lock = threading.Lock()
        _OPEN_RUNS.add(self)

    # ------------------------------------------------------------------ iterator
    def __iter__(self) -> MtpRun:
        return self

    def __next__(self) -> Any:
        return deliver(self.engine.plan, self._next_value)

    def _next_value(self) -> Any:
        if self._closed:
            raise StopIteration
        try:
            return self._take_value()
        except (PipelineError, OSError, EOFError):
            if self._stopped:  # closed from another thread while this one waited: the end, not an error
                raise StopIteration from None
            raise

    def _take_value(self) -> Any:
        c = self._counters
        if c[_SENT] <= self._taken:
            self._wait_for_item()
        k = (self._taken % self.capacity) * _SLOT
        start, length, end, version = self._slots[k : k + _SLOT]
        while version not in self._schemas or (length < 0 and not self._oversize):
            self._read_message()  # sent before the item was published: there already
        if length < 0:
            data = self._oversize.popleft()
        else:
            data = bytes(_ring(self._shm)[start : start + length])  # a copy: the ring slot is reused
            c[_READ] = end
        self._taken += 1
        c[_TAKEN] = self._taken
        batch = pa.ipc.read_record_batch(pa.py_buffer(data), self._schemas[version])
        return self._value_of(pa.Table.from_batches([batch]))

    def _wait_for_item(self) -> None:
        """Until the child publishes the next item; raises at the end of the stream or on its error."""
        c = self._counters
        spin_until = time.perf_counter() + _SPIN_S
        while c[_SENT] <= self._taken and time.perf_counter() < spin_until:
            pass  # the usual case when the loader keeps up: no system call at all
        while c[_SENT] <= self._taken:
            if self._stopped:
                raise StopIteration
            if self._ended is None:
                c[_WAITING] = 1
                if c[_SENT] <= self._taken:  # checked after the flag is up: a wake-up is never missed
                    self._read_message(timeout=_REPLY_POLL_S)
                c[_WAITING] = 0
            if self._ended is not None and c[_SENT] <= self._taken:
                kind, *rest = self._ended
                if kind == "end":
                    self._finish()
                    raise StopIteration
                self._finish(final_state=False)
                raise _rebuild_error(*rest)

    def _read_message(self, timeout: float | None = None) -> None:
        """One message from the child's pipe (a schema, an oversize item's bytes, a wake-up, the
        end or an error); with ``timeout``, returns without one after that long."""
        while not self._items.poll(_REPLY_POLL_S if timeout is None else timeout):
            if not self._proc.is_alive():
                code = self._proc.exitcode
                self._finish(final_state=False)
                raise PipelineError(
                    f"the engine's side process (mtp_mode) exited with code {code} without a "
                    "result; run with options(mtp_mode=False) to see the failure in this process."
                )
            if timeout is not None:
                return
        try:
            msg = self._items.recv()
        except EOFError:
            self._finish(final_state=False)
            raise PipelineError("the engine's side process (mtp_mode) closed its pipe mid-stream.") from None
        kind = msg[0]
        if kind == "schema":
            self._schemas[msg[1]] = pa.ipc.read_schema(pa.py_buffer(msg[2]))
        elif kind == "data":
            self._oversize.append(msg[1])
        elif kind in ("end", "error"):
            self._ended = msg

    def _value_of(self, table: pa.Table) -> Any:
        from zephon_columnar.records import records_of
        from zephon_columnar.types import SampleBatch

        fields = self.engine.fields or None
        if self.engine.plan.batch is not None:
            return SampleBatch(table, fields=fields)
        return records_of(table, fields)[0]

    # ------------------------------------------------------------------ state
    def snapshot(self) -> dict[int, LaneState]:
        """Every lane's state after the items this process took."""
        if self._final is not None:
            return dict(self._final)
        if self._closed:
            raise RuntimeError(
                "checkpoint(): the mtp_mode pass was closed before it ended; take the "
                "checkpoint before closing the iterator."
            )
        return cast("dict[int, LaneState]", self._ask("snapshot", self._taken))

    def stats(self) -> dict[int, dict[str, int]]:
        if self._closed:
            return dict(self._final_stats)
        return cast("dict[int, dict[str, int]]", self._ask("stats"))

    def tracked_records(self) -> list[dict[str, Any]]:
        """Execution tracking's records, from the side process (kept at the end of the pass)."""
        if self._closed:
            return list(self._final_tracked)
        return cast("list[dict[str, Any]]", self._ask("tracked"))

    def in_flight_by_stage(self) -> dict[int, dict[int, int]] | None:
        return None if self._closed else self._ask("in_flight")

    @property
    def closed(self) -> bool:
        return self._closed

    def fetch_groups(self) -> dict[tuple[int, int, int], dict[str, float]]:
        """Execution tracking's fetch groups, from the side process (kept at the end of the pass)."""
        if self._closed:
            return dict(self._final_fetch_groups)
        return cast("dict[tuple[int, int, int], dict[str, float]]", self._ask("fetch_groups"))

    def prefetch_timing(self) -> PrefetchTimingTotals | None:
        """What ``prefetch()`` warmed, in the side process that runs the engine (kept at the end
        of the pass)."""
        if self._closed:
            return self._final_prefetch
        timing: PrefetchTimingTotals | None = self._ask("prefetch_timing")
        return timing

    def queue_stats(self) -> dict[str, int] | None:
        """Items ready in the ring and their bytes, against the ring's capacity (None once closed)."""
        if self._closed:
            return None
        c = self._counters
        return {
            "depth": int(c[_SENT] - c[_TAKEN]),
            "capacity": self.capacity,
            "staged_bytes": int(c[_WRITTEN] - c[_READ]),
            "capacity_bytes": self._shm.size,
        }

    def _ask(self, *request: Any) -> Any:
        with self._ctrl_lock:
            self._ctrl.send(request)
            while not self._ctrl.poll(_REPLY_POLL_S):
                if not self._proc.is_alive():
                    raise PipelineError(
                        f"the engine's side process (mtp_mode) exited with code "
                        f"{self._proc.exitcode} while asked for {request[0]}."
                    )
            kind, reply = self._ctrl.recv()
        if kind == "error":
            raise _rebuild_error(*reply)
        if request[0] == "snapshot":
            return {int(lane): lane_from_json(f"lanes.{lane}", js) for lane, js in reply.items()}
        return reply

    # ------------------------------------------------------------------ shutdown
    def _finish(self, *, final_state: bool = True) -> None:
        """End of the pass: keep its final state (a checkpoint after it still works), then close."""
        if final_state and not self._closed:
            try:
                self._final = self._ask("snapshot", self._taken)
                self._final_stats = self._ask("stats")
                self._final_tracked = self._ask("tracked")
                self._final_fetch_groups = self._ask("fetch_groups")
                self._final_prefetch = self._ask("prefetch_timing")
                self._report = cloudpickle.loads(self._ask("pass_report"))
            except PipelineError:
                pass
        self._close()
        if self._report is not None and self.says_losses:
            say(self._report.said())

    def pass_report(self) -> PassReport | None:
        """What the ended pass dropped, from the side process (None before the end)."""
        return self._report

    def close(self) -> None:
        self._stopped = True  # asked for (maybe from another thread): a wait it cuts short is the end
        self._close()

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        _OPEN_RUNS.discard(self)
        try:
            self._ctrl.send(("close",))
        except (OSError, ValueError):
            pass
        # A side process that does not end within a second is stuck (in a user function, say):
        # it holds nothing that is not in the checkpoint, so it is killed.
        self._proc.join(timeout=1.0)
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
        except Exception:  # noqa: BLE001, S110 - best-effort cleanup at garbage collection: never raise from __del__
            pass


_OPEN_RUNS: weakref.WeakSet[MtpRun] = weakref.WeakSet()


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
        except Exception:  # noqa: BLE001, S110 - an exception that does not travel: its text does
            pass
    return PipelineError(f"in the engine's side process (mtp_mode): {text}")


def _error_message(err: BaseException) -> tuple[bytes | None, str]:
    try:
        blob: bytes | None = cloudpickle.dumps(err)
    except Exception:  # noqa: BLE001
        blob = None
    return blob, f"{type(err).__name__}: {err}"


# ---------------------------------------------------------------------- the child
class _Child:
    """The child's loop: deliver items into the ring, answer the trainer between items."""

    def __init__(
        self, payload: bytes, shm_name: str, counters: Any, slots: Any, items: Any, ctrl: Any, capacity: int
    ) -> None:
        side, state = cloudpickle.loads(payload)
        cursors = (
            None if state is None else {int(lane): lane_from_json(f"lanes.{lane}", js) for lane, js in state.items()}
        )
        self.engine: Engine = side.build_engine()
        # The trainer says the pass's losses; up to ``capacity`` items sent may not be taken yet
        # when it asks for a checkpoint.
        self.run: EngineRun = self.engine.start(cursors, says_losses=False, in_transit=capacity)
        self.in_transit: deque[tuple[int, LaneItem]] = deque()  # (sequence number, item) not taken yet
        self.shm = shared_memory.SharedMemory(name=shm_name)
        self.counters, self.slots, self.items, self.ctrl, self.capacity = counters, slots, items, ctrl, capacity
        self.schema: pa.Schema | None = None
        self.schema_version = -1
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
        """Publish one item: its schema first if new (pipe), its record batch (ring, or pipe when
        too large), its slot, then the published count the trainer polls."""
        batch = item.table.combine_chunks().to_batches()[0]  # one chunk per column: one batch (an item has rows)
        if self.schema is None or not batch.schema.equals(self.schema, check_metadata=True):
            self.schema, self.schema_version = batch.schema, self.schema_version + 1
            self.items.send(("schema", self.schema_version, self.schema.serialize().to_pybytes()))
        data = batch.serialize()
        n, size = data.size, self.shm.size
        c = self.counters
        if n > size // 2:  # too large for the ring: through the pipe (a copy more, no pickled rows)
            self.items.send(("data", data.to_pybytes()))
            start, length, end = 0, -n, c[_WRITTEN]
        else:
            written = c[_WRITTEN]
            start = written % size
            if start + n > size:  # no room before the end of the ring: skip to its start
                written += size - start
                start = 0
            self._wait(lambda: written + n - c[_READ] <= size)
            if self.closing:
                return
            _ring(self.shm)[start : start + n] = memoryview(data).cast("B")
            length, end = n, written + n
            c[_WRITTEN] = end
        k = (self.sent % self.capacity) * _SLOT
        self.slots[k : k + _SLOT] = [start, length, end, self.schema_version]
        self.in_transit.append((self.sent, item))
        self.sent += 1
        c[_SENT] = self.sent  # published: the slot and the bytes are in place
        if c[_WAITING]:
            self.items.send(("wake",))

    def _wait(self, ready: Any) -> None:
        """Until ``ready()``, answering the trainer meanwhile."""
        while not ready() and not self.closing:
            if self.ctrl.poll(_POLL_S):
                self._handle(self.ctrl.recv())

    def _handle(self, request: tuple[Any, ...]) -> None:
        kind = request[0]
        if kind == "close":
            self.closing = True
            return
        reply: Any
        try:
            if kind == "snapshot":
                reply = {str(lane): lane_to_json(cur) for lane, cur in self._snapshot(request[1]).items()}
            elif kind == "stats":
                reply = self.run.stats()
            elif kind == "tracked":
                reply = self.run.tracked_records()
            elif kind == "in_flight":
                reply = self.run.in_flight_by_stage()
            elif kind == "fetch_groups":
                reply = self.run.fetch_groups()
            elif kind == "prefetch_timing":
                reply = self.run.prefetch_timing()
            elif kind == "pass_report":
                reply = cloudpickle.dumps(self.run.pass_report())
            else:
                raise ValueError(f"unknown request {kind!r}")
            self.ctrl.send(("ok", reply))
        except BaseException as err:  # noqa: BLE001
            self.ctrl.send(("error", _error_message(err)))

    def _snapshot(self, taken: int) -> dict[int, LaneState]:
        while self.in_transit and self.in_transit[0][0] < taken:
            self.in_transit.popleft()
        return self.run.snapshot(in_transit=[item for _, item in self.in_transit])

    def close(self) -> None:
        try:
            self.run.close()
        finally:
            self.shm.close()


def _child_main(
    payload: bytes, shm_name: str, counters: Any, slots: Any, items: Any, ctrl: Any, capacity: int, parent_pid: int
) -> None:
    die_with_parent(parent_pid)
    try:
        child = _Child(payload, shm_name, counters, slots, items, ctrl, capacity)
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


def _ring(shm: shared_memory.SharedMemory) -> memoryview:
    """The bytes of an open shared-memory block (not kept: a view held open blocks its close)."""
    buf = shm.buf
    assert buf is not None, "the shared-memory ring is closed"
    return buf
