"""The engine: lanes -> stages -> tail, on a runner, with exact checkpoints.

For every lane a data-parallel group owns, the engine builds one `lane.LaneChain` from its
`LaneSetup` (`Engine.lane_setup`):

    source events (pointer frames, epoch starts every K chunks)
      -> parallel stages (fetch, maps, ...; on the runner, re-sequenced)
      -> ordered stages (per-lane accumulators, flushed at every epoch start)
      -> collector (cuts the lane's rows into batches, or single records)

The tail serves lanes round robin (fewest items first), in the caller's thread unless
``prefetch_batches`` is set (then a prefetch thread runs it ahead of the caller into a queue of
that many items). A checkpoint is taken *by reference* (a snapshot of every lane's chain, see
`engine.lane`) when every ordered stage supports it, else *by replay* from the per-lane cursor of
the last delivered item; `engine.checkpoint.mode` decides which.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import threading
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import Any, cast

import pyarrow as pa

from zephon_columnar.engine.channel import Channel
from zephon_columnar.engine.checkpoint import LaneCursor, LaneState, checkpoint_mode
from zephon_columnar.engine.lane import LaneChain, LaneItem, LaneSetup, lane_start
from zephon_columnar.engine.metrics import Metrics
from zephon_columnar.engine.ownership import next_lane, owned_lanes
from zephon_columnar.engine.pass_report import PassReport, skipped_record_notices
from zephon_columnar.engine.plan import ParallelStage, Plan, compile_plan
from zephon_columnar.engine.runners import DAEMON_STAND_IN, runner_traits, start_runner
from zephon_columnar.errors import ConfigurationWarning, EmptyPassWarning, PipelineError, warn
from zephon_columnar.io.dataset import Dataset
from zephon_columnar.io.readers import ReaderPool
from zephon_columnar.losses import Notices, say, summed
from zephon_columnar.observability.stats import PrefetchTimingTotals
from zephon_columnar.ops.base import BaseOp
from zephon_columnar.ops.fetch import FetchOp, decoded_cache_limit, shard_cache_settings
from zephon_columnar.ops.rows import name_samples
from zephon_columnar.options import RuntimeOptions
from zephon_columnar.work.base import WorkSource

#: Rows per frame when neither ``fetch(max_batch=...)`` nor an operator's ``frame_rows`` says
#: otherwise. A plan without ordered stages gets large frames, up to `STATELESS_FRAME_ROWS`
#: rows and about `STATELESS_FRAME_BYTES` of stored data: most of its engine time is per frame,
#: and its checkpoint is a source position whatever the frame size (benchmarks/RESULTS.md,
#: issue 8). A plan with ordered stages holds the rows in transit by reference, which grows
#: with the frame: `FRAME_ROWS`.
FRAME_ROWS = 512
STATELESS_FRAME_ROWS = 4096
STATELESS_FRAME_BYTES = 2 << 20


class Engine:
    """Compiled pipeline for one data-parallel group. Cheap to build; `start` runs it."""

    def __init__(
        self,
        work_source: WorkSource,
        ops: list[BaseOp],
        options: RuntimeOptions,
        prefetcher: Any = None,
        lane_subset: list[int] | None = None,
    ) -> None:
        self.ws = work_source
        self.ops = ops
        self.options = options
        self.plan: Plan = compile_plan(ops, flush_every_k_chunks=options.flush_every_k_chunks)
        self.canonical_replicas = options.resolved_canonical_replicas()
        self.rank_lanes = owned_lanes(
            canonical_replicas=self.canonical_replicas,
            dp_degree=options.resolved_dp_degree(),
            dp_group_id=options.resolved_dp_group_id(),
            mapping=options.resolved_mapping(),
        )
        self.lanes = list(self.rank_lanes)  # those this engine reads
        if lane_subset is not None:
            # A torch DataLoader worker serves only its share of the rank's lanes.
            subset = set(lane_subset)
            self.lanes = [lane for lane in self.lanes if lane in subset]
        self.prefetcher = prefetcher
        # Without state, with at most one output row per input row, in input order, a delivered
        # row's offset in its chunk says where to resume: restore then reads nothing it already
        # delivered. Otherwise a checkpoint replays from the chunk's start.
        stateless = [op.traits() for stage in self.plan.parallel_stages() for op in stage.ops]
        self.resume_by_input = not self.plan.stateful and all(
            not t.fans_out and t.preserves_cursor_order for t in stateless
        )
        row_bytes = _stored_bytes_per_row(work_source.datasets_by_id.values())
        self.rows_per_frame = frame_rows(ops, stateless=not self.plan.stateful, row_bytes=row_bytes)
        changing = work_source.accepts_mixture_changes()
        chunk = work_source.chunk_size_hint()
        if not self.plan.stateful and chunk:
            # No state to flush, so every K chunks is only a replay point: K = 1 would cap a frame at
            # one chunk (frames never cross a marker); K chunks of one frame's rows keep replay to
            # about a frame. Over a mixture that may change, checkpoints by replay name flush
            # epochs and a change lands on one: K follows the recipe (flush_every_k_chunks, else
            # the data's rows per frame), never a run's fetch size.
            if changing and options.flush_every_k_chunks:
                k = options.flush_every_k_chunks
            else:
                rows = frame_rows(ops, stateless=True, row_bytes=row_bytes, fetch_limit=not changing)
                k = max(1, -(-rows // chunk))
            self.plan = dataclasses.replace(self.plan, flush_every=k)
        self.fields = fields_by_dataset(work_source.datasets_by_id)
        self.checkpoints = checkpoint_mode(self.plan, mixture_changes=work_source.accepts_mixture_changes())

    def lane_setup(self) -> LaneSetup:
        """What each of this engine's lanes is built from."""
        return LaneSetup(
            plan=self.plan,
            work_source=self.ws,
            canonical_replicas=self.canonical_replicas,
            rows_per_frame=self.rows_per_frame,
            resume_by_input=self.resume_by_input,
            fields=self.fields,
            window=self.options.resolved_queue_capacity(),
            prefetcher=self.prefetcher,
        )

    # ------------------------------------------------------------------ description
    def recipe(self) -> dict[str, Any]:
        return {
            "work_source": self.ws.recipe(),
            "canonical_replicas": self.canonical_replicas,
            "flush_every_k_chunks": self.plan.flush_every
            if self.plan.stateful or self.ws.accepts_mixture_changes()
            else None,
            "ops": self.plan.fingerprint(),
        }

    def world(self) -> dict[str, Any]:
        o = self.options
        return {
            "canonical_replicas": self.canonical_replicas,
            "world_size": o.world_size,
            "global_rank": o.global_rank,
            "dp_degree": o.resolved_dp_degree(),
            "dp_group_id": o.resolved_dp_group_id(),
            "mapping": o.resolved_mapping(),
        }

    def workers(self) -> int:
        stages = self.plan.parallel_stages()
        want = max((s.parallelism for s in stages), default=1)
        return max(1, min(want, self.options.resolved_max_workers()))

    def explain(self) -> str:
        runner = self.options.resolved_runner()
        place = runner_traits(runner).place  # Zephon's words for where a stage runs
        parts = []
        for i, stage in enumerate(self.plan.stages):
            if isinstance(stage, ParallelStage):
                ops = [_describe_op(op) for op in stage.ops]
                parts.append(
                    f"Stage[{i}] place={place} runner={runner} x{self.workers()} "
                    f"window={self.options.resolved_queue_capacity()} ops={ops}"
                )
            else:
                parts.append(f"Stage[{i}] place={place} ordered per lane ops=['{stage.op.op_name()}@p1']")
        if self.plan.batch is not None:
            parts.append(
                f"Collect: batch({self.plan.batch.microbatch_size}, drop_last={self.plan.batch.drop_last}) "
                "ops=['batch@p1']"
            )
        else:
            parts.append("Collect: records")
        for op in self.plan.after_batch:
            parts.append(f"Then: map_batch({op.fingerprint()['fn']}, drop_none={op.drop_none}) in the iterating thread")
        ahead = (
            f"prefetch thread {self.options.prefetch_batches} items ahead"
            if self.uses_prefetch_thread()
            else "no prefetch thread"
        )
        ahead += f" (final_prefetch={self.options.prefetch_batches or 0})"
        tail = (
            f"Tail: lanes {self.lanes} of canonical_replicas={self.canonical_replicas}, flush every "
            f"{self.plan.flush_every} chunk(s), {ahead}"
        )
        resume = f"Checkpoints: by {self.checkpoints.by} ({self.checkpoints.reason})"
        placement = f"Placement: every stage on the {runner!r} runner (placement= arguments have no effect)"
        return "\n".join(parts + [tail, resume, placement])

    def uses_prefetch_thread(self) -> bool:
        """Whether a thread runs the tail ahead of the caller: only when asked for with
        ``prefetch_batches`` > 0 (and a runner other than inline; 0 is Zephon's "no prefetch").

        Ordered stages and the batch cut are Python work that holds the GIL: on a thread of
        their own they compete with the caller for it. Measured (benchmarks/RESULTS.md) with
        ``to_training`` as the consumer, the pre-tokenized pack job ran ~15% slower with the
        thread and the tokenizing job the same; workers already read ahead
        (``op_queue_capacity`` frames per lane). A consumer that releases the GIL for long
        stretches (a training step) may still gain from it.
        """
        runs_ahead = not runner_traits(self.options.resolved_runner()).computes_at_submit
        return bool(self.options.prefetch_batches) and runs_ahead

    # ------------------------------------------------------------------ running
    def initial_cursor(self, lane: int) -> LaneCursor:
        ws = self.ws.clone_for_lane(lane, self.canonical_replicas)
        return LaneCursor(
            epoch=0, rows=0, items=0, inputs=0, source_state=ws.state_dict(), carries={}, exhausted=frozenset()
        )

    def start(
        self,
        cursors: Mapping[int, LaneState] | None = None,
        *,
        readers: ReaderPool | None = None,
        says_losses: bool = True,
        in_transit: int = 0,
    ) -> EngineRun:
        """Run from ``cursors`` (the start of every lane not given); ``readers``: the shared
        readers fetch uses (a restore warm-up's, already reading), else fresh ones.
        ``says_losses``: whether the run says what its pass dropped when the pass ends
        (`zephon_columnar.losses`); a side process or a loader worker leaves it to the training
        process (`EngineRun.pass_report`). ``in_transit``: how many items the run's holder may
        have taken and not handed on when it asks for a checkpoint (`EngineRun.snapshot`)."""
        cursors = dict(cursors or {})
        for lane in self.lanes:
            if lane not in cursors:
                cursors[lane] = self.initial_cursor(lane)
        return EngineRun(self, cursors, readers, says_losses=says_losses, in_transit=in_transit)


def fields_by_dataset(datasets: Mapping[int, Any]) -> dict[int, frozenset[str]]:
    """``{dataset_id: payload field names}`` of datasets whose schema is known, when they differ
    (a frame then holds the union, and row views leave out the others' fields)."""
    out = {}
    for did, ds in datasets.items():
        if isinstance(ds, Dataset) and ds.format is not None:
            out[did] = frozenset(ds.schema.names)
    if len(set(out.values())) <= 1:
        return {}
    return out


def deliver(plan: Any, next_value: Callable[[], Any]) -> Any:
    """The next value that passes the plan's ``map_batch`` functions (a value one of them drops
    counts as delivered: the next one is taken)."""
    while True:
        value = next_value()
        for op in plan.after_batch:
            value = op.apply(value)
            if value is None:
                break
        else:
            return value


class _Failure:
    def __init__(self, err: BaseException) -> None:
        self.err = err


def frame_rows(ops: list[BaseOp], *, stateless: bool, row_bytes: float = 0.0, fetch_limit: bool = True) -> int:
    """Rows per frame for ``ops``: ``fetch(max_batch=...)`` when given (and ``fetch_limit``), else the smallest
    ``frame_rows`` an operator prefers, else (see `STATELESS_FRAME_ROWS`) up to 4,096 rows of
    ``row_bytes`` stored bytes each for a plan without ordered stages (``stateless``), else 512.

    Example:
        >>> frame_rows([FetchOp()], stateless=True, row_bytes=300), frame_rows([FetchOp()], stateless=False)
        (4096, 512)
        >>> frame_rows([FetchOp()], stateless=True, row_bytes=8192)  # pre-packed rows of 2,048 ids
        512
        >>> frame_rows([FetchOp(max_batch=100)], stateless=True)
        100
    """
    fetch = next((op for op in ops if isinstance(op, FetchOp)), None)
    if fetch_limit and fetch is not None and fetch.max_batch is not None:
        return fetch.max_batch
    preferred = [op.frame_rows for op in ops if op.frame_rows is not None]
    if preferred:
        return min(preferred)
    if not stateless:
        return FRAME_ROWS
    by_size = int(STATELESS_FRAME_BYTES / row_bytes) if row_bytes > 0 else STATELESS_FRAME_ROWS
    return max(FRAME_ROWS, min(STATELESS_FRAME_ROWS, by_size))


def _stored_bytes_per_row(datasets: Any) -> float:
    """The largest average stored bytes per row (file or table bytes over rows) of ``datasets``."""
    sizes = [
        sum(s.num_bytes for s in ds.shards) / rows for ds in datasets if (rows := sum(s.num_rows for s in ds.shards))
    ]
    return max(sizes, default=0.0)


_END = object()


class EngineRun:
    """One pass over the stream in this process (a `~zephon_columnar.engine.run.Run`): an
    iterator of items, and the per-lane state a checkpoint needs.

    ``close()`` stops the prefetch thread and the workers promptly; it is called on
    exhaustion, on error and by ``__del__``, and may be called from any thread (a close from
    another thread while the caller is inside ``next()`` is finished by that ``next()``).
    """

    def __init__(
        self,
        engine: Engine,
        cursors: dict[int, LaneState],
        readers: ReaderPool | None = None,
        *,
        says_losses: bool = True,
        in_transit: int = 0,
    ) -> None:
        self.engine = engine
        self.says_losses = says_losses
        self.ended = False  # the pass ended (its last item was delivered), not closed early
        self.items = {lane: cursors[lane].items for lane in engine.lanes}
        self._closed = False  # no more items: asked to stop, finished, or failed
        self._finished = False  # resources released
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._queue: Channel | None = None
        self._thread: threading.Thread | None = None
        self._advance = threading.Lock()  # held while the prefetch thread moves the chains
        self._in_hand: LaneItem | None = None  # an item the prefetch thread has not queued yet
        # The item the caller took last: the prefetch thread clears ``_in_hand`` only after it
        # queued the item, so the caller may already hold it then (see `_undelivered`).
        self._last_taken: LaneItem | None = None
        # Items the prefetch thread made and close() took off the queue: still not delivered, so
        # a checkpoint after close() puts them back like the queued ones.
        self._made_before_close: list[LaneItem] = []
        runner_name = engine.options.resolved_runner()
        if runner_traits(runner_name).starts_processes and multiprocessing.current_process().daemon:
            # A DataLoader worker is a daemon, which may not start processes: its share of the
            # lanes runs on threads (the same rows: the runner never changes the data).
            warn(
                f"options(runner={runner_name!r}) inside a daemon process (a DataLoader worker?): it cannot start "
                f"worker processes, so the stateless stages run on the {DAEMON_STAND_IN!r} runner here; use the "
                "loader's num_workers for processes instead.",
                ConfigurationWarning,
            )
            runner_name = DAEMON_STAND_IN
        stages = [s.ops for s in engine.plan.parallel_stages()]
        self._readers = readers if readers is not None else ReaderPool()
        tracking = engine.options.tracking_on()
        services = {
            "datasets_by_id": engine.ws.datasets_by_id,
            "reader_pool": self._readers,
            "shard_cache": shard_cache_settings(engine.options),
            "decoded_cache_bytes": decoded_cache_limit(engine.options),
            "collect_stats": tracking,
        }
        self.metrics = Metrics() if tracking else None
        # What the pass drops on purpose, said once (zephon_columnar.losses): at the pass's end, or
        # at once when the stream has none (a finite stream is one whose samples have positions).
        self.notices = Notices(pass_ends=engine.ws.supports_indexing())
        for notice in skipped_record_notices(engine.ws.datasets_by_id):
            self.notices.note(notice, {}, lane=min(engine.lanes, default=0))
        self._runner = start_runner(
            runner_name,
            stages,
            services,
            engine.workers(),
            metrics=self.metrics,
            time_limit_s=engine.options.op_timeout_s,
        )
        try:
            setup = engine.lane_setup()
            self.chains = {
                lane: LaneChain(
                    setup,
                    lane,
                    lane_start(cursors[lane]),
                    self._runner,
                    self.notices,
                    engine.checkpoints,
                    in_transit=in_transit,
                )
                for lane in engine.lanes
            }
            streams = {lane: iter(chain) for lane, chain in self.chains.items()}
        except BaseException:
            self._runner.close()
            self._readers.close()
            raise
        self._tail = _tail(streams, dict(self.items))
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
            while True:
                with self._advance:
                    item = self._in_hand = next(self._tail, None)
                if item is None:
                    break
                if not q.put(item, stopped):
                    return
                with self._advance:
                    self._in_hand = None
            q.put(_END, stopped)
        except BaseException as err:  # noqa: BLE001 - any failure surfaces in the caller's next()
            if not stopped():
                q.put(_Failure(err), stopped)
        finally:
            self._tail.close()

    def stats(self) -> dict[int, dict[str, int]]:
        """Per lane, the counters its ordered stages keep (tokens uncapped wrap dropped at the
        end, oversized documents first_fit/best_fit dropped, rows strict ensure_mixture dropped)
        and the realized mixture's (`zephon_columnar.engine.realized`)."""
        return {lane: {**chain.shared.ctx.stats, **chain.shared.mixture.stats()} for lane, chain in self.chains.items()}

    def tracked_records(self) -> list[dict[str, Any]]:
        """Execution tracking's per-operator and per-stage records ([] when off)."""
        return self.metrics.records() if self.metrics is not None else []

    def in_flight_by_stage(self) -> dict[int, dict[int, int]] | None:
        return self.metrics.in_flight_by_stage() if self.metrics is not None else None

    @property
    def closed(self) -> bool:
        return self._closed

    def queue_stats(self) -> dict[str, int] | None:
        """None: items are handed over in this process, with no ring between."""
        return None

    def fetch_groups(self) -> dict[tuple[int, int, int], dict[str, float]]:
        """Execution tracking's fetch groups summed per (stage, dataset_id, shard_id) ({} when off)."""
        return self.metrics.fetch_groups() if self.metrics is not None else {}

    def prefetch_timing(self) -> PrefetchTimingTotals | None:
        """What ``prefetch()`` warmed in this pass (None without it)."""
        prefetcher = self.engine.prefetcher
        return prefetcher.timing() if prefetcher is not None else None

    # ------------------------------------------------------------------ checkpoints
    def snapshot(self, in_transit: Sequence[LaneItem] = ()) -> dict[int, LaneState]:
        """Every lane's state after the last item delivered to the caller.

        ``in_transit``: items delivered here that have not reached their consumer yet (the
        engine's side process hands them over later, at most the run's ``in_transit``); the
        state is taken as if they had not been delivered."""
        # After close() the chains are still there, stopped between two deliveries.
        with self._advance:  # the prefetch thread, if any, waits between two items
            ahead = self._undelivered()
            held: dict[int, int] = {}
            for item in reversed(in_transit):  # produced before anything still queued
                ahead.setdefault(item.lane, []).insert(0, item.table)
                held[item.lane] = held.get(item.lane, 0) + 1
            return {
                lane: chain.state(self.items[lane] - held.get(lane, 0), ahead.get(lane, ()))
                for lane, chain in self.chains.items()
            }

    def _undelivered(self) -> dict[int, list[pa.Table]]:
        """Rows of items the prefetch thread made that the caller has not received, per lane."""
        if self._queue is None:
            return {}
        made = self._made_before_close + [x for x in self._queue.snapshot() if isinstance(x, LaneItem)]
        hand = self._in_hand
        if hand is not None and hand is not self._last_taken and not any(x is hand for x in made):
            made.append(hand)  # made, not queued yet (the pump waits for room): not delivered
        out: dict[int, list[pa.Table]] = {}
        for item in made:
            out.setdefault(item.lane, []).append(item.table)
        return out

    # ------------------------------------------------------------------ iterator
    def __iter__(self) -> EngineRun:
        return self

    def __next__(self) -> Any:
        return deliver(self.engine.plan, lambda: self.next_lane_item().value)

    def next_lane_item(self) -> LaneItem:
        """The next item with its lane bookkeeping (counted as delivered)."""
        if self._closed:
            raise StopIteration
        try:
            item = next(self._tail) if self._queue is None else self._get()
        except StopIteration:
            stopped = self._stop.is_set()
            self.close()
            if not stopped:
                self.ended = True
                self._check_empty_pass()
                report = self.pass_report()
                if self.says_losses and report is not None:
                    say(report.said())
            raise
        except BaseException as err:
            stopped = self._stop.is_set()
            self.close()
            if stopped:  # closed from another thread: a cancelled wait is not an error
                raise StopIteration from None
            name_samples(err, self.engine.ws.datasets_by_id)
            raise
        if self._stop.is_set():
            self.close()
            raise StopIteration
        self.items[item.lane] += 1
        self.chains[item.lane].delivered(item, self.items[item.lane])
        return item

    def pass_report(self) -> PassReport | None:
        """What the pass dropped on purpose, to say once (`zephon_columnar.engine.pass_report`):
        the notes of its lanes with their counters, and the counters of the lanes that started
        the pass. None until the pass ended."""
        if not self.ended:
            return None
        stats = self.stats()
        fresh = tuple(lane for lane in sorted(self.chains) if self.chains[lane].shared.fresh)
        return PassReport(
            notices=self.notices.noted(),
            totals=summed(stats.values()),
            lanes=tuple(sorted(self.chains)),
            fresh_totals=summed(stats[lane] for lane in fresh),
            fresh_lanes=fresh,
        )

    def _check_empty_pass(self) -> None:
        """At the end of a pass: an `EmptyPassWarning` when rows were read and not one came out of
        the first stage in any lane (a filter that drops everything)."""
        read = sum(chain.guard.rows_in for chain in self.chains.values())
        if read and not any(chain.guard.rows_out for chain in self.chains.values()):
            self.notices.warn(
                "empty_pass",
                f"this pass read {read} rows of lanes {sorted(self.chains)} and delivered "
                "nothing: the operators before the first ordered stage let no row through (a filter "
                "that drops every row?).",
                EmptyPassWarning,
            )

    def _get(self) -> LaneItem:
        assert self._queue is not None and self._thread is not None
        try:
            got = self._queue.get(self._thread.is_alive)
        except RuntimeError:
            if self._stop.is_set():
                raise StopIteration from None
            raise PipelineError(
                "the prefetch thread stopped without a result; this is a bug, "
                "please report it with the pipeline's explain()"
            ) from None
        if got is _END:
            raise StopIteration
        if isinstance(got, _Failure):
            raise got.err
        self._last_taken = got
        return cast(LaneItem, got)

    def close(self) -> None:
        with self._lock:
            if self._finished:
                return
            self._closed = True
            self._stop.set()
            if self._thread is not None:
                # Unblock a pump waiting on a full queue, then let it finish its current item.
                while self._thread.is_alive():
                    removed = self._queue.clear()  # type: ignore[union-attr]
                    self._made_before_close += [x for x in removed if isinstance(x, LaneItem)]
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
        except Exception:  # noqa: BLE001, S110 - best-effort cleanup at garbage collection: never raise from __del__
            pass


def _tail(streams: dict[int, Iterator[LaneItem]], emitted: dict[int, int]) -> Generator[LaneItem, None, None]:
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


def _describe_op(op: BaseOp) -> str:
    """``name@pN`` in a stage line of ``explain()``; ``[columnar]`` for the columnar hook,
    ``[calls of N]`` for calls a `CountingAccumulator` sizes, then the operator's `explain_note`."""
    from zephon_columnar.ops.user import GroupedCalls, uses_columns

    inner = op.op if isinstance(op, GroupedCalls) else op
    text = f"{op.op_name()}@p{op.traits().workers()}"
    if uses_columns(inner):
        text += "[columnar]"
    if isinstance(op, GroupedCalls):
        text += f"[calls of {op.max_batch}]"
    note = op.explain_note()
    if note is not None:
        text += f"[{note}]"
    return text
