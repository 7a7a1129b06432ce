"""User-defined operators (``Pipeline.add_op``): the kwargs form, and how the engine runs an
operator's Zephon `Accumulator`.

An ``add_op`` operator has a pure part (``process_many``, or the columnar hook
``process_columns``) and an accumulator that groups each lane's records into calls. The
planner (`stages_of`) turns it into stages by what the accumulator can do to the data:

- `PassthroughAccumulator` (the default): one call per frame, a stateless stage;
- `CountingAccumulator(max_batch)` without ``drop_last``: grouping only changes call sizes,
  not the data, so calls of at most ``max_batch`` rows are cut inside frames (`GroupedCalls`),
  still a stateless stage;
- but an op whose output depends on how records are grouped into calls
  (``batch_shape_sensitive``, or ``preserves_cursor_order=False``: it reorders within a call)
  needs calls that do not depend on frames, whose sizes follow the engine's latency and
  restores: with either accumulator above its calls are cut per lane by count from each flush
  point (the counting accumulator's ``max_batch``; `DEFAULT_CALL_ROWS` for the passthrough),
  as below;
- anything else (a custom accumulator, ``drop_last``): an ordered
  stage per lane runs the accumulator exactly as Zephon's pump thread does
  (`AccumulatorStage`: ``push_many`` on the lane's records in order, ``flush(reset=True,
  lane_id=...)`` and a fresh accumulator at every flush point, ``on_source_exhausted`` once per
  lane for each component its chunks say has run out), and each ready batch becomes one call of
  the pure part on the workers. Its state is the user's, so checkpoints resume it by replaying the flush epoch.

Tombstones a user operator or accumulator emits are discarded: this engine resumes from
stream positions and never waits for a dropped record.

Example:
    >>> from zephon_columnar.ops.accumulators import CountingAccumulator
    >>> op = FunctionOp("score", process_many=lambda rs: rs, preserves_cursor_order=True,
    ...                 accumulator=lambda: CountingAccumulator(max_batch=64))
    >>> [type(s).__name__ for s in stages_of(op)]
    ['GroupedCalls']
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, get_args

import numpy as np
import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.compatibility import INERT_ACCUMULATOR_HOOKS
from zephon_columnar.errors import ConfigError, PipelineError, WrongTypeError, operator_failure
from zephon_columnar.ops.accumulators import Accumulator, CountingAccumulator, PassthroughAccumulator
from zephon_columnar.ops.accumulators.lane import LaneContext
from zephon_columnar.ops.base import BaseOp, OpContext, OpTraits, OrderedOp, run_columns
from zephon_columnar.ops.rows import keep_lineage
from zephon_columnar.ops.traits import Emits
from zephon_columnar.records import SampleRecord, check_records, frame_of_records, records_of

T = TypeVar("T")


def _qualname(fn: Any) -> str | None:
    return None if fn is None else getattr(fn, "__qualname__", type(fn).__name__)


def call_factory(factory: Callable[..., T], *, deterministic: bool, ctx: dict[str, Any]) -> T:
    """Call an accumulator factory of either signature, ``()`` or ``(*, deterministic, ctx)``."""
    params: Mapping[str, inspect.Parameter]
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin without a signature: the no-argument form
        params = {}
    if "deterministic" in params or "ctx" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return factory(deterministic=deterministic, ctx=ctx)
    return factory()


class FunctionOp(BaseOp):
    """The kwargs form of ``add_op``: functions and traits given as arguments.

    ``process_many(records) -> records`` or ``process_columns(batch) -> batch`` (the columnar
    hook, see `~zephon_columnar.ops.base.ColumnarOp`; with ``columns_format="polars"`` it gets a
    Polars DataFrame), an optional ``accumulator`` factory (``() -> Accumulator`` or
    ``(*, deterministic, ctx) -> Accumulator``), ``process_one`` and ``validation_samples``.
    """

    def __init__(
        self,
        name: str,
        *,
        preserves_cursor_order: bool,
        process_many: Callable[[list[SampleRecord]], list[SampleRecord]] | None = None,
        process_columns: Callable[[Any], Any] | None = None,
        columns_format: str = "arrow",
        accumulator: Callable[..., Accumulator[Any]] | None = None,
        process_one: Callable[[SampleRecord], list[SampleRecord]] | None = None,
        validation_samples: Callable[[], list[SampleRecord]] | None = None,
        parallelism: int | None = None,
        indexable: bool | None = None,
        batch_shape_sensitive: bool | None = None,
        requires_serial_state: bool | None = None,
        calibration_replayable: bool | None = None,
        emits: Emits = "any",
    ) -> None:
        super().__init__()
        if not isinstance(name, str) or not name:
            raise ConfigError(f"add_op({name!r}, ...): pass a non-empty name as the first argument.")
        if (process_many is None) == (process_columns is None):
            raise ConfigError(
                f"add_op({name!r}, ...): pass exactly one of process_many= (records) and "
                "process_columns= (the columnar hook)."
            )
        for what, fn in (
            ("process_many", process_many),
            ("process_columns", process_columns),
            ("accumulator", accumulator),
            ("process_one", process_one),
            ("validation_samples", validation_samples),
        ):
            if fn is not None and not callable(fn):
                raise ConfigError(f"add_op({name!r}, {what}=...): pass a callable, got {type(fn).__name__}.")
        if emits not in get_args(Emits):
            raise ConfigError(f"add_op({name!r}, emits={emits!r}): use one of {list(get_args(Emits))}.")
        if columns_format not in ("arrow", "polars"):
            raise ConfigError(f"add_op({name!r}, columns_format={columns_format!r}): use 'arrow' or 'polars'.")
        if parallelism is not None and (not isinstance(parallelism, int) or parallelism < 1):
            raise ConfigError(f"add_op({name!r}, parallelism={parallelism!r}): pass a positive int.")
        self.name = name
        self._process_many = process_many
        self._process_columns = process_columns
        self.columns_format = columns_format
        self._accumulator = accumulator
        self._process_one = process_one
        self._validation_samples = validation_samples
        self._traits = OpTraits(
            preserves_cursor_order=bool(preserves_cursor_order),
            parallelism=parallelism or 1,
            indexable=True if indexable is None else bool(indexable),
            batch_shape_sensitive=bool(batch_shape_sensitive),
            requires_serial_state=bool(requires_serial_state),
            calibration_replayable=bool(calibration_replayable),
            emits=emits,
        )

    def traits(self) -> OpTraits:
        return self._traits

    def given_functions(self) -> tuple[tuple[str, Callable[..., Any] | None], ...]:
        """The functions ``add_op`` was given, by keyword (None: not given), for the static scan."""
        return (
            ("process_many", self._process_many),
            ("process_columns", self._process_columns),
            ("process_one", self._process_one),
        )

    def process_many(self, elems: list[SampleRecord]) -> list[SampleRecord]:
        if self._process_many is not None:
            return self._process_many(elems)
        return records_of(self.process_frame(frame_of_records(elems, op_name=self.name)))

    def process_frame(self, frame: pa.Table) -> pa.Table:
        if self._process_columns is not None:
            return run_columns(frame, self._process_columns, op_name=self.name, columns_format=self.columns_format)  # type: ignore[arg-type]
        return super().process_frame(frame)

    def process_one(self, elem: SampleRecord) -> list[SampleRecord]:
        return self._process_one(elem) if self._process_one is not None else self.process_many([elem])

    def accumulator(self, *, deterministic: bool, ctx: dict[str, Any]) -> Accumulator[Any]:
        if self._accumulator is None:
            return PassthroughAccumulator()
        return call_factory(self._accumulator, deterministic=deterministic, ctx=ctx)

    def validation_samples(self) -> list[SampleRecord] | None:
        return self._validation_samples() if self._validation_samples is not None else None

    def uses_columns(self) -> bool:
        return self._process_columns is not None

    def fingerprint(self) -> dict[str, Any]:
        fn = self._process_many if self._process_many is not None else self._process_columns
        return {"op": self.name, "fn": _qualname(fn), "accumulator": _qualname(self._accumulator)}


def uses_columns(op: BaseOp) -> bool:
    """Whether ``op``'s pure part is the columnar hook (what ``explain()`` shows)."""
    from zephon_columnar.ops.base import ColumnarOp

    return isinstance(op, ColumnarOp) or (isinstance(op, FunctionOp) and op.uses_columns())


# ---------------------------------------------------------------- planning
def accumulator_of(op: BaseOp, ctx: dict[str, Any] | None = None) -> Accumulator[Any]:
    """``op``'s accumulator (deterministic), or a ConfigError naming the op."""
    try:
        acc = op.accumulator(deterministic=True, ctx=dict(ctx or {}))
    except Exception as err:
        raise operator_failure(
            err, f"operator {op.op_name()!r}: its accumulator factory raised {type(err).__name__}: {err}"
        ) from err
    if acc is None:
        return PassthroughAccumulator()
    if not isinstance(acc, Accumulator):
        raise WrongTypeError(
            f"operator {op.op_name()!r}: accumulator() returned {type(acc).__name__}; return a "
            "zephon_columnar.ops.Accumulator (e.g. CountingAccumulator(max_batch=64))."
        )
    return acc


def unused_hooks(op: BaseOp) -> list[str]:
    """The Zephon accumulator hooks ``op``'s accumulator sets that this engine never calls
    (`zephon_columnar.compatibility.INERT_ACCUMULATOR_HOOKS`), one line each with why."""
    acc = accumulator_of(op)
    mine = [c for c in type(acc).__mro__ if c not in (Accumulator, CountingAccumulator, PassthroughAccumulator)]
    lines = [
        f"{op.op_name()}: {type(acc).__name__}.{name}: {why}"
        for name, why in INERT_ACCUMULATOR_HOOKS.items()
        if any(name in vars(c) for c in mine)
    ]
    if isinstance(acc, CountingAccumulator) and acc.max_latency_ms is not None:
        why = INERT_ACCUMULATOR_HOOKS["max_latency_ms"]
        lines.append(f"{op.op_name()}: CountingAccumulator(max_latency_ms={acc.max_latency_ms}): {why}")
    return lines


#: Records per call of a grouping-sensitive op that brings no grouping of its own (Zephon's
#: default micro-batch).
DEFAULT_CALL_ROWS = 64


def stages_of(op: BaseOp) -> list[BaseOp]:
    """The operators the plan runs for ``op``: a built-in runs as it is; a user operator as the
    module docstring says."""
    if op.builtin:
        return [op]
    acc = accumulator_of(op)
    traits = op.traits()
    exact = traits.batch_shape_sensitive or not traits.preserves_cursor_order
    if type(acc) is PassthroughAccumulator:
        return [AccumulatorStage(op, call_rows=DEFAULT_CALL_ROWS), op] if exact else [op]
    if type(acc) is CountingAccumulator and not acc.drop_last and not exact:
        return [GroupedCalls(op, acc.max_batch)]
    return [AccumulatorStage(op), op]


class _Delegate(BaseOp):
    """Runs another operator: same name, traits, lifecycle and recipe."""

    def __init__(self, op: BaseOp) -> None:
        super().__init__()
        self.op = op

    def traits(self) -> OpTraits:
        return self.op.traits()

    def op_name(self) -> str:
        return self.op.op_name()

    def setup(self, ctx: OpContext) -> None:
        super().setup(ctx)
        self.op.setup(ctx)

    def teardown(self) -> None:
        self.op.teardown()

    def process_many(self, elems: list[SampleRecord]) -> list[SampleRecord]:
        return self.op.process_many(elems)

    def fingerprint(self) -> dict[str, Any]:
        return self.op.fingerprint()


class GroupedCalls(_Delegate):
    """``op``'s pure part in calls of at most ``max_batch`` rows (a `CountingAccumulator` that
    only sizes calls), cut inside each frame."""

    def __init__(self, op: BaseOp, max_batch: int) -> None:
        super().__init__(op)
        self.max_batch = max_batch

    def process_frame(self, frame: pa.Table) -> pa.Table:
        n, size = frame.num_rows, self.max_batch
        if n <= size:
            return self.op.process_frame(frame)
        return F.concat_frames([self.op.process_frame(frame.slice(i, size)) for i in range(0, n, size)])


class AccumulatorStage(OrderedOp):
    """The ordered part of a user operator whose accumulator may hold, reorder or drop
    records: per lane, the accumulator's ready batches, one frame each (see the module
    docstring). The operator's pure part runs in the stage after it."""

    def __init__(self, op: BaseOp, *, call_rows: int | None = None) -> None:
        super().__init__()
        self.op = op
        self.call_rows = call_rows  # set: calls of this many records instead of op's accumulator
        self.name = f"{op.op_name()}.accumulator"

    def traits(self) -> OpTraits:
        return OpTraits(
            preserves_cursor_order=self.op.traits().preserves_cursor_order,
            requires_serial_state=True,
            batch_shape_sensitive=True,
            indexable=False,
        )

    def lane_accumulator(self, ctx: LaneContext | None = None) -> _LaneGroups:
        return _LaneGroups(self.op, ctx or LaneContext(), self.call_rows)

    def fingerprint(self) -> dict[str, Any]:
        return {"op": "accumulator", "of": self.op.fingerprint(), "call_rows": self.call_rows}


class _LaneGroups:
    """One lane's user `Accumulator`, driven as Zephon's pump thread drives it."""

    def __init__(self, op: BaseOp, ctx: LaneContext, call_rows: int | None = None) -> None:
        self.op = op
        self.ctx = ctx
        self.call_rows = call_rows
        self.acc: Accumulator[Any] | None = None
        # Source exhaustion: the components announced to the lane's accumulators (once per lane,
        # see push and flush), and the newest chunk whose rows were pushed.
        self.ids = {name: cid for cid, name in ctx.component_names.items()}
        self.announced: set[str] = set()
        self.last_chunk = -1
        # Whether a frame pushed since the last flush point had `__lineage`: the batches the
        # accumulator emits keep the column then, even when none of their records was cut, so
        # that its presence does not depend on how records were grouped. Reset with the
        # accumulator, so that replaying the flush epoch after a restore sets it alike.
        self.lineage = False

    def _fresh(self) -> Accumulator[Any]:
        if self.acc is None:
            self.acc = (
                CountingAccumulator(self.call_rows)
                if self.call_rows
                else accumulator_of(
                    self.op,
                    {
                        "lane_id": self.ctx.lane,
                        "seed": self.ctx.seed,
                        "component_names": dict(self.ctx.component_names),
                    },
                )
            )
        return self.acc

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        try:
            return list(fn(*args, **kwargs))
        except Exception as err:
            raise operator_failure(
                err,
                f"operator {self.op.op_name()!r}: accumulator {what} failed on lane "
                f"{self.ctx.lane}: {type(err).__name__}: {err}",
            ) from err

    def _frames(self, ready: list[Any], what: str) -> list[pa.Table]:
        out = []
        for item in ready:
            if not (isinstance(item, tuple) and len(item) == 2):
                raise WrongTypeError(
                    f"operator {self.op.op_name()!r}: accumulator {what} must return a list of "
                    f"(records, wait_ns) ready batches, got {type(item).__name__}."
                )
            records, _wait_ns = item  # the wait is a metric of Zephon's pump thread; nothing reads it here
            lanes = sorted({r.meta.lane_id for r in records})
            if lanes and lanes != [self.ctx.lane]:
                raise PipelineError(
                    f"operator {self.op.op_name()!r}: accumulator {what} returned a batch with "
                    f"records of lanes {lanes} while serving lane {self.ctx.lane}; a ready batch "
                    "holds one lane's records."
                )
            records = check_records(records, op_name=self.op.op_name(), what=f"accumulator {what}")
            frame = keep_lineage(frame_of_records(records, op_name=self.op.op_name()), self.lineage)
            if frame.num_rows:
                out.append(frame)
        return out

    def _announce(self, names: set[str]) -> list[Any]:
        """``on_source_exhausted`` for each of ``names`` not announced yet (ascending ids)."""
        acc, ready = self._fresh(), []
        for cid in sorted(self.ids[n] for n in names - self.announced if n in self.ids):
            ready += self._call("on_source_exhausted", acc.on_source_exhausted, self.ctx.lane, cid)
        self.announced |= names
        return ready

    def push(self, frame: pa.Table) -> list[pa.Table]:
        """Push the frame's records in order. A fresh accumulator (after a flush point) counts as
        told of what ran out before its flush epoch; a component whose last row came in an
        earlier chunk is announced before the first row of a newer chunk that says so."""
        if self.acc is None:
            self.announced = set(self.ctx.exhausted_before(self.ctx.flush_epoch()))
        acc = self._fresh()
        self.lineage = self.lineage or F.LINEAGE in frame.column_names
        chunks = frame.column(F.CHUNK).to_numpy()
        ready, start = [], 0
        for i in np.flatnonzero(chunks > np.maximum.accumulate(np.r_[self.last_chunk, chunks[:-1]])).tolist():
            self.last_chunk = int(chunks[i])
            new = self.ctx.chunk_exhaustion(self.last_chunk).before - self.announced
            if new:
                if i > start:
                    ready += self._call("push_many", acc.push_many, records_of(frame.slice(start, i - start)))
                    start = i
                ready += self._announce(set(new))
        ready += self._call("push_many", acc.push_many, records_of(frame.slice(start)))
        return self._frames(ready, "push_many")

    def flush(self, *, reset: bool, end: bool = False) -> list[pa.Table]:
        """A flush point: what the flush epoch's chunks said has run out is announced, then the
        accumulator flushes (and is rebuilt at the next push)."""
        if self.acc is None:
            return []
        ready = self._announce(set(self.ctx.exhausted_before(self.ctx.flush_epoch() + 1)))
        acc, lane = self.acc, self.ctx.lane
        ready += self._call("flush", acc.flush, reset=True, lane_id=lane)
        if acc.has_pending_data(lane):
            raise PipelineError(
                f"operator {self.op.op_name()!r}: its accumulator still has pending data for lane "
                f"{lane} after flush(reset=True); a flush must emit (or drop) everything it holds."
            )
        frames = self._frames(ready, "flush")
        self.acc, self.lineage = None, False
        return frames

    def carry(self) -> pa.Table | None:
        return None
