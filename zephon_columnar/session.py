"""`Session`: runs a `PipelineSpec` - iteration, checkpoints, restores, counters, observers.

A `~zephon_columnar.pipeline.Pipeline` is Zephon's fluent builder; everything that happens
when it runs is here. A session holds the spec it runs (replaced between runs as the builder
changes it, never during one), the current or last `~zephon_columnar.engine.run.Run` (in this
process, or in a side process with ``options(mtp_mode=True)``), and a restored checkpoint not
iterated yet. The torch adapters hold sessions too: a loader worker runs a session of its own
over its share of the rank's lanes (`for_lanes`).

Example:
    >>> import pyarrow as pa
    >>> from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
    >>> ds = Dataset.from_tables("a", [pa.table({"x": list(range(8))})])
    >>> session = Pipeline(StaticMixtureWorkSource([ds], {"a": 1.0}, chunk_size=2, seed=1)).batch(2).session
    >>> run = iter(session)
    >>> first = next(run)
    >>> ckpt = session.checkpoint()
    >>> rest = [b.to_pydict()["x"] for b in run]
    >>> resumed = Session(session.spec)
    >>> resumed.restore(ckpt)
    >>> [b.to_pydict()["x"] for b in resumed] == rest
    True
"""

from __future__ import annotations

import copy
import math
import multiprocessing
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

import cloudpickle

from zephon_columnar.engine.calibrate import prime_token_mixture
from zephon_columnar.engine.checkpoint import (
    LaneState,
    PipelineState,
    build_checkpoint,
    check_lane_state,
    check_recipe,
    held_for_collector,
    load_checkpoint,
    parse_checkpoint,
    source_state_field,
    source_state_of,
    verify_digests,
)
from zephon_columnar.engine.checkpoint.change_point import agree, change_point
from zephon_columnar.engine.checkpoint.gather import gather_directory, gather_torch, torch_distributed_ready
from zephon_columnar.engine.engine import Engine
from zephon_columnar.engine.layout import ProcessWorld, current_world, unsettled_share
from zephon_columnar.engine.realized import (
    CHUNKS_READ,
    columns_some_lack,
    is_mixture_counter,
    realized_mixture,
    target_shares,
)
from zephon_columnar.engine.run import Run
from zephon_columnar.engine.runners import runner_traits
from zephon_columnar.engine.spec import PipelineSpec
from zephon_columnar.engine.warmup import RestoreWarmup
from zephon_columnar.errors import CheckpointError, ConfigError, ConfigurationWarning, PipelineError, warn
from zephon_columnar.io import fs
from zephon_columnar.io.readers import ReaderPool
from zephon_columnar.observability import (
    FetchStageSummary,
    FetchTimingSummary,
    FetchTimingTotals,
    PipelineSummary,
    PrefetchTimingSummary,
)
from zephon_columnar.ops.base import BaseOp
from zephon_columnar.ops.fetch import shard_cache_settings
from zephon_columnar.ops.user import unused_hooks
from zephon_columnar.progress import Progress, StreamShape
from zephon_columnar.validation import ValidationError, validate_ops
from zephon_columnar.work.base import WorkSource
from zephon_columnar.work.schedule import MixtureChange, exact_weights

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from Python 3.11; annotations only


class Session:
    """Runs ``spec``: one pass at a time (`iterate`), its checkpoints and restores, counters
    and observers. Not thread-safe: one thread drives a session (its run's ``next()`` may be
    stopped from another)."""

    def __init__(self, spec: PipelineSpec) -> None:
        self._spec = spec
        self._run: Run | None = None
        self._engine: Engine | None = None  # the engine the current (or last) run started from
        # The engine restore() built and checked the checkpoint with, for the next iterate() when
        # neither the spec nor the process world changed since: (spec, world, engine).
        self._restored_engine: tuple[PipelineSpec, ProcessWorld | None, Engine] | None = None
        self._pending: dict[int, LaneState] | None = None  # a restored checkpoint's lanes, not iterated yet
        self._iterator: weakref.ref[RunIterator] | None = None  # the caller's handle on the current pass
        self._pending_recipe: Mapping[str, Any] = {}
        self._warmup: RestoreWarmup | None = None  # the restore's background read of the first rows
        self._validated: tuple[BaseOp, ...] = ()  # the user operators the last validation passed
        self._checkpoint_round = 0
        self._created_at = time.time()
        self._progress: dict[str, Any] | None = None  # show_progress() settings
        self._layout_warned = False  # unsettled_share said once
        self._columns_checked: tuple[BaseOp, ...] = ()  # the operators check_columns looked at
        self._partial_warned = False  # a checkpoint of this rank's lanes only, said once
        # Whether a pass says what it dropped when it ends (zephon_columnar.losses); a loader
        # worker's session hands its run's pass_report() to the training process instead.
        self.says_losses = True

    # ------------------------------------------------------------------ the spec
    @property
    def spec(self) -> PipelineSpec:
        """What the next run is built from (the current run's, while one is open)."""
        return self._spec

    def use(self, spec: PipelineSpec, *, what: str) -> None:
        """Run ``spec`` from the next pass on; refused while a pass is open (``what``: the call
        that asked, for the message)."""
        self.refuse_while_iterating(what)
        self._spec = spec

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch``'s order from the next pass on (`Pipeline.set_epoch`)."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ConfigError(f"set_epoch({epoch!r}): pass an int >= 0 (the training epoch; 0 is the order as built).")
        self.use(replace(self._spec, work_source=self._spec.work_source.for_epoch(epoch)), what="set_epoch()")

    def refuse_while_iterating(self, what: str) -> None:
        if self.iterating:
            raise RuntimeError(
                f"Pipeline.{what} while the pipeline is being iterated: close the iterator "
                "first (a checkpoint must describe the run that produced it)."
            )

    def for_lanes(self, lanes: Sequence[int]) -> Session:
        """A session of this one's spec, state and settings that reads only ``lanes`` of the
        rank's (a torch loader worker's share), with no run yet."""
        share = copy.copy(self)
        share._spec = self._spec.for_lanes(lanes)  # noqa: SLF001 - a copy of this very session
        return share

    @property
    def run(self) -> Run | None:
        """The current pass, or the last one (its counters stay readable); None before any."""
        return self._run

    @property
    def iterating(self) -> bool:
        """Whether a pass is open (its iterator neither exhausted nor closed)."""
        return self._run is not None and not self._run.closed

    @property
    def pending(self) -> Mapping[int, LaneState] | None:
        """The lanes of a restored checkpoint the next pass starts from (None: none)."""
        return self._pending

    def engine(self) -> Engine:
        """The engine the current (or last) run started from, else a fresh one of the spec (not
        started)."""
        return self._engine if self._engine is not None else self._spec.build_engine()

    def prepare(self) -> None:
        """What every run of the spec needs, done in the calling process before it starts: the
        layout check (`check_layout`) and a token-unit mixture primed with its calibration
        (`prime_token_mixture`; loader workers get the primed work source)."""
        self.check_layout()
        prime_token_mixture(self._spec.work_source, self._spec.ops)

    def _engine_to_start(self) -> Engine:
        """The engine for the next run: the one restore() built when nothing changed since."""
        restored, self._restored_engine = self._restored_engine, None
        if restored is not None and restored[0] is self._spec and restored[1] == current_world():
            return restored[2]
        return self._spec.build_engine()

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> RunIterator:
        return self.iterate()

    def iterate(self) -> RunIterator:
        """Start a pass: from the restored checkpoint if there is one, else from the start."""
        if self.iterating:
            raise RuntimeError(
                "Pipeline is already being iterated; close the first iterator (or let it finish) "
                "before starting another."
            )
        self._run = self._start_run()
        observers: list[PassObserver] = [] if self._progress is None else [self.new_progress()]
        sink = self._spec.options.metrics_sink()
        if sink is not None:
            from zephon_columnar.observability.sink import MetricsEmitter

            observers.append(MetricsEmitter(sink, self.metrics_snapshot))
        iterator = RunIterator(self._run, observers)
        self._iterator = weakref.ref(iterator)
        return iterator

    def _start_run(self) -> Run:
        """A run of the spec: from the restored checkpoint if there is one, else from the start."""
        spec = self._spec
        self.auto_validate()
        self.prepare()
        engine = self._engine_to_start()
        self.check_columns()
        cursors = None
        if self._pending is not None:
            check_recipe(self._pending_recipe, engine.recipe())
            cursors = _owned_cursors(engine, self._pending)
        self._pending = None
        run: Run
        if spec.options.mtp_mode and not multiprocessing.current_process().daemon:
            from zephon_columnar.engine.mtp import MtpRun

            if self._warmup is not None:  # the side process reads through its own readers
                self._warmup.cancel()
                self._warmup = None
            run = MtpRun(spec.for_side_process(), engine, cursors, says_losses=self.says_losses)
        else:
            if spec.options.mtp_mode:  # a daemon (a DataLoader worker) may not start a process
                warn(
                    "options(mtp_mode=True) inside a daemon process (a DataLoader worker?): it cannot "
                    "start the engine's side process, so the engine runs in this process."
                )
            run = engine.start(cursors, readers=self._take_warmup(engine), says_losses=self.says_losses)
        self._engine = engine
        return run

    # ------------------------------------------------------------------ mixture changes
    def set_mixture(
        self, weights: Mapping[str, float], *, delivered: Mapping[int, LaneState] | None = None
    ) -> MixtureChange:
        """Change the mixture to ``weights`` from the first global chunk nothing delivered so far
        depends on (`zephon_columnar.engine.checkpoint.change_point`), and return that change.

        During a pass the run restarts there from the delivered position (a restore of its own
        checkpoint, with the change recorded): the open iterator goes on, and its next item is
        the one the pass would have delivered had the change always been part of it. Every
        data-parallel rank calls it at the same step with the same weights (a collective through
        the ``torch.distributed`` group when ranks read different lanes; ranks asked different
        weights raise ``RuntimeError``). Before a pass the change governs it from its first
        chunk (or from where a restored checkpoint's lanes got to). ``delivered``: every lane's
        state at the trainer's step, when the pass runs elsewhere (loader workers: the loader
        then restarts them from those states, `zephon_columnar.torch.PipelineLoaderState`)."""
        ws = self._spec.work_source
        if not ws.accepts_mixture_changes():
            ws.with_mixture_change(at=0, weights=weights)  # raises TypeError, saying what to build instead
        exact = exact_weights("set_mixture()", weights)  # TypeError / ValueError naming the weight
        unknown = sorted(set(exact) - set(ws.component_ids()))
        if unknown:
            raise KeyError(
                f"set_mixture(): unknown component(s) {unknown}; the mixture's are {list(ws.component_ids())}."
            )
        engine = self.engine()
        lanes: Mapping[int, LaneState] = {}
        if delivered is not None:
            lanes = delivered
        elif self.iterating:
            assert self._run is not None
            lanes = self._run.snapshot()
        elif self._pending is not None:
            lanes = {lane: self._pending[lane] for lane in engine.lanes if lane in self._pending}
        point = change_point(lanes, flush_every=engine.plan.flush_every, replicas=engine.canonical_replicas)
        if torch_distributed_ready():  # ranks asked different weights are refused; the furthest point wins
            point = agree(exact, point, rank=engine.options.global_rank)
        elif delivered is None and engine.rank_lanes != list(range(engine.canonical_replicas)):
            raise RuntimeError(
                f"set_mixture(): this rank reads lanes {engine.rank_lanes} of {engine.canonical_replicas}, and "
                "without a torch.distributed group the ranks cannot check that they agree on the change nor "
                "on where it takes effect. Initialize torch.distributed (gloo is enough) before set_mixture."
            )
        change = MixtureChange(at=point, weights=dict(weights))
        if not self.iterating:
            self._spec = replace(self._spec, work_source=ws.with_mixture_change(at=point, weights=weights))
            return change
        # Restart from the delivered position under the changed source: the restore of this
        # run's own checkpoint (its lanes' replay cursors, all before the change point), then
        # the change on top of the history the checkpoint holds.
        assert self._run is not None
        local = build_checkpoint(PipelineState(recipe=engine.recipe(), world=engine.world(), lanes=dict(lanes)))
        self._run.close()
        self.restore(local)
        restored = self._spec.work_source
        self._spec = replace(self._spec, work_source=restored.with_mixture_change(at=point, weights=weights))
        self._run = self._start_run()
        iterator = self._iterator() if self._iterator is not None else None
        if iterator is not None:
            iterator.continue_with(self._run)
        return change

    def auto_validate(self) -> None:
        """``options(auto_validation=...)``: validate the user operators, once per graph (again
        only after an operator is added, as in Zephon)."""
        mode = self._spec.options.auto_validation
        user_ops = tuple(op for op in self._spec.ops if not op.builtin)
        if mode != "off" and user_ops and self._validated != user_ops:
            report = validate_ops(list(self._spec.ops))
            if report.issues:  # warnings too, as in Zephon: every report that says something is shown
                warn(report.format())
            if mode == "strict" and not report.ok:
                raise ValidationError(report)
            self._validated = user_ops

    def check_columns(self) -> None:
        """Warn, once per set of operators, where one reads a column only some datasets of the
        mixture have (`zephon_columnar.engine.realized.columns_some_lack`)."""
        if self._columns_checked == self._spec.ops:
            return
        self._columns_checked = self._spec.ops
        for message in columns_some_lack(self._spec.ops, self._spec.work_source.datasets_by_id):
            warn(message, ConfigurationWarning)

    def check_layout(self) -> None:
        """Settle the data-parallel layout for the world this process is in (a `ConfigError`
        where ranks would read the same data: `zephon_columnar.engine.layout`); warn, once, when
        no world decides it and these options read one group's share of several."""
        said = unsettled_share(self._spec.settled().options)
        if said is not None and not self._layout_warned:
            self._layout_warned = True
            warn(said, ConfigurationWarning)

    def show_progress(self, every_s: float | None, *, file: Any = None, use_tqdm: bool | None = None) -> None:
        """Report progress every ``every_s`` seconds of each pass (None: off)."""
        if every_s is not None and (
            isinstance(every_s, bool)
            or not isinstance(every_s, (int, float))
            or not every_s >= 0
            or math.isinf(every_s)
        ):
            raise ConfigError(
                f"show_progress: every_s={every_s!r} is not a number of seconds >= 0; pass e.g. every_s=10.0 "
                "(0: a line per item), or every_s=None to turn progress off."
            )
        self._progress = None if every_s is None else {"every_s": every_s, "file": file, "use_tqdm": use_tqdm}

    @property
    def shows_progress(self) -> bool:
        return self._progress is not None

    def new_progress(self) -> Progress:
        """A progress readout as `show_progress` set it, knowing how long the stream is."""
        if self._progress is None:
            raise RuntimeError("new_progress: show_progress() is off for this pipeline; turn it on first.")
        components = self.mixture_components()
        return Progress(
            **self._progress,
            stream=self.stream_shape(),
            targets_now=lambda: target_shares(self.counters(), components),
        )

    def stream_shape(self) -> StreamShape:
        """How long this rank's share of the stream is, as the work source knows (what progress
        counts against): the rows of a pass its lanes read, at most (lanes own whole chunks)."""
        source, o = self._spec.work_source, self._spec.options
        components = self.mixture_components()
        weights = source.target_weights()
        fixed = set(weights) == set(components) and not source.accepts_mixture_changes()
        mixture = StreamShape(components=components, targets=tuple(weights[n] for n in components) if fixed else ())
        chunk, per_pass = source.chunk_size_hint(), source.rows_per_pass()
        if not chunk or per_pass is None:
            return replace(mixture, chunk_size=chunk or 1)
        lanes, mine = o.resolved_canonical_replicas(), len(self.rank_lanes())
        if mine < lanes:  # lanes own whole chunks: at most this rank's lanes' rounds of them
            chunks_a_lane = math.ceil(math.ceil(per_pass / chunk) / lanes)
            per_pass = min(per_pass, chunks_a_lane * chunk * mine)
        return replace(mixture, rows_per_pass=per_pass, chunk_size=chunk, passes=source.stream_passes())

    def mixture_components(self) -> tuple[str, ...]:
        """The work source's component names by component id (ids without a name: ``"#id"``)."""
        ids = self._spec.work_source.component_ids()
        by_id = {cid: name for name, cid in ids.items()}
        return tuple(by_id.get(cid, f"#{cid}") for cid in range(max(by_id, default=-1) + 1))

    def rank_lanes(self) -> list[int]:
        """The lanes this rank (data-parallel group) reads."""
        from zephon_columnar.engine.ownership import owned_lanes

        o = self._spec.settled().options
        return owned_lanes(
            canonical_replicas=o.resolved_canonical_replicas(),
            dp_degree=o.resolved_dp_degree(),
            dp_group_id=o.resolved_dp_group_id(),
            mapping=o.resolved_mapping(),
        )

    # ------------------------------------------------------------------ counters
    def counters(self) -> dict[str, int]:
        """The current (or last) run's ordered-stage counters, summed over its lanes."""
        totals: dict[str, int] = {}
        if self._run is not None:
            for stats in self._run.stats().values():
                for k, v in stats.items():
                    totals[k] = totals.get(k, 0) + v
        return totals

    def explain(self) -> str:
        spec = self._spec
        text = "Data: " + "\n".join(spec.work_source.describe_data()) + "\n" + spec.build_engine().explain()
        inert = spec.options.inert_settings() + list(spec.ignored)
        inert += [line for op in spec.ops if not op.builtin for line in unused_hooks(op)]
        if inert:
            text += "\nAccepted for Zephon compatibility, no effect here:" + "".join(f"\n  {line}" for line in inert)
        counters = self.counters()
        shares = realized_mixture(counters)
        if shares:
            text += (
                "\nMixture of the last run, rows read -> delivered (a packed row: each document it ends)"
                + (", and the target's share" if any(s.target for s in shares) else "")
                + ": "
                + ", ".join(
                    f"{s.name} {s.read:,} ({s.read_share:.0%}) -> {s.delivered:,} ({s.delivered_share:.0%})"
                    + (f", target {s.target_share:.0%}" if s.target else "")
                    for s in shares
                )
            )
        if spec.work_source.accepts_mixture_changes() and counters.get(CHUNKS_READ):
            engine = self.engine()
            reached = counters[CHUNKS_READ] * engine.canonical_replicas // max(1, len(engine.lanes))
            text += f"\nMixture now: about global chunk {reached:,} of the schedule (the lanes of the last run read "
            text += f"{counters[CHUNKS_READ]:,} chunks)"
        other = {k: v for k, v in counters.items() if not is_mixture_counter(k)}
        if other:
            text += "\nCounters of the last run: " + ", ".join(f"{k}={v}" for k, v in sorted(other.items()))
        return text

    def metrics_snapshot(self) -> PipelineSummary | None:
        if self._run is None:
            return None
        records = [
            {"lane": lane, "name": k, "value": v}
            for lane, stats in sorted(self._run.stats().items())
            for k, v in sorted(stats.items())
        ]
        return PipelineSummary(records=records + self._run.tracked_records())

    def fetch_timing_snapshot(self) -> FetchTimingSummary | None:
        options = self._spec.options
        if self._run is None or not options.tracking_on():
            return None
        cache = fs.default_shard_cache()
        summary = FetchTimingSummary(
            tracking_mode=options.tracking_mode(),
            cache={
                "downloads": cache.downloads,
                "hits": cache.hits,
                "evictions": cache.evictions,
                "retries": cache.retries,
            },
        )
        for (stage, dataset_id, shard_id), counts in sorted(self._run.fetch_groups().items()):
            totals = FetchTimingTotals(**{k: int(v) for k, v in counts.items()})
            summary.stages.setdefault(stage, FetchStageSummary(index=stage)).shard_totals[(dataset_id, shard_id)] = (
                totals
            )
            summary.stages[stage].totals.merge(totals)
        return summary

    def prefetch_timing_snapshot(self) -> PrefetchTimingSummary | None:
        timing = self._run.prefetch_timing() if self._run is not None else None
        if timing is None:
            return None
        return PrefetchTimingSummary(tracking_mode=self._spec.options.tracking_mode(), stages={0: timing})

    def inflight_summary(self) -> dict[int, dict[int, int]] | None:
        return self._run.in_flight_by_stage() if self._run is not None else None

    def mtp_queue_stats(self) -> dict[str, int] | None:
        return self._run.queue_stats() if self._run is not None else None

    # ------------------------------------------------------------------ checkpoints
    def checkpoint(self, *, collective: bool = True) -> dict[str, Any]:
        """The state of what has been delivered so far; ``collective=False``: this engine's
        lanes only, never merged across ranks (a DataLoader worker's share)."""
        ws = self._spec.work_source
        if type(ws).state_dict is WorkSource.state_dict:
            warn(
                f"{type(ws).__name__} does not extend WorkSource.state_dict: the checkpoint holds only its "
                "lane identity, so a restore starts it from its first chunk. Return its position from "
                "state_dict() (and read it in load_state_dict()).",
                ConfigurationWarning,
            )
        # The recipe and lanes of the run that delivered the items (options cannot change during a
        # run; after it, the last run still describes what was delivered).
        engine = self.engine()
        delivered = self._delivered(engine)
        whole = engine.rank_lanes == list(range(engine.canonical_replicas))
        world = engine.world()
        if whole:  # the run's state, the same on every rank (tensor-parallel peers, dp_degree=1)
            world = dict(world, global_rank=None, dp_group_id=None)
        local = build_checkpoint(
            PipelineState(
                recipe=engine.recipe(),
                world=world,
                lanes={lane: delivered[lane] for lane in engine.lanes if lane in delivered},
            )
        )
        return self.gathered(local) if collective else local

    def gathered(self, local: dict[str, Any]) -> dict[str, Any]:
        """Every data-parallel group's lanes merged with ``local``, this rank's part of one step
        (`checkpoint(collective=False)`, or its loader workers' parts merged): through the
        shared directory (``aggregate_dir``; only the ranks that iterate take part, as in
        Megatron, where tensor-parallel peers are not loader ranks), else the
        ``torch.distributed`` group (every rank of it takes part). A collective: every rank
        calls it at the same step. With one data-parallel group, ``local`` already holds every
        lane; with neither a directory nor a group, this rank's part alone, with a warning: it
        restores on this layout only."""
        engine = self.engine()
        if engine.rank_lanes == list(range(engine.canonical_replicas)):
            return local
        opts = engine.options  # settled: the layout this run read
        self._checkpoint_round += 1
        if opts.aggregate_dir:
            merged = gather_directory(
                local,
                directory=opts.aggregate_dir,
                run_id=opts.run_id,
                round_id=self._checkpoint_round,
                part=(
                    f"rank-{opts.global_rank:05d}"
                    if opts.world_size > 1
                    else f"group-{opts.resolved_dp_group_id():05d}"
                ),
                parts_needed=opts.world_size,
                lanes_needed=engine.canonical_replicas,
                timeout_s=opts.aggregate_timeout_s,
                not_before=self._created_at,
            )
        elif torch_distributed_ready():
            merged = gather_torch(local)
        else:
            if not self._partial_warned:
                self._partial_warned = True
                warn(
                    f"checkpoint() holds this rank's lanes {engine.rank_lanes} of {engine.canonical_replicas} only "
                    f"(options(dp_degree={opts.resolved_dp_degree()}, dp_group_id={opts.resolved_dp_group_id()})), "
                    "with neither a torch.distributed group nor options(aggregate_dir=...) to merge the ranks' "
                    "parts: it restores on this same layout only. Initialize torch.distributed or set aggregate_dir "
                    "(a directory every rank sees), or merge every rank's checkpoint with "
                    "Pipeline.merge_checkpoints([...]) before restoring on another number of ranks.",
                    ConfigurationWarning,
                )
            return local
        covered = sorted(int(lane) for lane in merged["lanes"])
        if covered != list(range(engine.canonical_replicas)):
            missing = sorted(set(range(engine.canonical_replicas)) - set(covered))
            raise CheckpointError(
                f"checkpoint(): the ranks' parts cover lanes {covered} of {engine.canonical_replicas} (missing "
                f"{missing}), so the checkpoint would not be whole: ranks named the same data-parallel group "
                "(and read the same data) or a group did not take part. Give every data-parallel rank its own "
                "options(dp_group_id=...) (or global_rank), and call checkpoint() on every rank at the same step."
            )
        return merged

    def _delivered(self, engine: Engine) -> dict[int, Any]:
        if self._run is not None:
            return self._run.snapshot()
        if self._pending is not None:
            return dict(self._pending)
        return {lane: engine.initial_cursor(lane) for lane in engine.lanes}

    def restore(self, ckpt: Mapping[str, Any] | str | bytes) -> None:
        """Start the next pass where ``ckpt`` was taken (see `Pipeline.restore`)."""
        if self.iterating:
            raise RuntimeError("Pipeline.restore() during iteration: close the iterator first.")
        ckpt = load_checkpoint(ckpt)
        saved = parse_checkpoint(ckpt)
        recipe, lanes = saved.recipe, dict(saved.lanes)
        spec = self._spec
        engine = spec.build_engine()
        if lanes:  # what the run added to its source (a scheduled mixture's changes) goes on
            lane, cur = min(lanes.items())
            # The chunks the restored lanes replay as they were read (a mixture that may change
            # is checkpointed by replay): a source may accept a recipe that differs only after.
            replayed = (
                change_point(lanes, flush_every=engine.plan.flush_every, replicas=engine.canonical_replicas)
                if spec.work_source.accepts_mixture_changes()
                else None
            )
            try:
                continued = spec.work_source.continued_from(source_state_of(cur), replayed_before=replayed)
            except CheckpointError as err:
                raise CheckpointError(f"checkpoint lanes.{lane}.{source_state_field(cur)}: {err}") from err
            if continued is not spec.work_source:
                spec = replace(spec, work_source=continued)
                engine = spec.build_engine()
        ws = spec.work_source
        world = current_world()
        cache = shard_cache_settings(spec.options)
        if cache is not None:  # the restore warm-up below reads through the shard cache
            fs.configure_shard_cache(**cache)
        if isinstance(recipe.get("work_source"), Mapping):
            recipe = {**recipe, "work_source": ws.as_continued(recipe["work_source"])}
        check_recipe(recipe, engine.recipe())
        for lane, cur in lanes.items():
            check_lane_state(
                lane,
                cur,
                ws.datasets_by_id,
                engine.plan.flush_every,
                ordered_stages=len(engine.plan.ordered_stages()),
            )
        for lane in _owned_cursors(engine, lanes):
            probe = ws.clone_for_lane(lane, engine.canonical_replicas)
            cur = lanes[lane]
            # Raises if the source state is not ours.
            state = source_state_of(cur)
            try:
                probe.load_state_dict(state)
            except CheckpointError as err:
                raise CheckpointError(f"checkpoint lanes.{lane}.{source_state_field(cur)}: {err}") from err
            if ws.requires_token_priming and isinstance(state, Mapping) and state.get("token_ratios"):
                ws.prime(ratios=state["token_ratios"])  # the restored run mixes as the saved one
        # Last, after the checks that name a field: a lane edited in a way that still parses.
        verify_digests(ckpt)
        # Every lane is kept: options may still change which lanes this rank owns before iterating.
        self._spec = spec
        self._pending = lanes
        self._pending_recipe = recipe
        self._run = self._engine = None
        self._restored_engine = (spec, world, engine)
        if self._warmup is not None:
            self._warmup.cancel()
        if not runner_traits(spec.options.resolved_runner()).own_readers:  # else its workers' readers are not ours
            owned = _owned_cursors(engine, lanes).values()
            first = engine.plan.batch.microbatch_size if engine.plan.batch is not None else 1
            self._warmup = RestoreWarmup.start(
                ws.datasets_by_id,
                # what each lane's first item needs
                [refs.slice(0, first) for cur in owned if (refs := held_for_collector(cur)) is not None],
            )

    def _take_warmup(self, engine: Engine) -> ReaderPool | None:
        """The restore warm-up's readers, for the run ``engine`` is about to start (None: no
        warm-up, or options changed since ``restore()`` so that it read for another run)."""
        warm, self._warmup = self._warmup, None
        if warm is not None and runner_traits(engine.options.resolved_runner()).own_readers:
            warm.cancel()
            return None
        return warm.pool if warm is not None else None

    # ------------------------------------------------------------------ copies
    def _idle_state(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_spec"] = self._spec.settled()  # a loader worker has no process group to settle it with
        state["_run"] = None
        state["_engine"] = None
        state["_restored_engine"] = None
        state["_warmup"] = None
        state["_iterator"] = None
        return state

    def __copy__(self) -> Session:
        twin = type(self).__new__(type(self))
        twin.__dict__.update(self._idle_state())
        return twin

    def __getstate__(self) -> dict[str, bytes]:
        # by value (cloudpickle): the lambdas of map_transform and friends must reach spawned
        # loader workers, which cannot import them
        return {"cloudpickled": cloudpickle.dumps(self._idle_state())}

    def __setstate__(self, state: dict[str, bytes]) -> None:
        self.__dict__.update(cloudpickle.loads(state["cloudpickled"]))


class PassObserver(Protocol):
    """What sees a pass go by: the progress readout, the metrics sink."""

    def update(self, value: Any) -> None:
        """One item delivered."""

    def close(self, *, ended: bool = False) -> None:
        """The pass is over: it ``ended`` (its last item was delivered), or was closed early."""


class RunIterator:
    """The caller's handle on one pass; closing it (or dropping it) stops the engine.

    ``observers`` (the progress readout, the metrics sink) see every item delivered
    (``update(item)``) and the end of the pass (``close()``, once)."""

    def __init__(self, run: Run, observers: list[PassObserver]) -> None:
        self._run = run
        self._observers = observers
        self._inside = threading.Lock()  # held during next(): a second caller meanwhile is a misuse
        self._shared_by: str | None = None  # the thread that called next() while another was inside

    def __iter__(self) -> RunIterator:
        return self

    def __next__(self) -> Any:
        if not self._inside.acquire(blocking=False):
            self._shared_by = threading.current_thread().name
            raise self._shared_error()
        try:
            if self._shared_by is not None:
                raise self._shared_error()
            if not self._observers:
                return next(self._run)
            try:
                value = next(self._run)
            except StopIteration:
                self._end_observers(ended=True)
                raise
            for observer in self._observers:
                observer.update(value)
            return value
        finally:
            self._inside.release()

    def continue_with(self, run: Run) -> None:
        """Go on with ``run`` (the session restarted the pass from the delivered position:
        `Session.set_mixture`); the observers keep counting."""
        self._run = run

    def _shared_error(self) -> PipelineError:
        # Both threads get it (the one inside next() on its following call): neither may go on
        # believing it sees the whole stream.
        return PipelineError(
            f"one pipeline iterator was used by two threads at once (thread {self._shared_by!r} called next() "
            "while another thread was inside it); each item goes to one consumer only. Give each thread its own "
            "pipeline (for disjoint data: options(world_size=N, global_rank=i)), or let one thread iterate and "
            "hand items to the others through a queue.Queue."
        )

    def _end_observers(self, *, ended: bool = False) -> None:
        observers, self._observers = self._observers, []
        for observer in observers:
            observer.close(ended=ended)

    def close(self) -> None:
        self._end_observers()
        self._run.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self._run.close()
        except Exception:  # noqa: BLE001, S110 - best-effort cleanup at garbage collection: never raise from __del__
            pass


def _owned_cursors(engine: Engine, lanes: Mapping[int, LaneState]) -> dict[int, LaneState]:
    missing = [lane for lane in engine.lanes if lane not in lanes]
    if missing:
        partial = (
            f" It holds {len(lanes)} of the run's {engine.canonical_replicas} lanes: one rank's share (taken with "
            "checkpoint(collective=False), or with neither torch.distributed nor aggregate_dir to merge every "
            "rank's part)."
            if len(lanes) < engine.canonical_replicas
            else ""
        )
        raise CheckpointError(
            f"checkpoint has lanes {sorted(lanes)} but this rank owns {engine.lanes} (missing {missing}).{partial} "
            "Restore a checkpoint merged from all ranks (Pipeline.merge_checkpoints, aggregate_dir or an "
            "initialized torch.distributed group when checkpoint() is called), or restore on the layout it was "
            "taken on."
        )
    return {lane: lanes[lane] for lane in engine.lanes}
