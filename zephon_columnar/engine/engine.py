"""The engine: lanes -> stages -> tail, on a runner, with exact checkpoints.

For every lane a data-parallel group owns, the engine builds one ordered stream:

    source events (pointer frames, epoch starts every K chunks)
      -> parallel stages (fetch, maps, ...; on the runner, re-sequenced by `ordered_map`)
      -> ordered stages (per-lane accumulators, flushed and reset at every epoch start)
      -> collector (cuts the lane's rows into batches, or single records)

The tail serves lanes round robin (fewest items first), in the caller's thread unless
``prefetch_batches`` is set (then a prefetch thread runs it ahead of the caller into a queue of
that many items). Every delivered item carries its lane cursor; the caller-side iterator keeps
the last one per lane, which is all a checkpoint needs (see `replay.py`).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import numpy as np
import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.engine.channel import Channel
from zephon_columnar.engine.lanes import next_lane, owned_lanes
from zephon_columnar.engine.plan import ParallelStage, Plan, compile_plan
from zephon_columnar.engine.replay import LaneCursor
from zephon_columnar.engine.runners import RUNNERS, ordered_map
from zephon_columnar.errors import PipelineError, ZephonError, operator_failure
from zephon_columnar.io.readers import ReaderPool
from zephon_columnar.ops.accumulators import LaneContext
from zephon_columnar.ops.base import BaseOp
from zephon_columnar.ops.fetch import FetchOp
from zephon_columnar.options import RuntimeOptions
from zephon_columnar.types import SampleBatch, records_of
from zephon_columnar.work.base import WorkSource

#: Rows of a lane's first frame when it cannot be one batch; frames grow 4x up to the fetch
#: batch size.
FIRST_FRAME_ROWS = 64


@dataclass(frozen=True)
class EpochStart:
    """Marker: the lane's flush epoch ``epoch`` starts here; the work source was in
    ``source_state`` before its first chunk. Accumulators flush and reset on it."""

    epoch: int
    source_state: Mapping[str, Any]


@dataclass(frozen=True)
class LaneItem:
    lane: int
    value: Any
    epoch: int
    inputs: int
    rows: int
    source_state: Mapping[str, Any]
    carries: Mapping[int, pa.Table]


class _Lane:
    """Per-lane bookkeeping shared by a lane's source, ordered stages and collector: its
    `LaneContext`, the chunks' target mixtures, and the rows each ordered stage carried across
    each flush point (``carries[epoch][stage]``), kept until the collector is past that epoch."""

    def __init__(self, lane: int, ws: WorkSource, restore: LaneCursor) -> None:
        recipe = ws.recipe()
        self.targets: dict[int, Mapping[str, float] | None] = {}
        names = {cid: name for name, cid in ws.component_ids().items()}
        seed = recipe.get("seed", 0) if isinstance(recipe.get("seed", 0), int) else 0
        self.ctx = LaneContext(lane=lane, seed=seed, component_names=names, chunk_target=self.targets.get)
        self.carries: dict[int, dict[int, pa.Table]] = {restore.epoch: dict(restore.carries)}
        self.restore = restore

    def note_chunk(self, chunk_id: int, target: Mapping[str, float] | None, keep: int) -> None:
        self.targets[chunk_id] = target
        self.targets.pop(chunk_id - keep, None)

    def epoch_reached(self, epoch: int) -> Mapping[int, pa.Table]:
        """The collector is in ``epoch``: drop older carries; those of ``epoch``."""
        for e in [e for e in self.carries if e < epoch]:
            del self.carries[e]
        return self.carries.get(epoch, {})


class Engine:
    """Compiled pipeline for one data-parallel group. Cheap to build; `start` runs it."""

    def __init__(self, work_source: WorkSource, ops: list[BaseOp], options: RuntimeOptions,
                 prefetcher: Any = None, lane_subset: list[int] | None = None) -> None:
        self.ws = work_source
        self.ops = ops
        self.options = options
        self.plan: Plan = compile_plan(ops, flush_every_k_chunks=options.flush_every_k_chunks)
        self.canonical_replicas = options.resolved_canonical_replicas()
        self.lanes = owned_lanes(
            canonical_replicas=self.canonical_replicas,
            dp_degree=options.resolved_dp_degree(),
            dp_group_id=options.resolved_dp_group_id(),
            mapping=options.resolved_mapping(),
        )
        if lane_subset is not None:
            # A torch DataLoader worker serves only its share of the rank's lanes.
            subset = set(lane_subset)
            self.lanes = [lane for lane in self.lanes if lane in subset]
        fetch = next((op for op in ops if isinstance(op, FetchOp)), None)
        self.rows_per_frame = fetch.max_batch if fetch else 1024
        self.prefetcher = prefetcher
        # Without state, and with at most one output row per input row, a delivered row's offset
        # in its chunk says where to resume: restore then reads nothing it already delivered.
        self.resume_by_input = not self.plan.stateful and not any(
            getattr(op, "fans_out", True) for stage in self.plan.parallel_stages() for op in stage.ops)
        self.fields = _fields_by_dataset(work_source.datasets_by_id)

    # ------------------------------------------------------------------ description
    def recipe(self) -> dict[str, Any]:
        return {
            "work_source": self.ws.recipe(),
            "canonical_replicas": self.canonical_replicas,
            "flush_every_k_chunks": self.plan.flush_every if self.plan.stateful else None,
            "ops": self.plan.fingerprint(),
        }

    def world(self) -> dict[str, Any]:
        o = self.options
        return {"canonical_replicas": self.canonical_replicas, "world_size": o.world_size,
                "global_rank": o.global_rank, "dp_degree": o.resolved_dp_degree(),
                "dp_group_id": o.resolved_dp_group_id(), "mapping": o.resolved_mapping()}

    def workers(self) -> int:
        stages = self.plan.parallel_stages()
        want = max((s.parallelism for s in stages), default=1)
        return max(1, min(want, self.options.resolved_max_workers()))

    def explain(self) -> str:
        runner = self.options.resolved_runner()
        parts = []
        for i, stage in enumerate(self.plan.stages):
            if isinstance(stage, ParallelStage):
                ops = " -> ".join(f"{op.op_name()}@p{op.traits().parallelism}" for op in stage.ops)
                parts.append(f"Stage[{i}] {runner} x{self.workers()} window={self.options.resolved_queue_capacity()}: {ops}")
            else:
                parts.append(f"Stage[{i}] ordered per lane: {stage.op.op_name()}")
        if self.plan.batch is not None:
            parts.append(f"Collect: batch({self.plan.batch.microbatch_size}, drop_last={self.plan.batch.drop_last})")
        else:
            parts.append("Collect: records")
        ahead = (f"prefetch thread {self.options.prefetch_batches} items ahead"
                 if self.uses_prefetch_thread() else "no prefetch thread")
        tail = (f"Tail: lanes {self.lanes} of canonical_replicas={self.canonical_replicas}, flush every "
                f"{self.plan.flush_every} chunk(s), resume by {'input' if self.resume_by_input else 'replay'}, "
                f"{ahead}")
        return "\n".join(parts + [tail])

    def uses_prefetch_thread(self) -> bool:
        """Whether a thread runs the tail ahead of the caller: only when asked for with
        ``prefetch_batches`` (and a runner other than inline).

        Ordered stages and the batch cut are Python work that holds the GIL: on a thread of
        their own they compete with the caller for it. Measured (benchmarks/RESULTS.md) with
        ``to_training`` as the consumer, the pre-tokenized pack job ran ~15% slower with the
        thread and the tokenizing job the same; workers already read ahead
        (``op_queue_capacity`` frames per lane). A consumer that releases the GIL for long
        stretches (a training step) may still gain from it.
        """
        return self.options.prefetch_batches is not None and self.options.resolved_runner() != "inline"

    # ------------------------------------------------------------------ running
    def initial_cursor(self, lane: int) -> LaneCursor:
        ws = self.ws.clone_for_lane(lane, self.canonical_replicas)
        return LaneCursor(epoch=0, rows=0, items=0, source_state=ws.state_dict())

    def start(self, cursors: Mapping[int, LaneCursor] | None = None) -> "EngineRun":
        cursors = dict(cursors or {})
        for lane in self.lanes:
            if lane not in cursors:
                cursors[lane] = self.initial_cursor(lane)
        return EngineRun(self, cursors)

    def lane_stream(self, lane: int, cursor: LaneCursor, runner: Any) -> Iterator[LaneItem]:
        ws = self.ws.clone_for_lane(lane, self.canonical_replicas)
        ws.load_state_dict(cursor.source_state)
        state = _Lane(lane, ws, cursor)
        events: Iterator[Any] = self._source_events(state, ws, cursor.epoch, cursor.inputs)
        # The inline runner computes at submit time: anything it ran ahead would only delay the
        # item being asked for.
        inline = self.options.resolved_runner() == "inline"
        window = 0 if inline else self.options.resolved_queue_capacity()
        parallel_index = 0
        for index, stage in enumerate(self.plan.stages):
            if isinstance(stage, ParallelStage):
                events = ordered_map(events, runner, parallel_index, window)
                parallel_index += 1
            else:
                events = _ordered_stage(events, stage.op, index, state)
        return self._collect(state, events, cursor.epoch, cursor.rows)

    def _source_events(self, state: _Lane, ws: WorkSource, epoch: int, skip_inputs: int = 0) -> Iterator[Any]:
        lane = state.ctx.lane
        k = self.plan.flush_every
        comp_ids = ws.component_ids()
        # The first frames of a pass (or after a restore) are small and grow 4x to rows_per_frame,
        # so the first batch waits for the rows it needs, not a whole frame. Frame sizes never
        # change the data.
        first = FIRST_FRAME_ROWS
        if self.plan.batch is not None and not self.plan.stateful:
            first = self.plan.batch.microbatch_size
        step = min(self.rows_per_frame, first)
        for chunk_id, source_state, chunk in self._chunks_ahead(ws, epoch * k):
            if source_state is not None:
                yield EpochStart(chunk_id // k, source_state)
            # What the source aimed for, else what the chunk holds (ensure_mixture's target).
            state.note_chunk(chunk_id, chunk.target_mixture or chunk.mixture, keep=4 * k)
            pointers, comp_index = chunk.ordered()
            comp_map = np.array([comp_ids[name] for name in chunk.component_names], dtype=np.int32)
            components = comp_map[comp_index] if len(comp_index) else np.zeros(0, np.int32)
            n = len(pointers)
            start, skip_inputs = min(skip_inputs, n), 0  # restore: pointers already delivered
            while start < n:
                end = min(n, start + step)
                yield F.pointer_frame(lane=lane, chunk_id=chunk_id, offsets=np.arange(start, end),
                                      pointers=pointers[start:end], components=components[start:end])
                start = end
                step = min(self.rows_per_frame, step * 4)

    def _chunks_ahead(self, ws: WorkSource, chunk_id: int) -> Iterator[tuple[int, Any, Any]]:
        """(chunk_id, source state if the chunk starts an epoch else None, chunk), pulled up to
        the prefetcher's ``buffer_size`` samples ahead so remote shards download early."""
        k = self.plan.flush_every
        ahead = self.prefetcher.buffer_size if self.prefetcher is not None else 0
        buffered: deque[tuple[int, Any, Any]] = deque()
        samples = 0
        exhausted = False
        while True:
            while not exhausted and (not buffered or samples < ahead):
                state = ws.state_dict() if chunk_id % k == 0 else None
                chunk = ws.next_chunk()
                if chunk is None:
                    exhausted = True
                    break
                if self.prefetcher is not None:
                    self.prefetcher.warm(np.concatenate([np.asarray(v).reshape(-1, 3) for v in chunk.components.values()]))
                buffered.append((chunk_id, state, chunk))
                samples += len(chunk)
                chunk_id += 1
            if not buffered:
                return
            item = buffered.popleft()
            samples -= len(item[2])
            yield item

    def _collect(self, lane_state: _Lane, events: Iterator[Any], epoch: int, skip: int) -> Iterator[LaneItem]:
        lane = lane_state.ctx.lane
        batch = self.plan.batch
        size = batch.microbatch_size if batch else 1
        fields = self.fields
        # pending: [frame, epoch, source_state, index in epoch of the frame's first row, carries]
        pending: deque[list[Any]] = deque()
        pending_rows = 0
        state: Mapping[str, Any] = lane_state.restore.source_state
        carries = lane_state.epoch_reached(epoch)
        rows_in_epoch = 0
        for ev in events:
            if isinstance(ev, EpochStart):
                epoch, state, rows_in_epoch = ev.epoch, ev.source_state, 0
                carries = lane_state.epoch_reached(epoch)
                continue
            frame: pa.Table = ev
            if skip:
                # Restore: drop the rows of the replayed epoch that were already delivered.
                dropped = min(skip, frame.num_rows)
                frame = frame.slice(dropped)
                skip -= dropped
                rows_in_epoch += dropped
            if frame.num_rows == 0:
                continue
            pending.append([frame, epoch, state, rows_in_epoch, carries])
            rows_in_epoch += frame.num_rows
            pending_rows += frame.num_rows
            if batch is None:
                for entry in _drain_records(lane, pending, self.resume_by_input, fields):
                    yield entry
                pending_rows = 0
                continue
            while pending_rows >= size:
                yield _take_batch(lane, pending, size, self.resume_by_input, fields)
                pending_rows -= size
        if batch is not None and pending_rows and not batch.drop_last:
            yield _take_batch(lane, pending, pending_rows, self.resume_by_input, fields)


def _fields_by_dataset(datasets: Mapping[int, Any]) -> dict[int, frozenset[str]]:
    """``{dataset_id: payload field names}`` of datasets whose schema is known, when they differ
    (a frame then holds the union, and row views leave out the others' fields)."""
    out = {}
    for did, ds in datasets.items():
        backend = getattr(ds, "backend", {}) or {}
        schema = backend.get("schema")
        if schema is None and backend.get("tables"):
            schema = backend["tables"][0].schema
        if isinstance(schema, pa.Schema):
            out[did] = frozenset(schema.names)
    if len(set(out.values())) <= 1:
        return {}
    return out


def _ordered_stage(events: Iterator[Any], op: BaseOp, index: int, lane: _Lane) -> Iterator[Any]:
    """One lane's ordered stage: its accumulator sees the lane's frames in order, flushes at
    every epoch start (recording what it carries across) and at the end."""
    acc = op.lane_accumulator(lane.ctx)
    assert acc is not None

    def call(fn: Any, *args: Any, **kw: Any) -> list[pa.Table]:
        try:
            return fn(*args, **kw)
        except ZephonError:
            raise
        except Exception as err:
            raise operator_failure(err, f"operator {op.op_name()!r} (ordered stage) failed: "
                                        f"{type(err).__name__}: {err}") from err

    for ev in events:
        if isinstance(ev, EpochStart):
            yield from call(acc.flush, reset=True)
            if ev.epoch == lane.restore.epoch and index in lane.restore.carries:
                # Restore: the rows this stage carried into the epoch being replayed.
                if call(acc.push, lane.restore.carries[index]):
                    raise PipelineError(f"operator {op.op_name()!r}: its carried rows produced output when "
                                        "pushed into a fresh accumulator; carry() must return only rows that "
                                        "stay buffered.")
            carried = acc.carry()
            if carried is not None and carried.num_rows:
                lane.carries.setdefault(ev.epoch, {})[index] = carried
            yield ev
        else:
            yield from call(acc.push, ev)
    yield from call(acc.flush, reset=True, end=True)


def _take_batch(lane: int, pending: deque, size: int, by_input: bool, fields: Any) -> LaneItem:
    parts = []
    need = size
    while need:
        entry = pending[0]
        frame = entry[0]
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
        return LaneItem(lane, batch, epoch, inputs, 0, state, carries)
    return LaneItem(lane, batch, epoch, 0, rows, state, carries)


def _drain_records(lane: int, pending: deque, by_input: bool, fields: Any) -> Iterator[LaneItem]:
    while pending:
        frame, epoch, state, first, carries = pending.popleft()
        for i, rec in enumerate(records_of(frame, fields or None)):
            if by_input:
                yield LaneItem(lane, rec, epoch, rec.meta.chunk_offset + 1, 0, state, carries)
            else:
                yield LaneItem(lane, rec, epoch, 0, first + i + 1, state, carries)


class _Failure:
    def __init__(self, err: BaseException) -> None:
        self.err = err


_END = object()


class EngineRun:
    """One pass over the stream: an iterator of items with per-lane delivered cursors.

    ``close()`` stops the prefetch thread and the workers promptly; it is called on
    exhaustion, on error and by ``__del__``, and may be called from any thread (a close from
    another thread while the caller is inside ``next()`` is finished by that ``next()``).
    """

    def __init__(self, engine: Engine, cursors: dict[int, LaneCursor]) -> None:
        self.engine = engine
        self.delivered: dict[int, LaneCursor] = dict(cursors)
        self._closed = False  # no more items: asked to stop, finished, or failed
        self._finished = False  # resources released
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._queue: Channel | None = None
        self._thread: threading.Thread | None = None
        runner_kind = engine.options.resolved_runner()
        stages = [s.ops for s in engine.plan.parallel_stages()]
        self._readers = ReaderPool()
        services = {"datasets_by_id": engine.ws.datasets_by_id, "reader_pool": self._readers}
        self._runner = RUNNERS[runner_kind](stages, services, engine.workers())
        try:
            emitted = {lane: cursors[lane].items for lane in engine.lanes}
            streams = {lane: engine.lane_stream(lane, cursors[lane], self._runner) for lane in engine.lanes}
        except BaseException:
            self._runner.close()
            self._readers.close()
            raise
        self._tail = _tail(streams, emitted)
        if engine.uses_prefetch_thread():
            self._queue = Channel(engine.options.resolved_prefetch_batches())
            self._thread = threading.Thread(target=self._pump, name="zephon-prefetch", daemon=True)
            self._thread.start()

    # ------------------------------------------------------------------ background pump
    def _pump(self) -> None:
        q = self._queue
        assert q is not None
        stopped = self._stop.is_set
        try:
            for item in self._tail:
                if not q.put(item, stopped):
                    return
            q.put(_END, stopped)
        except BaseException as err:  # surfaces in the caller's next()
            if not stopped():
                q.put(_Failure(err), stopped)
        finally:
            self._tail.close()

    # ------------------------------------------------------------------ iterator
    def __iter__(self) -> "EngineRun":
        return self

    def __next__(self) -> Any:
        if self._closed:
            raise StopIteration
        try:
            item = next(self._tail) if self._queue is None else self._get()
        except BaseException:
            stopped = self._stop.is_set()
            self.close()
            if stopped:  # closed from another thread: a cancelled wait is not an error
                raise StopIteration from None
            raise
        if self._stop.is_set():
            self.close()
            raise StopIteration
        prev = self.delivered[item.lane]
        self.delivered[item.lane] = LaneCursor(epoch=item.epoch, inputs=item.inputs, rows=item.rows,
                                               items=prev.items + 1, source_state=item.source_state,
                                               carries=item.carries)
        return item.value

    def _get(self) -> LaneItem:
        assert self._queue is not None and self._thread is not None
        try:
            got = self._queue.get(self._thread.is_alive)
        except RuntimeError:
            if self._stop.is_set():
                raise StopIteration from None
            raise PipelineError("the prefetch thread stopped without a result; this is a bug, "
                                "please report it with the pipeline's explain()") from None
        if got is _END:
            raise StopIteration
        if isinstance(got, _Failure):
            raise got.err
        return got

    def close(self) -> None:
        with self._lock:
            if self._finished:
                return
            self._closed = True
            self._stop.set()
            if self._thread is not None:
                # Unblock a pump waiting on a full queue, then let it finish its current item.
                while self._thread.is_alive():
                    self._queue.clear()  # type: ignore[union-attr]
                    self._runner.cancel()
                    self._thread.join(timeout=0.1)
            else:
                try:
                    self._tail.close()
                except ValueError:
                    # The caller is inside next() on another thread: release its wait; that
                    # next() sees the stop flag and finishes this close.
                    self._runner.cancel()
                    return
            self._finished = True
        try:
            self._runner.close()
        finally:
            self._readers.close()
            if self.engine.prefetcher is not None:
                self.engine.prefetcher.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def _tail(streams: dict[int, Iterator[LaneItem]], emitted: dict[int, int]) -> Iterator[LaneItem]:
    active = sorted(streams)
    try:
        while active:
            lane = next_lane(active, emitted)
            try:
                item = next(streams[lane])
            except StopIteration:
                active.remove(lane)
                continue
            emitted[lane] += 1
            yield item
    finally:
        for s in streams.values():
            close = getattr(s, "close", None)
            if close is not None:
                close()
