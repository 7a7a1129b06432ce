"""One lane's stream as objects a checkpoint can read: source -> steps -> collector.

    Source          pointer frames of the lane's chunks, and an `EpochStart` every K chunks
    ParallelStep    a stateless stage on the runner, re-sequenced (`pending`: what it was given
                    and has not passed on)
    OrderedStep     an accumulator (`out`: what it emitted and has not passed on)
    Collector       cuts the rows into batches (`pending`: rows not yet in a batch)

Every buffer is an attribute, so a checkpoint is a *snapshot* of the chain taken between two
deliveries (`LaneChain.snapshot`): where the source resumes, each ordered stage's own state
(`ops.accumulators.ReferenceState`: scalars and the rows it holds, by reference), and the rows
in transit, by reference. Restore builds the same chain again: stages get their state back and
compute held rows only when they emit them (through a `Regenerator`, which runs references
through the stateless operators in front of a stage), rows in transit are computed again, and
the source continues from its position. Nothing already delivered is read again.

Plans with an ordered stage that cannot be described that way (user state) keep the older
mode: a checkpoint names the flush epoch and how many of its rows were delivered; restore
replays the epoch (`engine.checkpoint`).
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from zephon_columnar import frame as F
from zephon_columnar.engine.checkpoint import (
    EpochMarker,
    HeldRows,
    LaneCursor,
    LaneSnapshot,
    QueueEntry,
    ResumePoint,
    StageState,
)
from zephon_columnar.engine.plan import ParallelStage
from zephon_columnar.engine.realized import ROWS_BATCHED, MixtureCounts
from zephon_columnar.engine.runners import Runner
from zephon_columnar.errors import (
    CheckpointError,
    PassTailWarning,
    PipelineError,
    ZephonError,
    operator_failure,
)
from zephon_columnar.losses import Notice, Notices, share_text
from zephon_columnar.ops.accumulators.lane import (
    NO_EXHAUSTION,
    ChunkExhaustion,
    LaneContext,
    ReadsChunkTargets,
    Rewinds,
    restorable_by_reference,
)
from zephon_columnar.ops.base import BaseOp
from zephon_columnar.records import records_of
from zephon_columnar.types import SampleBatch
from zephon_columnar.work.base import WorkSource
from zephon_columnar.work.chunk import WorkChunk

if TYPE_CHECKING:
    from zephon_columnar.engine.engine import Engine

#: Rows of a lane's first frame when it cannot be one batch; frames grow 4x up to the fetch
#: batch size.
FIRST_FRAME_ROWS = 64
#: Work-source states of the most recent chunks a lane keeps whatever else it holds: an uncapped
#: wrap packer rewinds to one of them (a small checkpoint) when its oldest document is that recent.
_KEEP_STATES = 256


@dataclass(frozen=True)
class EpochStart:
    """Marker: the lane's flush epoch ``epoch`` starts here; the work source was in
    ``source_state`` before its first chunk. Accumulators flush and reset on it."""

    epoch: int
    source_state: Mapping[str, Any]


@dataclass(frozen=True)
class LaneItem:
    """A delivered item (a `SampleBatch` or `SampleRecord`), its rows as a frame, and where it
    ends in its lane (what a replay checkpoint records)."""

    lane: int
    value: Any
    table: pa.Table
    epoch: int
    inputs: int
    rows: int
    source_state: Mapping[str, Any]
    carries: Mapping[int, pa.Table]


class LaneShared:
    """Per-lane bookkeeping shared by a lane's source, ordered stages and collector: its
    `LaneContext`, the chunks' target mixtures and what they say of components running out,
    and (replay mode) the rows each ordered stage carried across each flush point
    (``carries[epoch][stage]``)."""

    def __init__(
        self, lane: int, ws: WorkSource, restore: LaneCursor | None, rows_per_item: int, notices: Notices, lanes: int
    ) -> None:
        recipe = ws.recipe()
        self.targets: dict[int, Mapping[str, float] | None] = {}
        self.exhaustion: dict[int, ChunkExhaustion] = {}  # chunks that say nothing are left out
        # What the lane's chunks said had run out before each flush epoch, as change points
        # [(first epoch, components)] (it changes once per component at most).
        self.exhausted_changes: list[tuple[int, frozenset[str]]] = (
            [] if restore is None else [(restore.epoch, restore.exhausted)]
        )
        names = {cid: name for name, cid in ws.component_ids().items()}
        self.mixture = MixtureCounts(names)  # the realized mixture: rows read and delivered per component
        seed = recipe.get("seed", 0) if isinstance(recipe.get("seed", 0), int) else 0
        self.ctx = LaneContext(
            lane=lane,
            seed=seed,
            component_names=names,
            chunk_target=self.targets.get,
            rows_per_item=rows_per_item,
            notices=notices,
            rows_per_pass=ws.rows_per_pass(),
            lanes=lanes,
            continuing=frozenset(ws.continues_after_exhaustion()),
            chunk_exhaustion=lambda chunk_id: self.exhaustion.get(chunk_id, NO_EXHAUSTION),
            exhausted_before=self.exhausted_before,
        )
        self.restore = restore
        # Whether the lane starts its pass at the beginning (no item delivered before): only then
        # do its rows read and delivered compare (`zephon_columnar.engine.realized`). Set by the chain.
        self.fresh = True
        self.carries: dict[int, dict[int, pa.Table]] = {} if restore is None else {restore.epoch: dict(restore.carries)}

    def note_chunk(self, chunk_id: int, chunk: WorkChunk) -> None:
        # What the source aimed for, else what the chunk holds (ensure_mixture's target).
        self.targets[chunk_id] = chunk.target_mixture or chunk.mixture
        if chunk.source_exhausted:
            through = frozenset(chunk.source_exhausted)
            present = {name for name, pointers in chunk.component_arrays.items() if len(pointers)}
            self.exhaustion[chunk_id] = ChunkExhaustion(through=through, before=through - present)

    def epoch_starts(self, epoch: int, exhausted: frozenset[str]) -> None:
        """The source starts flush epoch ``epoch`` having seen ``exhausted`` run out."""
        if exhausted != self.exhausted_before(epoch):
            self.exhausted_changes.append((epoch, exhausted))

    def exhausted_before(self, epoch: int) -> frozenset[str]:
        """The components the lane's chunks before flush epoch ``epoch`` said have run out."""
        at = bisect.bisect_right(self.exhausted_changes, epoch, key=lambda change: change[0])
        return self.exhausted_changes[at - 1][1] if at else frozenset()

    def epoch_reached(self, epoch: int, first_chunk: int) -> Mapping[int, pa.Table]:
        """The collector is in ``epoch`` (whose first chunk is ``first_chunk``): drop older
        carries, and the targets of older chunks (every stage was drained at the flush point,
        so no row of theirs is left in the lane; a target is kept until then however far the
        source reads ahead); the carries of ``epoch``."""
        for e in [e for e in self.carries if e < epoch]:
            del self.carries[e]
        for c in [c for c in self.targets if c < first_chunk]:
            del self.targets[c]
            self.exhaustion.pop(c, None)
        return self.carries.get(epoch, {})


# ---------------------------------------------------------------------- the source
@dataclass(frozen=True)
class _Piece:
    """Rows ``[start, end)`` of chunk ``chunk`` (of ``rows`` pointers) waiting for a frame."""

    chunk: int
    start: int
    end: int
    rows: int
    pointers: np.ndarray
    components: np.ndarray


class Source:
    """A lane's source events from a position ``(chunk, offset, marker)``: chunk ``chunk``'s
    pointers from ``offset`` on, preceded by its `EpochStart` when it starts an epoch and
    ``marker`` is true (the marker has not gone out yet)."""

    def __init__(
        self, engine: Engine, shared: LaneShared, ws: WorkSource, chunk: int, offset: int, marker: bool
    ) -> None:
        self.engine = engine
        self.shared = shared
        self.ws = ws
        self.k = engine.plan.flush_every
        # The work-source state before every chunk a checkpoint may resume from: chunks from the
        # chain's `resume_floor` on (set by the chain), and the last `_KEEP_STATES`.
        self.states: dict[int, Mapping[str, Any]] = {}
        self.resume_floor: Callable[[], int] = lambda: 0
        self._prune_above = 2 * _KEEP_STATES
        self._next_pull = chunk  # the chunk ``ws.next_chunk()`` returns next
        self.start = (chunk, offset, marker)
        self.next_position = (chunk, offset, marker)

    def knows_state_before(self, chunk: int) -> bool:
        return chunk in self.states or chunk == self._next_pull

    def _keep_state(self, chunk: int, state: Mapping[str, Any]) -> None:
        """Keep the state before ``chunk``; drop those no checkpoint can resume from any more
        (amortized: only when the kept states have doubled since the last time)."""
        states = self.states
        states[chunk] = state
        if len(states) > self._prune_above:
            keep_from = min(self.resume_floor(), chunk - _KEEP_STATES)
            for c in [c for c in states if c < keep_from]:
                del states[c]
            self._prune_above = max(2 * _KEEP_STATES, 2 * len(states))

    def state_before(self, chunk: int) -> Mapping[str, Any]:
        """The work-source state before chunk ``chunk`` (one in flight, or the next to pull)."""
        if chunk in self.states:
            return self.states[chunk]
        if chunk == self._next_pull:
            return self.ws.state_dict()
        raise PipelineError(
            f"lane {self.shared.ctx.lane}: no work-source state for chunk {chunk}; this is a bug, "
            "please report it with the pipeline's explain()"
        )

    def position_of(self, event: Any) -> tuple[int, int, bool]:
        """Where ``event`` (emitted by this source) starts."""
        if isinstance(event, EpochStart):
            return (event.epoch * self.k, 0, True)
        return (int(event.column(F.CHUNK)[0].as_py()), int(event.column(F.OFFSET)[0].as_py()), False)

    def __iter__(self) -> Iterator[Any]:
        engine, shared, k = self.engine, self.shared, self.k
        lane = shared.ctx.lane
        comp_ids = self.ws.component_ids()
        # The first frames of a pass (or after a restore) are small and grow 4x to rows_per_frame,
        # so the first batch waits for the rows it needs, not a whole frame. A frame may take
        # rows of several chunks of one flush epoch (small chunks would otherwise cap it), never
        # rows of two epochs: the marker goes between them. Frame sizes never change the data.
        first = FIRST_FRAME_ROWS
        if engine.plan.batch is not None and not engine.plan.stateful:
            first = engine.plan.batch.microbatch_size
        step = min(engine.rows_per_frame, first)
        chunk0, skip, marker = self.start
        # what the lane's chunks so far said had run out (a snapshot restore, which no stage that
        # reads it allows, starts from nothing)
        exhausted = shared.exhausted_before(chunk0 // k)
        last_epoch: int | None = None
        held: list[_Piece] = []  # rows pulled but not yet in a frame
        held_rows = 0
        for chunk_id, chunk in self._chunks_ahead(chunk0):
            pointers, comp_index = chunk.ordered()
            n = len(pointers)
            start = min(skip, n) if chunk_id == chunk0 else 0  # restore: pointers already consumed
            if chunk_id == chunk0 and skip > n:
                raise CheckpointError(
                    f"checkpoint lane {lane}: resumes chunk {chunk0} after {skip} rows, but the "
                    f"chunk has {n}; the checkpoint is corrupt or belongs to other data."
                )
            if chunk_id % k == 0 and (chunk_id != chunk0 or marker):
                if held:
                    yield self._frame(lane, held)
                    held, held_rows = [], 0
                self.next_position = (chunk_id, start, False)  # once handed over, the marker is out
                shared.epoch_starts(chunk_id // k, exhausted)
                yield EpochStart(chunk_id // k, self.states[chunk_id])
            shared.note_chunk(chunk_id, chunk)
            exhausted |= frozenset(chunk.source_exhausted)
            comp_map = np.array([comp_ids[name] for name in chunk.component_names], dtype=np.int32)
            components = comp_map[comp_index] if len(comp_index) else np.zeros(0, np.int32)
            while start < n:
                end = min(n, start + step - held_rows)
                held.append(_Piece(chunk_id, start, end, n, pointers, components))
                held_rows += end - start
                start = end
                if held_rows == step:
                    yield self._frame(lane, held)
                    held, held_rows = [], 0
                    step = min(engine.rows_per_frame, step * 4)
            if n == 0 and not held:
                self.next_position = (chunk_id + 1, 0, (chunk_id + 1) % k == 0)
            last_epoch = chunk_id // k
        if last_epoch is not None:  # for the flush at the end of the lane
            shared.epoch_starts(last_epoch + 1, exhausted)
        if held:
            yield self._frame(lane, held)

    def _frame(self, lane: int, pieces: list[_Piece]) -> pa.Table:
        """The pointer frame of ``pieces`` (consecutive rows of consecutive chunks); sets
        ``next_position`` to the row after it."""
        last = pieces[-1]
        self.next_position = (
            (last.chunk, last.end, False)
            if last.end < last.rows
            else (last.chunk + 1, 0, (last.chunk + 1) % self.k == 0)
        )
        sizes = [p.end - p.start for p in pieces]
        components = np.concatenate([p.components[p.start : p.end] for p in pieces])
        self.shared.mixture.read(components)
        return F.pointer_frame(
            lane=lane,
            chunk_id=np.repeat([p.chunk for p in pieces], sizes),
            offsets=np.concatenate([np.arange(p.start, p.end) for p in pieces]),
            pointers=np.concatenate([p.pointers[p.start : p.end] for p in pieces]),
            components=components,
        )

    def _chunks_ahead(self, chunk_id: int) -> Iterator[tuple[int, Any]]:
        """(chunk_id, chunk), pulled up to the prefetcher's ``buffer_size`` samples ahead so
        remote shards download early; the work-source state before each chunk is kept."""
        prefetcher = self.engine.prefetcher
        ahead = prefetcher.buffer_size if prefetcher is not None else 0
        buffered: deque[tuple[int, Any]] = deque()
        samples = 0
        exhausted = False
        ws = self.ws
        while True:
            while not exhausted and (not buffered or samples < ahead):
                self._keep_state(chunk_id, ws.state_dict())
                chunk = ws.next_chunk()
                if chunk is None:
                    exhausted = True
                    break
                self._next_pull = chunk_id + 1
                if prefetcher is not None:
                    prefetcher.warm(
                        np.concatenate([np.asarray(v).reshape(-1, 3) for v in chunk.component_arrays.values()])
                    )
                buffered.append((chunk_id, chunk))
                samples += len(chunk)
                chunk_id += 1
            if not buffered:
                return
            item = buffered.popleft()
            samples -= len(item[1])
            yield item


# ---------------------------------------------------------------------- steps
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


class _LazyRows:
    """Rows a restored lane holds by reference (a stage's input not yet pushed, rows not yet
    in a batch) until they are taken: then only those are computed."""

    def __init__(self, refs: pa.Table, source: Callable[[pa.Table], pa.Table], schema: pa.Schema | None = None) -> None:
        self.refs = refs
        self.source = source
        self.schema = schema

    @property
    def num_rows(self) -> int:
        return self.refs.num_rows

    def head(self, n: int) -> tuple[pa.Table, _LazyRows | None]:
        """The first ``n`` rows, computed, and the rest (still by reference, or None)."""
        rows = self.source(self.refs.slice(0, n))
        rest = _LazyRows(self.refs.slice(n), self.source, self.schema) if n < self.refs.num_rows else None
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
        epoch_box: list[int] | None = None,
    ) -> None:
        self.epoch_box = epoch_box if epoch_box is not None else [0]
        self.upstream = upstream
        self.op = op
        self.index = index
        self.shared = shared
        self.acc = acc
        self.out: deque[Any] = deque(queued or ())
        self.inbox: deque[Any] = deque(inbox or ())

    def _call(self, fn: Any, *args: Any, **kw: Any) -> list[pa.Table]:
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
        if isinstance(item, _LazyRows):
            item, _ = item.head(item.num_rows)
        return item

    def _epoch_start(self, ev: EpochStart) -> None:
        acc, shared = self.acc, self.shared
        self.out.extend(self._call(acc.flush, reset=True))
        self.epoch_box[0] = ev.epoch
        restore = shared.restore
        if restore is not None and ev.epoch == restore.epoch and self.index in restore.carries:  # noqa: SIM102 - the inner if pushes rows
            # Replay restore: the rows this stage carried into the epoch being replayed.
            if self._call(acc.push, restore.carries[self.index]):
                raise PipelineError(
                    f"operator {self.op.op_name()!r}: its carried rows produced output when pushed "
                    "into a fresh accumulator; carry() must return only rows that stay buffered."
                )
        carried = acc.carry()
        if carried is not None and carried.num_rows:
            shared.carries.setdefault(ev.epoch, {})[self.index] = carried
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
                if isinstance(piece, _LazyRows):
                    piece, _ = piece.head(piece.num_rows)
                out.extend(self._call(acc.push, piece))
                inbox.popleft()
            while out:
                yield out.popleft()
        out.extend(self._call(acc.flush, reset=True, end=True))
        while out:
            yield out.popleft()

    def inbox_refs(self) -> pa.Table | None:
        parts = [p.refs if isinstance(p, _LazyRows) else F.refs_of(p) for p in self.inbox if p.num_rows]
        return F.concat_frames(parts) if parts else None


_END = object()


class Collector:
    """Cuts a lane's rows into batches (or single records). ``pending``: entries
    ``[frame, epoch, source_state, index in the epoch of the frame's first row, carries]``."""

    def __init__(
        self,
        engine: Engine,
        shared: LaneShared,
        upstream: Iterator[Any],
        epoch: int,
        skip: int,
        source_state: Mapping[str, Any],
    ) -> None:
        self.engine = engine
        self.shared = shared
        self.upstream = upstream
        self.epoch = epoch
        self.skip = skip
        self.state = source_state
        self.pending: deque[list[Any]] = deque()
        self.restored_schema: pa.Schema | None = None

    def restore_pending(self, rows: _LazyRows) -> None:
        """After a restore: the rows not yet in a batch, by reference (computed when taken)."""
        self.restored_schema = rows.schema
        if rows.num_rows:
            self.pending.append([rows, self.epoch, self.state, 0, self._epoch_reached(self.epoch)])

    def payload_schema(self) -> pa.Schema | None:
        """The payload schema of the rows not yet in a batch (what recomputing them gives)."""
        for entry in self.pending:
            if not isinstance(entry[0], _LazyRows):
                return F.payload_of(entry[0]).schema
        return self.restored_schema

    def pending_rows(self) -> list[pa.Table]:
        """References of the rows not yet in a batch, oldest first."""
        return [e[0].refs if isinstance(e[0], _LazyRows) else F.refs_of(e[0]) for e in self.pending if e[0].num_rows]

    def __iter__(self) -> Iterator[LaneItem]:
        """The lane's items; their rows are counted in the realized mixture as they reach the
        batcher (`zephon_columnar.engine.realized`)."""
        engine = self.engine
        lane = self.shared.ctx.lane
        batch = engine.plan.batch
        size = batch.microbatch_size if batch else 1
        fields = engine.fields
        by_input = engine.resume_by_input
        pending = self.pending
        pending_rows = sum(e[0].num_rows for e in pending)
        epoch, state, skip = self.epoch, self.state, self.skip
        carries = self._epoch_reached(epoch)
        rows_in_epoch = 0
        while batch is not None and pending_rows >= size:
            yield _take_batch(lane, pending, size, by_input, fields)
            pending_rows -= size
        for ev in self.upstream:
            if isinstance(ev, EpochStart):
                if skip and ev.epoch != self.epoch:
                    raise self._replay_overrun(skip)
                epoch, state, rows_in_epoch = ev.epoch, ev.source_state, 0
                carries = self._epoch_reached(epoch)
                continue
            frame: pa.Table = ev
            if skip:
                # Replay restore: drop the rows of the replayed epoch that were already delivered.
                dropped = min(skip, frame.num_rows)
                frame = frame.slice(dropped)
                skip -= dropped
                rows_in_epoch += dropped
            if frame.num_rows == 0:
                continue
            self.shared.mixture.delivered(frame)  # counted whole frames at a time (a batch's worth waits)
            pending.append([frame, epoch, state, rows_in_epoch, carries])
            rows_in_epoch += frame.num_rows
            pending_rows += frame.num_rows
            if batch is None:
                yield from _drain_records(lane, pending, by_input, fields)
                pending_rows = 0
                continue
            while pending_rows >= size:
                yield _take_batch(lane, pending, size, by_input, fields)
                pending_rows -= size
        if skip:
            raise self._replay_overrun(skip)
        if batch is None:
            yield from _drain_records(lane, pending, by_input, fields)
        elif pending_rows and not batch.drop_last:
            yield _take_batch(lane, pending, pending_rows, by_input, fields)
        elif pending_rows:
            self._dropped_final_rows(pending_rows, size)

    def _dropped_final_rows(self, rows: int, size: int) -> None:
        """``drop_last=True`` (Zephon's default) at the end of the lane: the rows short of a batch
        are counted, and noted: a routine tail (`zephon_columnar.losses`)."""
        ctx = self.shared.ctx
        ctx.stats[DROPPED_FINAL_ROWS] = ctx.stats.get(DROPPED_FINAL_ROWS, 0) + rows

        def text(c: Mapping[str, int], scope: str) -> str:
            dropped, batched = c.get(DROPPED_FINAL_ROWS, 0), c.get(ROWS_BATCHED, 0)
            return (
                f"batch({size}) dropped {dropped} of {batched} rows ({share_text(dropped, batched)}) {scope}: each "
                "lane's last rows short of a batch (drop_last=True, the default). Counted in metrics_snapshot() as "
                f"{DROPPED_FINAL_ROWS}; pass batch({size}, drop_last=False) to get them as a short batch."
            )

        def share(c: Mapping[str, int]) -> float:
            return c.get(DROPPED_FINAL_ROWS, 0) / max(1, c.get(ROWS_BATCHED, 0))

        notice = Notice(kind=DROPPED_FINAL_ROWS, category=PassTailWarning, text=text, share=share)
        ctx.notices.note(notice, ctx.stats, lane=ctx.lane)

    def _epoch_reached(self, epoch: int) -> Mapping[int, pa.Table]:
        return self.shared.epoch_reached(epoch, epoch * self.engine.plan.flush_every)

    def _replay_overrun(self, left: int) -> CheckpointError:
        return CheckpointError(
            f"checkpoint lane {self.shared.ctx.lane}: {self.skip} rows of flush epoch {self.epoch} were delivered, "
            f"it says, but replaying the epoch gives {self.skip - left}; the checkpoint is corrupt or belongs to other "
            "data."
        )


def _take_batch(lane: int, pending: deque, size: int, by_input: bool, fields: Any) -> LaneItem:
    parts = []
    need = size
    while need:
        entry = pending[0]
        frame = entry[0]
        if isinstance(frame, _LazyRows):  # restored rows held by reference: compute what is needed
            frame, rest = frame.head(min(need, frame.num_rows))
            if rest is not None:
                pending.insert(1, [rest, *entry[1:]])
            entry[0] = frame
        if frame.num_rows <= need:
            parts.append(frame)
            need -= frame.num_rows
            pending.popleft()
            last = entry[1], entry[2], entry[3] + frame.num_rows, entry[4]
        else:
            parts.append(frame.slice(0, need))
            entry[0] = frame.slice(need)
            entry[3] += need
            last = entry[1], entry[2], entry[3], entry[4]
            need = 0
    table = parts[0] if len(parts) == 1 else F.concat_frames(parts)
    epoch, state, rows, carries = last
    batch = SampleBatch(table, fields=fields or None)
    if by_input:
        # The last row's offset (ChunkedArray indexing: a filter may leave empty chunks).
        inputs = parts[-1].column(F.OFFSET)[-1].as_py() + 1
        return LaneItem(lane, batch, table, epoch, inputs, 0, state, carries)
    return LaneItem(lane, batch, table, epoch, 0, rows, state, carries)


def _drain_records(lane: int, pending: deque, by_input: bool, fields: Any) -> Iterator[LaneItem]:
    """Every pending row as a record. The entry keeps what is left of its frame, so a checkpoint
    taken between two records sees the rows not yet delivered."""
    while pending:
        entry = pending[0]
        if isinstance(entry[0], _LazyRows):
            entry[0], _ = entry[0].head(entry[0].num_rows)
        frame, epoch, state, first, carries = entry
        for i, rec in enumerate(records_of(frame, fields or None)):
            entry[0], entry[3] = frame.slice(i + 1), first + i + 1
            inputs, rows = (rec.meta.chunk_offset + 1, 0) if by_input else (0, first + i + 1)
            yield LaneItem(lane, rec, frame.slice(i, 1), epoch, inputs, rows, state, carries)
        pending.popleft()


#: Lane counter: rows ``batch(drop_last=True)`` dropped at the ends of lanes, short of a batch.
DROPPED_FINAL_ROWS = "batch_dropped_final_rows"


# ---------------------------------------------------------------------- the chain
class LaneChain:
    """A lane's source, steps (aligned with the plan's stages) and collector."""

    def __init__(
        self, engine: Engine, lane: int, start: LaneCursor | LaneSnapshot, runner: Runner, notices: Notices
    ) -> None:
        self.engine = engine
        self.lane = lane
        self.runner = runner
        self.restored_from = start if isinstance(start, LaneSnapshot) else None
        ws = engine.ws.clone_for_lane(lane, engine.canonical_replicas)
        k = engine.plan.flush_every
        per_item = engine.plan.batch.microbatch_size if engine.plan.batch is not None else 1
        if isinstance(start, LaneSnapshot):
            resume = start.resume
            ws.load_state_dict(resume.source_state)
            self.shared = LaneShared(lane, ws, None, per_item, notices, engine.canonical_replicas)
            self.shared.fresh = False
            self.shared.targets.update(start.targets)
            self.shared.exhaustion.update(start.exhaustion)
            self.source = Source(engine, self.shared, ws, resume.chunk, resume.offset, resume.marker)
            epochs = _epochs_at(start, k)
            epoch, skip, state = epochs[-1], 0, resume.source_state
        else:
            ws.load_state_dict(start.source_state)
            self.shared = LaneShared(lane, ws, start, per_item, notices, engine.canonical_replicas)
            self.shared.fresh = start.items == 0
            self.source = Source(engine, self.shared, ws, start.epoch * k, start.inputs, True)
            epoch, skip, state = start.epoch, start.rows, start.source_state
            epochs = [epoch] * (len(engine.plan.stages) + 1)  # by ordered stage, then the collector
        self.items = start.items
        self.regen = Regenerator(self)
        # A runner that computes at submit time: anything it ran ahead would only delay the item
        # being asked for.
        window = 0 if runner.traits.computes_at_submit else engine.options.resolved_queue_capacity()
        events: Iterator[Any] = iter(self.source)
        self.steps: list[ParallelStep | OrderedStep] = []
        parallel_index = 0
        ordered_index = 0
        for pos, stage in enumerate(engine.plan.stages):
            if isinstance(stage, ParallelStage):
                step: ParallelStep | OrderedStep = ParallelStep(events, runner, parallel_index, window)
                parallel_index += 1
            else:
                epoch_box = [epochs[ordered_index]]  # the stage's own flush epoch, moved on by its OrderedStep
                acc = stage.op.lane_accumulator(dataclasses.replace(self.shared.ctx, flush_epoch=_first_of(epoch_box)))
                queued = inbox = None
                if isinstance(start, LaneSnapshot):
                    saved = start.stages[ordered_index]
                    source = self.regen.source_for(pos)
                    _restore_accumulator(acc, saved, source, lane=lane, stage=ordered_index, op=stage.op.op_name())
                    queued = [
                        EpochStart(e.epoch, {})
                        if isinstance(e, EpochMarker)
                        else _LazyRows(e.refs, self._transit_source(pos, e.schema), e.schema)
                        for e in saved.queue
                    ]
                    if saved.inbox is not None:
                        size = OrderedStep.INPUT_SLICE
                        inbox = [
                            _LazyRows(saved.inbox.slice(i, size), source) for i in range(0, saved.inbox.num_rows, size)
                        ]
                step = OrderedStep(events, stage.op, pos, self.shared, acc, queued, inbox, epoch_box)
                ordered_index += 1
            step.metrics, step.lane = runner.metrics, lane  # execution tracking
            self.steps.append(step)
            events = iter(step)
            if pos == 0:
                assert isinstance(step, ParallelStep)  # fetch is always first
                self.guard = EmptyPassGuard(
                    events, step, lane, self.shared.ctx.rows_per_pass, only_lane=self.shared.ctx.lanes == 1
                )
                events = iter(self.guard)
        self.collector = Collector(engine, self.shared, events, epoch, skip, state)
        self.source.resume_floor = self._resume_floor
        if isinstance(start, LaneSnapshot) and start.pending is not None:
            held = start.pending
            self.collector.restore_pending(
                _LazyRows(held.refs, self._transit_source(len(engine.plan.stages) - 1, held.schema), held.schema)
            )

    def __iter__(self) -> Iterator[LaneItem]:
        return iter(self.collector)

    def _transit_source(self, pos: int, schema: pa.Schema | None) -> Callable[[pa.Table], pa.Table]:
        return lambda refs: self.regen.outputs_of(pos, refs, schema)

    # ------------------------------------------------------------------ snapshot
    def _resume_floor(self) -> int:
        """The oldest chunk `snapshot` could resume from now or later: rows only move downstream,
        so the positions it chooses from (the collector's first row, the first ordered stage's
        first input, the first row in flight, the source's next row) never move back. Rows a
        restore holds by reference are not counted: a snapshot keeps them by reference."""
        chunks = [self.source.next_position[0]]
        inflight = self.steps[0].in_transit() if isinstance(self.steps[0], ParallelStep) else []
        if inflight:
            chunks.append(self.source.position_of(inflight[0])[0])
        head = self.steps[1] if len(self.steps) > 1 and isinstance(self.steps[1], OrderedStep) else None
        held = [
            list(head.inbox) if head is not None else [],
            [e[0] for e in self.collector.pending] if self.engine.resume_by_input else [],
        ]
        for rows in held:
            first = next((r for r in rows if not isinstance(r, _LazyRows) and r.num_rows), None)
            if first is not None:
                chunks.append(self.source.position_of(first)[0])
        return min(chunks)

    def _rewound(self, items: int) -> LaneSnapshot | None:
        """The whole lane as a source position, when it is one stateless one-row-per-sample stage
        and an accumulator that implements `Rewinds` (today the uncapped wrap packer: see
        `LanePacker.rewind`). None otherwise."""
        steps, plan = self.steps, self.engine.plan
        ordered = [s for s in steps if isinstance(s, OrderedStep)]
        if len(ordered) != 1 or len(steps) < 2 or steps[1] is not ordered[0]:
            return None
        packer = ordered[0].acc
        if not (isinstance(packer, Rewinds) and packer.can_rewind()) or any(
            op.traits().fans_out for op in plan.fetch_stage().ops
        ):
            return None
        if packer.skip_pending() and self.restored_from is not None:
            # Restored by rewinding and no document pushed since: the packer is where that
            # checkpoint put it (its skip included), and the only rows in the lane are what the
            # restore held for the collector (a rewound snapshot has nothing in transit).
            rows = self.collector.pending_rows()
            start = self.restored_from
            return dataclasses.replace(
                start,
                items=items,
                stages=tuple(dataclasses.replace(s, inbox=None, queue=()) for s in start.stages),
                pending=HeldRows(refs=F.concat_frames(rows), schema=self.collector.payload_schema()) if rows else None,
            )
        # The oldest row of the packer not delivered yet: in the collector, then in transit.
        after = steps[2] if len(steps) > 2 else None
        downstream = self.collector.pending_rows() + [
            F.refs_of(ev)
            for ev in (after.in_transit() if isinstance(after, ParallelStep) else []) + list(ordered[0].out)
            if isinstance(ev, pa.Table) and ev.num_rows
        ]
        where, state = packer.rewind(downstream[0] if downstream else None)
        if where is None:
            return None
        chunk, offset = where
        if chunk not in self.source.states:
            return None  # too far back to regenerate cheaply: held by reference instead
        resume = ResumePoint(chunk=chunk, offset=offset, marker=False, source_state=self.source.states[chunk])
        return LaneSnapshot(
            items=items,
            resume=resume,
            stages=(StageState(state=state, rows=None, inbox=None, queue=()),),
            pending=None,
            targets={},
            exhaustion={},
        )

    def snapshot(self, items: int) -> LaneSnapshot:
        """This lane's state between two deliveries (see the module docstring)."""
        rewound = self._rewound(items)
        if rewound is not None:
            return rewound
        steps = self.steps
        first = steps[0]
        assert isinstance(first, ParallelStep)  # fetch is always first
        inflight = first.in_transit()
        rows = self.collector.pending_rows()
        head = steps[1] if len(steps) > 1 and isinstance(steps[1], OrderedStep) else None
        inbox = [p for p in head.inbox if p.num_rows] if head is not None else []
        one_to_one = not any(op.traits().fans_out for op in self.engine.plan.fetch_stage().ops)
        # Rows a restore put back by reference come from before this run's first chunk, where the
        # source has no state: they stay references, and the lane resumes after them.
        at = None
        if self.engine.resume_by_input and rows:
            # No state and at most one row per input: the first row not yet in a batch says where
            # to resume, and nothing needs to be held by reference.
            at = self.source.position_of(rows[0])
            if self.source.knows_state_before(at[0]):
                rows = []
            else:
                at = None
        if at is None and one_to_one and inbox:
            # The first ordered stage's unpushed input maps to source positions: resume there.
            at = self.source.position_of(inbox[0].refs if isinstance(inbox[0], _LazyRows) else inbox[0])
            if self.source.knows_state_before(at[0]):
                head = None
            else:
                at = None
        if at is None:
            at = self.source.position_of(inflight[0]) if inflight else self.source.next_position
        chunk, offset, marker = at
        resume = ResumePoint(chunk=chunk, offset=offset, marker=marker, source_state=self.source.state_before(chunk))
        stages = []
        for pos, step in enumerate(steps):
            if not isinstance(step, OrderedStep):
                continue
            state, held = step.acc.snapshot()
            transit = list(step.out)
            following = steps[pos + 1] if pos + 1 < len(steps) else None
            if isinstance(following, ParallelStep):
                transit = following.in_transit() + transit
            stages.append(
                StageState(
                    state=state,
                    rows=held,
                    inbox=None if step is steps[1] and head is None else step.inbox_refs(),
                    queue=tuple(_queue_entry(ev) for ev in transit if isinstance(ev, EpochStart) or ev.num_rows),
                )
            )
        pending = HeldRows(refs=F.concat_frames(rows), schema=self.collector.payload_schema()) if rows else None
        targets, exhaustion = {}, {}
        if any(isinstance(s.acc, ReadsChunkTargets) for s in steps if isinstance(s, OrderedStep)):
            # Rows still in the lane come from chunks at or after the oldest one they name.
            named = (
                [t for s in stages for t in (s.rows, s.inbox) if t is not None]
                + [e.refs for s in stages for e in s.queue if isinstance(e, HeldRows)]
                + ([pending.refs] if pending is not None else [])
            )
            oldest = min([int(pc.min(t.column(F.CHUNK)).as_py()) for t in named if t.num_rows] + [chunk])
            targets = {c: t for c, t in self.shared.targets.items() if c >= oldest}
            exhaustion = {c: e for c, e in self.shared.exhaustion.items() if c >= oldest}
        return LaneSnapshot(
            items=items, resume=resume, stages=tuple(stages), pending=pending, targets=targets, exhaustion=exhaustion
        )


def _epochs_at(snapshot: LaneSnapshot, k: int) -> list[int]:
    """The flush epoch each ordered stage of a restored lane is in, then the collector's. The
    source resumes in ``chunk // k`` (one before, when that epoch's marker has yet to go out);
    what follows a stage is in the same epoch, unless a marker is queued between them: then it
    is still in the epoch before that marker."""
    resume = snapshot.resume
    epoch = max(0, resume.chunk // k - int(resume.marker))
    epochs = [epoch]
    for stage in snapshot.stages:  # what ordered stage j emitted, in front of the next one
        markers = [e.epoch for e in stage.queue if isinstance(e, EpochMarker)]
        epochs.append(markers[0] - 1 if markers else epochs[-1])
    return epochs


def _queue_entry(ev: Any) -> QueueEntry:
    if isinstance(ev, EpochStart):
        return EpochMarker(epoch=ev.epoch)
    if isinstance(ev, _LazyRows):  # restored and not passed on yet: still references
        return HeldRows(refs=ev.refs, schema=ev.schema)
    return HeldRows(refs=F.refs_of(ev), schema=F.payload_of(ev).schema)


def _restore_accumulator(acc: Any, saved: StageState, source: Any, *, lane: int, stage: int, op: str) -> None:
    """``acc.restore`` from a checkpoint's stage state. Restore checked the checkpoint's shape
    and digest; a state an accumulator still cannot read (written by hand, or by a bug) is a
    `CheckpointError` naming the stage, not the accumulator's own KeyError or TypeError."""
    where = f"checkpoint lanes.{lane}.stages[{stage}] ({op!r})"
    try:
        acc.restore(dict(saved.state), saved.rows, source)
        # What a well-formed state restores to snapshots back as it was written; a value the
        # accumulator read another way (a fraction taken as an int, a field it ignored) does not.
        state, rows = acc.snapshot()
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, AssertionError, OverflowError) as err:
        raise CheckpointError(
            f"{where}: its state cannot be restored ({type(err).__name__}: {err}); the checkpoint "
            "is damaged or was written by another version."
        ) from err
    if _canonical(state) != _canonical(saved.state) or not _same_refs(rows, saved.rows):
        raise CheckpointError(
            f"{where}: its state does not read back as written ({_canonical(saved.state)[:200]} "
            f"restores as {_canonical(state)[:200]}); the checkpoint is damaged."
        )


def _canonical(state: Any) -> str:
    return json.dumps(state, sort_keys=True, default=repr)


def _same_refs(a: pa.Table | None, b: pa.Table | None) -> bool:
    if a is None or b is None or not a.num_rows or not b.num_rows:
        return (a is None or not a.num_rows) and (b is None or not b.num_rows)
    return (
        a.num_rows == b.num_rows
        and set(a.column_names) == set(b.column_names)
        and a.select(b.column_names).equals(b, check_metadata=False)
    )


class Regenerator:
    """Computes rows again from their references, through the plan's operators: what restore
    uses for rows in transit and for the rows ordered stages hold."""

    def __init__(self, chain: LaneChain) -> None:
        self.chain = chain
        self.plan = chain.engine.plan
        index, self.parallel_index = 0, {}
        for pos, stage in enumerate(self.plan.stages):
            if isinstance(stage, ParallelStage):
                self.parallel_index[pos] = index
                index += 1

    def source_for(self, pos: int) -> Callable[..., pa.Table]:
        """Rows at the input of the stage at plan position ``pos``, from their references (and,
        for packed rows, their payload schema)."""
        return lambda refs, schema=None: self.outputs_of(pos - 1, refs, schema)

    def outputs_of(self, pos: int, refs: pa.Table, schema: pa.Schema | None = None) -> pa.Table:
        """Rows at the output of the stage at plan position ``pos`` (-1: the source's pointer
        frames), in the order of ``refs``."""
        if pos < 0:
            return _pointer_rows(refs, self.chain.lane)
        stage = self.plan.stages[pos]
        if isinstance(stage, ParallelStage):
            before = self.outputs_of(pos - 1, refs, schema)
            runner = self.chain.runner
            rows = runner.result(runner.submit(self.parallel_index[pos], before))
            return _select(rows, refs, what=", ".join(op.op_name() for op in stage.ops))
        step = self.chain.steps[pos] if pos < len(self.chain.steps) else None
        acc = step.acc if isinstance(step, OrderedStep) else stage.op.lane_accumulator(self.chain.shared.ctx)
        if not restorable_by_reference(acc):  # the engine checkpoints by reference only where it is
            raise RuntimeError(f"{stage.op.op_name()}: its accumulator cannot rebuild rows from references.")
        return acc.rebuild(refs, schema, self.source_for(pos))


def _pointer_rows(refs: pa.Table, lane: int) -> pa.Table:
    """Pointer frames of the source samples ``refs`` come from (each sample once)."""
    chunk = refs.column(F.CHUNK).to_numpy().astype(np.int64)
    offset = refs.column(F.OFFSET).to_numpy().astype(np.int64)
    key = chunk << 32 | offset
    _, first = np.unique(key, return_index=True)
    first = np.sort(first)
    base = refs.select([c for c in F.BOOKKEEPING if c in refs.column_names]).take(pa.array(first))
    if F.LANE not in base.column_names:
        base = base.append_column(F.LANE, pa.array(np.full(base.num_rows, lane, np.int32)))
    return base.select(list(F.BOOKKEEPING)).cast(F.BOOKKEEPING_SCHEMA)


def _keys(frame: pa.Table) -> list[tuple]:
    """Exact identities of rows: (chunk, offset, lineage, first segment's start)."""
    chunk = frame.column(F.CHUNK).to_pylist()
    offset = frame.column(F.OFFSET).to_pylist()
    lineage = F.lineage_paths(frame)
    if "__segments" in frame.column_names:
        first = [s[0]["start"] if s else -1 for s in frame.column("__segments").to_pylist()]
    else:
        first = [-1] * frame.num_rows
    return list(zip(chunk, offset, lineage, first))


def _select(rows: pa.Table, refs: pa.Table, *, what: str) -> pa.Table:
    """The rows of ``rows`` that ``refs`` name, in the order of ``refs``."""
    if (
        rows.num_rows == refs.num_rows
        and rows.column(F.CHUNK).equals(refs.column(F.CHUNK))
        and rows.column(F.OFFSET).equals(refs.column(F.OFFSET))
        and all(np.array_equal(a, b) for a, b in zip(F.lineage_parts(rows), F.lineage_parts(refs)))
    ):
        return rows  # the same rows in the same order (lineage included): nothing to pick
    index = {k: i for i, k in enumerate(_keys(rows))}
    try:
        take = [index[k] for k in _keys(refs)]
    except KeyError as err:
        raise CheckpointError(
            f"restore: a row the checkpoint holds by reference (chunk, offset, lineage = {err.args[0][:3]}) did "
            f"not come out of {what} again; these operators are not deterministic, or the data changed since "
            "the checkpoint was taken."
        ) from None
    return rows.take(pa.array(np.array(take, np.int64)))


def _first_of(box: list[int]) -> Callable[[], int]:
    """Reads ``box[0]`` when called: a value the caller moves on in place."""
    return lambda: box[0]
