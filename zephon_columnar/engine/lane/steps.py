"""The steps between a lane's source and its collector.

    ParallelStep    a stateless stage on the runner, up to ``window`` frames ahead, re-sequenced
                    (``pending``: what it was given and has not passed on)
    EmptyPassGuard  after the first stage: stops a lane whose rows are all filtered out
    OrderedStep     an accumulator (``out``: what it emitted and has not passed on; ``inbox``:
                    input not pushed yet)

Every buffer is an attribute, so a checkpoint can read it between two deliveries
(`zephon_columnar.engine.lane.snapshot`); `LazyRows` are rows a restore holds by reference.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.engine.lane.setup import EpochStart, LaneShared
from zephon_columnar.engine.runners import Runner
from zephon_columnar.errors import PipelineError, ZephonError, operator_failure
from zephon_columnar.ops.base import BaseOp

_END = object()


@dataclass
class StageEpoch:
    """The flush epoch an ordered stage is in: its `OrderedStep` moves it on at every
    `EpochStart`, and its accumulator reads it (``LaneContext.flush_epoch``)."""

    value: int

    def get(self) -> int:
        return self.value


class ParallelStep:
    """A stateless stage on the runner, up to ``window`` frames ahead, results in input order.
    Markers pass through in place. ``pending``: (input, future or None) not yet passed on.

    The look-ahead starts at zero (the first frame of a pass, or of a restore, gets the workers
    to itself instead of queueing behind look-ahead reads), then 1, 2, 4, ... up to ``window``.
    """

    #: execution tracking (set by the chain): where waits and frames in flight are counted
    metrics: Any = None
    lane: int = 0

    def __init__(self, upstream: Iterator[Any], runner: Runner, stage: int, window: int) -> None:
        self.upstream = upstream
        self.runner = runner
        self.stage = stage
        self.window = window
        self.pending: deque[tuple[Any, Any]] = deque()
        self.last_input_rows = 0  # rows of the input of the frame passed on last

    def __iter__(self) -> Iterator[Any]:
        pending = self.pending
        ahead = 0
        try:
            for ev in self.upstream:
                try:
                    fut = self.runner.submit(self.stage, ev) if isinstance(ev, pa.Table) else None
                except BaseException:
                    # Taken from the source but not computed (the runner was closed meanwhile): a
                    # checkpoint after close() must still see these rows as not delivered.
                    pending.append((ev, None))
                    raise
                pending.append((ev, fut))
                if self.metrics is not None:
                    self.metrics.in_flight(self.stage, self.lane, len(pending))
                while pending and (pending[0][1] is None or len(pending) > ahead):
                    ev0, fut = pending[0]
                    if fut is not None:
                        ahead = min(self.window, max(1, ahead * 2))
                        out = self._result(fut)
                        self.last_input_rows = ev0.num_rows
                    else:
                        out = ev0
                    pending.popleft()
                    yield out
            while pending:
                ev0, fut = pending[0]
                out = self._result(fut) if fut is not None else ev0
                if fut is not None:
                    self.last_input_rows = ev0.num_rows
                pending.popleft()
                yield out
        finally:
            for _, fut in pending:
                if fut is not None:
                    fut.cancel()

    def _result(self, fut: Any) -> Any:
        if self.metrics is None:
            return self.runner.result(fut)
        t0 = time.perf_counter()
        out = self.runner.result(fut)
        self.metrics.waited(self.stage, time.perf_counter() - t0)
        self.metrics.in_flight(self.stage, self.lane, len(self.pending) - 1)
        return out

    def in_transit(self) -> list[Any]:
        return [ev for ev, _ in self.pending]


class EmptyPassGuard:
    """Between a lane's first stage (fetch and the stateless operators after it) and the rest:
    counts the source rows that went in and the rows that came out. Too many rows in without one
    out means every row is filtered out: with a source that repeats, the lane would read
    forever, so that is a `PipelineError` naming the numbers.

    Too many: the only lane of a stream reads every row, and any 2 passes' worth of consecutive
    rows hold a whole pass (a pass may be reshuffled), so 2 passes say it for certain. One lane of
    several reads its share of each pass, reshuffled or not: `SHARED_LANE_PASSES` passes' worth of
    its own rows with none through is, for a filter that keeps even one row, a chance under
    e**-40 per such run of rows.
    """

    SHARED_LANE_PASSES = 40

    def __init__(
        self, upstream: Iterator[Any], first: ParallelStep, lane: int, rows_per_pass: int | None, only_lane: bool
    ) -> None:
        self.upstream = upstream
        self.first = first
        self.lane = lane
        self.rows_per_pass = rows_per_pass
        self.passes = 2 if only_lane else self.SHARED_LANE_PASSES
        self.limit = None if rows_per_pass is None else self.passes * rows_per_pass
        self.rows_in = 0
        self.rows_out = 0
        self._in_since_out = 0

    def __iter__(self) -> Iterator[Any]:
        for ev in self.upstream:
            if isinstance(ev, pa.Table):
                self.rows_in += self.first.last_input_rows
                self.rows_out += ev.num_rows
                self._in_since_out = 0 if ev.num_rows else self._in_since_out + self.first.last_input_rows
                if self.limit is not None and self._in_since_out > self.limit:
                    raise PipelineError(
                        f"lane {self.lane} read {self._in_since_out} rows since a row last came through its first "
                        f"stage, more than {self.passes} passes' worth of the data ({self.rows_per_pass} rows a "
                        "pass): every row is filtered out, and a source that repeats would be read forever. Check "
                        "the filter and map conditions against a few rows of each dataset."
                    )
            yield ev


class LazyRows:
    """Rows a restored lane holds by reference (a stage's input not yet pushed, rows not yet
    in a batch) until they are taken: then only those are computed."""

    def __init__(self, refs: pa.Table, source: Callable[[pa.Table], pa.Table], schema: pa.Schema | None = None) -> None:
        self.refs = refs
        self.source = source
        self.schema = schema

    @property
    def num_rows(self) -> int:
        return int(self.refs.num_rows)

    def head(self, n: int) -> tuple[pa.Table, LazyRows | None]:
        """The first ``n`` rows, computed, and the rest (still by reference, or None)."""
        rows = self.source(self.refs.slice(0, n))
        rest = LazyRows(self.refs.slice(n), self.source, self.schema) if n < self.refs.num_rows else None
        return rows, rest


class OrderedStep:
    """One lane's ordered stage: its accumulator sees the lane's frames in order, flushes at
    every epoch start and at the end.

    Input not pushed yet is the ``inbox`` (a frame, or after a restore slices of input
    references), which a checkpoint holds as input references (or as a source position) and a
    restore recomputes only when the stage takes them (frame-split invariance makes the slicing
    invisible in the data). ``out``: what the stage
    emitted and has not passed on (after a restore: references, computed when passed on).
    """

    INPUT_SLICE = 64  # rows per slice of restored input references
    #: execution tracking (set by the chain): where the accumulator's calls are counted
    metrics: Any = None
    lane: int = 0

    def __init__(
        self,
        upstream: Iterator[Any],
        op: BaseOp,
        index: int,
        shared: LaneShared,
        acc: Any,
        queued: list[Any] | None = None,
        inbox: list[Any] | None = None,
        epoch: StageEpoch | None = None,
    ) -> None:
        self.epoch = epoch if epoch is not None else StageEpoch(0)
        self.upstream = upstream
        self.op = op
        self.index = index
        self.shared = shared
        self.acc = acc
        self.out: deque[Any] = deque(queued or ())
        self.inbox: deque[Any] = deque(inbox or ())

    def _call(self, fn: Callable[..., list[pa.Table]], *args: Any, **kw: Any) -> list[pa.Table]:
        try:
            if self.metrics is None:
                return fn(*args, **kw)
            t0 = time.perf_counter()
            out = fn(*args, **kw)
            rows_in = sum(a.num_rows for a in args if isinstance(a, pa.Table))
            self.metrics.add_op(
                ("ordered", self.index, self.op.op_name()),
                calls=1,
                rows_in=rows_in,
                rows_out=sum(getattr(t, "num_rows", 0) for t in out or ()),
                busy_s=time.perf_counter() - t0,
            )
            return out
        except ZephonError:
            raise
        except Exception as err:
            raise operator_failure(
                err, f"operator {self.op.op_name()!r} (ordered stage) failed: {type(err).__name__}: {err}"
            ) from err

    def _passed_on(self, item: Any) -> Any:
        if isinstance(item, LazyRows):
            item, _ = item.head(item.num_rows)
        return item

    def _epoch_start(self, ev: EpochStart) -> None:
        acc, shared = self.acc, self.shared
        self.out.extend(self._call(acc.flush, reset=True))
        self.epoch.value = ev.epoch
        carried = shared.carried_into
        if carried is not None and ev.epoch == carried[0] and self.index in carried[1]:  # noqa: SIM102 - the inner if pushes rows
            # The lane starts inside this epoch: the rows this stage carried into it.
            if self._call(acc.push, carried[1][self.index]):
                raise PipelineError(
                    f"operator {self.op.op_name()!r}: its carried rows produced output when pushed "
                    "into a fresh accumulator; carry() must return only rows that stay buffered."
                )
        carry = acc.carry()
        if carry is not None and carry.num_rows:
            shared.carries.setdefault(ev.epoch, {})[self.index] = carry
        self.out.append(ev)

    def __iter__(self) -> Iterator[Any]:
        acc, out, inbox = self.acc, self.out, self.inbox
        while out:  # after a restore: what was in transit, computed as it goes on
            yield self._passed_on(out.popleft())
        upstream = iter(self.upstream)
        while True:
            if not inbox:
                ev = next(upstream, _END)
                if ev is _END:
                    break
                if isinstance(ev, EpochStart):
                    self._epoch_start(ev)
                else:
                    inbox.append(ev)
            if inbox:
                piece = inbox[0]
                if isinstance(piece, LazyRows):
                    piece, _ = piece.head(piece.num_rows)
                out.extend(self._call(acc.push, piece))
                inbox.popleft()
            while out:
                yield out.popleft()
        out.extend(self._call(acc.flush, reset=True, end=True))
        while out:
            yield out.popleft()

    def inbox_refs(self) -> pa.Table | None:
        parts = [p.refs if isinstance(p, LazyRows) else F.refs_of(p) for p in self.inbox if p.num_rows]
        return F.concat_frames(parts) if parts else None
