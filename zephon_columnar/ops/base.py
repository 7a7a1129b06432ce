"""The operator contract: `BaseOp`, `OpTraits`, `OpContext`, `StageInfo`, and the three
shapes an operator comes in.

An operator is a pure function of its input rows plus, optionally, per-lane state that lives
in an accumulator. The engine may run the pure part on any worker, in any order, and puts the
results back in sequence; accumulators see one lane's rows in order on one thread. That split
is what makes parallelism a pure performance knob.

- `BaseOp` (Zephon's contract, what ``add_op`` takes): ``traits()`` and
  ``process_many(records) -> records`` are abstract; ``accumulator(...)`` decides how records
  are grouped into calls (Zephon's `Accumulator` API, run by the engine per lane).
- `ColumnarOp`, the columnar hook: ``process_columns(batch) -> batch`` gets a lane's rows as
  one Arrow record batch (or Polars DataFrame) of payload columns, with no record conversion;
  the engine keeps the bookkeeping aligned. ``process_many`` comes for free (validation and
  ``process_one`` use it).
- `FrameOp` and `OrderedOp`, the built-ins: whole frames (bookkeeping included) in
  ``process_frame``, or per-lane state in ``lane_accumulator`` (`ops.accumulators`).

What the engine reads from `OpTraits`: ``preserves_cursor_order`` (whether a checkpoint may
resume by input position), ``parallelism`` (workers wanted) and ``requires_serial_state``
(which pins it to 1), ``batch_shape_sensitive`` (calls must be grouped exactly as the
accumulator says, never re-cut by frames), ``indexable`` (`Pipeline.is_indexable`), and
``calibration_replayable`` (validation checks that per-record replay gives the same output).

Example:
    >>> from zephon_columnar.records import SampleMeta, SampleRecord
    >>> class Shout(BaseOp):
    ...     def traits(self):
    ...         return OpTraits(preserves_cursor_order=True)
    ...     def process_many(self, elems):
    ...         for r in elems:
    ...             r.payload = {**r.payload, "text": r.payload["text"].upper()}
    ...         return elems
    >>> meta = SampleMeta(sample_id=(0, 0, 0), lane_id=0, chunk_id=0)
    >>> Shout().process_one(SampleRecord(meta, {"text": "hi"}))[0].payload
    {'text': 'HI'}
    >>> class Forgetful(BaseOp):
    ...     def process_many(self, elems):
    ...         return elems
    >>> Forgetful()
    Traceback (most recent call last):
    ...
    TypeError: Can't instantiate abstract class Forgetful with abstract method traits
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.errors import WrongTypeError
from zephon_columnar.ops.accumulators import PassthroughAccumulator
from zephon_columnar.ops.polars_frames import polars_frame
from zephon_columnar.ops.traits import OpTraits as OpTraits  # operators import it from here

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from Python 3.11; annotations only

    from zephon_columnar.ops.accumulators import Accumulator
    from zephon_columnar.ops.accumulators.lane import LaneAccumulator, LaneContext
    from zephon_columnar.records import SampleRecord


@dataclass(frozen=True, kw_only=True)
class StageInfo:
    stage_index: int = -1
    stage_name: str = ""
    op_index: int = -1
    collect_stats: bool = False


@dataclass
class OpContext:
    """Services the engine offers an operator in ``setup`` (``datasets_by_id`` and friends) and
    where the operator sits in the plan (``stage_info``; a default `StageInfo` when not given)."""

    services: dict[str, Any] = field(default_factory=dict)
    stage_info: StageInfo = field(default_factory=StageInfo)

    def __post_init__(self) -> None:
        if self.stage_info is None:  # Zephon's signature takes None for "no plan metadata"
            self.stage_info = StageInfo()

    def get(self, key: str, default: Any = None) -> Any:
        return self.services.get(key, default)


class BaseOp(ABC):
    """Base class of every operator, built-in or user-defined (Zephon's contract).

    Lifecycle: ``__init__`` runs once in the driver (configuration only, picklable); the
    engine deep-copies the op per worker (cloudpickles it for process workers) and calls
    ``setup(ctx)`` once per copy before the first call; ``teardown()`` at the end.
    ``process_many`` must be a pure function of its input: state across calls belongs in
    the accumulator, which the engine rebuilds at the start and at every flush point.

    What the engine reads of an operator, all of it:

    - ``traits()`` (`OpTraits`): order kept, rows out per row in (``emits``), workers, whether
      it is indexable, replayable for calibration, sensitive to how rows are grouped;
    - ``is_ordered()``: an `OrderedOp`, whose work is a per-lane ``lane_accumulator(ctx)``
      (a `~zephon_columnar.ops.accumulators.lane.LaneAccumulator`; it declares what else it can
      do by implementing ``ReferenceState``, ``Rewinds`` or ``ReadsChunkTargets`` there);
    - ``process_frame(frame)`` for a stateless operator (built-ins override it; the default
      runs ``process_many`` on the frame's records), ``accumulator(...)`` for a user operator;
    - ``name``/``op_name()``, ``builtin``, ``frame_rows``, ``fingerprint()`` (the recipe a
      checkpoint is checked against), ``explain_note()``, ``setup``/``teardown``, ``clone()``.
    """

    #: Name used in plans, errors and checkpoints' recipes.
    name: str = ""
    #: Built-in operators are tested with the library and skipped by ``Pipeline.validate``.
    builtin: bool = False
    #: Rows per frame this operator works best on, or None for no preference. Without
    #: ``fetch(max_batch=...)`` the engine cuts frames of the smallest preference in the plan
    #: (its own choice when none has one: ``engine.engine.frame_rows``). A performance hint:
    #: frame sizes never change the data.
    frame_rows: int | None = None

    def __init__(self) -> None:
        self.stage_info: StageInfo = StageInfo()  # the plan's, from setup(ctx); a sentinel until then

    # ---------------------------------------------------------------- Zephon's contract
    @abstractmethod
    def traits(self) -> OpTraits:
        """How the operator behaves (see `OpTraits`)."""

    @abstractmethod
    def process_many(self, elems: list[SampleRecord]) -> list[SampleRecord]:
        """Records in, records out: rebuild ``record.payload`` and return the record that
        carried it; fan out with `~zephon_columnar.records.spawn_child`, drop with
        `~zephon_columnar.records.tombstones_for_record` (or by leaving the record out)."""

    def setup(self, ctx: OpContext) -> None:
        self.stage_info = ctx.stage_info

    def teardown(self) -> None:  # noqa: B027 - an optional hook: a no-op unless a subclass holds resources
        pass

    def process_one(self, elem: SampleRecord) -> list[SampleRecord]:
        return self.process_many([elem])

    def accumulator(self, *, deterministic: bool, ctx: dict[str, Any]) -> Accumulator[Any]:
        """How records are grouped into ``process_many`` calls, per lane: each upstream frame
        as one call by default. The engine builds one per lane at the start and after every
        flush point (see `zephon_columnar.ops.user`)."""
        return PassthroughAccumulator()

    def validation_samples(self) -> list[SampleRecord] | None:
        """Records ``Pipeline.validate`` runs the op on (None: synthetic ``{text, value}``)."""
        return None

    # ---------------------------------------------------------------- what the engine calls
    def process_frame(self, frame: pa.Table) -> pa.Table:
        """The engine's call on a frame: ``process_many`` on its records (one call)."""
        from zephon_columnar.ops.rows import run_rows

        return run_rows(frame, self.process_many, op_name=self.op_name())

    def lane_accumulator(self, ctx: LaneContext | None = None) -> LaneAccumulator | None:
        """Per-lane ordered state for a built-in ordered stage (`OrderedOp`); None otherwise."""
        return None

    def is_ordered(self) -> bool:
        """Whether this operator is an ordered stage (an `OrderedOp`: its work is per lane)."""
        return False

    # ---------------------------------------------------------------- helpers
    def op_name(self) -> str:
        return self.name or type(self).__name__

    def explain_note(self) -> str | None:
        """What ``explain()`` adds to this operator's name about how it runs in this process
        (None: nothing)."""
        return None

    def fingerprint(self) -> dict[str, Any]:
        """JSON-friendly description of what this op does to the data (part of the recipe a
        checkpoint is checked against). Subclasses add the arguments that change the data."""
        return {"op": self.op_name()}

    def clone(self) -> Self:
        return copy.deepcopy(self)

    @classmethod
    def plan_identity(cls) -> str:
        return f"{cls.__module__}.{cls.__qualname__}"


class FrameOp(BaseOp):
    """A built-in stateless operator, columnar over whole frames (bookkeeping included):
    ``process_frame`` is the work; ``process_many`` runs it on records' frame."""

    builtin = True

    @abstractmethod
    def process_frame(self, frame: pa.Table) -> pa.Table: ...

    def process_many(self, elems: list[SampleRecord]) -> list[SampleRecord]:
        from zephon_columnar.records import frame_of_records, records_of

        return records_of(self.process_frame(frame_of_records(elems, op_name=self.op_name())))


class OrderedOp(BaseOp):
    """A built-in ordered stage: all its work happens in the per-lane accumulator that
    ``lane_accumulator`` returns; it has no stateless part to call on records."""

    builtin = True

    @abstractmethod
    def lane_accumulator(self, ctx: LaneContext | None = None) -> LaneAccumulator: ...

    def is_ordered(self) -> bool:
        return True

    def process_many(self, elems: list[SampleRecord]) -> list[SampleRecord]:
        raise TypeError(
            f"{self.op_name()} is an ordered stage: it runs per lane inside a pipeline "
            "(lane_accumulator), not on a list of records."
        )


ColumnsFormat = Literal["arrow", "polars"]


class ColumnarOp(BaseOp):
    """The columnar hook: an operator whose work is ``process_columns(batch) -> batch`` on a
    lane's rows as one `pyarrow.RecordBatch` of payload columns (``columns_format =
    "polars"``: a ``polars.DataFrame``), called without any row conversion.

    Return a batch with the same rows, in order (a 1:1 map: new or changed columns), or
    ``(batch, rows)`` where ``rows[i]`` is the input row output row ``i`` comes from: rows left
    out are dropped, increasing indices keep order, a repeated index fans a row out (its
    copies get child lineages). Any other change of the row count is an error.

    Example:
        >>> import pyarrow.compute as pc
        >>> from zephon_columnar import frame as F
        >>> class Score(ColumnarOp):
        ...     def traits(self):
        ...         return OpTraits(preserves_cursor_order=True)
        ...     def process_columns(self, batch):
        ...         return batch.append_column("score", pc.utf8_length(batch.column("text")))
        >>> Score().process_frame(F.frame_of({"text": ["ab", "abc"]})).column("score").to_pylist()
        [2, 3]
    """

    columns_format: ClassVar[ColumnsFormat] = "arrow"

    @abstractmethod
    def process_columns(self, batch: Any) -> Any:
        """Payload columns in (a record batch or Polars DataFrame), payload columns out."""

    def process_frame(self, frame: pa.Table) -> pa.Table:
        return run_columns(frame, self.process_columns, op_name=self.op_name(), columns_format=self.columns_format)

    def process_many(self, elems: list[SampleRecord]) -> list[SampleRecord]:
        from zephon_columnar.records import frame_of_records, records_of

        return records_of(self.process_frame(frame_of_records(elems, op_name=self.op_name())))


def run_columns(frame: pa.Table, fn: Any, *, op_name: str, columns_format: ColumnsFormat = "arrow") -> pa.Table:
    """``fn`` on the payload columns of ``frame`` (see `ColumnarOp`), bookkeeping realigned."""
    # Column positions from the schema's names (no Field objects, no per-step name lists): this
    # runs once per frame, and its bookkeeping was half the cost of a cheap vectorized op.
    names = frame.schema.names
    book_at = [i for i, n in enumerate(names) if F.is_bookkeeping(n)]
    payload = frame.select([i for i, n in enumerate(names) if not F.is_bookkeeping(n)])
    if columns_format == "polars":
        import polars as pl

        arg: Any = polars_frame(payload, rechunk=True) if payload.num_columns else pl.DataFrame()
    else:
        arg = (
            payload.combine_chunks().to_batches()[0]
            if payload.num_rows and payload.num_columns
            else pa.RecordBatch.from_pylist([], schema=payload.schema)
        )
    out = fn(arg)
    rows = None
    if isinstance(out, tuple) and len(out) == 2:
        out, rows = out
    # A record batch (the common answer) is used as it is, without making a Table of it first.
    table = out if isinstance(out, pa.RecordBatch) else _as_table(out, op_name)
    out_names, out_columns, out_rows = table.schema.names, table.columns, table.num_rows
    reserved = [c for c in out_names if F.is_bookkeeping(c)]
    if reserved:
        raise WrongTypeError(
            f"operator {op_name!r} returned columns {reserved}; names starting with '__' are "
            "reserved for the engine's bookkeeping, pick other names."
        )
    if rows is None:
        if out_rows != frame.num_rows:
            raise WrongTypeError(
                f"operator {op_name!r}: process_columns got {frame.num_rows} rows and returned {out_rows}; "
                "return (batch, rows) with rows[i] = the input row output row i comes from, to filter or fan out."
            )
        # F.with_payload(bookkeeping_of(frame), out), from the positions found above.
        return pa.Table.from_arrays(
            frame.select(book_at).columns + list(out_columns), names=[names[i] for i in book_at] + list(out_names)
        )
    table = _as_table(out, op_name)
    book = frame.select(book_at)
    index = np.asarray(rows, dtype=np.int64).reshape(-1)
    if len(index) != out_rows or (len(index) and (index.min() < 0 or index.max() >= frame.num_rows)):
        raise WrongTypeError(
            f"operator {op_name!r}: process_columns returned {out_rows} rows with {len(index)} "
            f"row indices (each must be an input row, 0..{frame.num_rows - 1})."
        )
    if len(index) > 1 and np.any(np.diff(index) < 0):
        raise WrongTypeError(
            f"operator {op_name!r}: process_columns' row indices go back ({index.tolist()[:8]}...); "
            "keep output rows in input order."
        )
    repeated = np.zeros(len(index), bool)
    if len(index) > 1:
        repeated[1:] = index[1:] == index[:-1]
        repeated[:-1] |= index[:-1] == index[1:]
    if repeated.any():
        # Fan-out: the k-th copy of a row is its child k; rows kept once keep their lineage.
        first = np.r_[True, index[1:] != index[:-1]] if len(index) else np.zeros(0, bool)
        starts = np.maximum.accumulate(np.where(first, np.arange(len(index)), 0))
        child = np.where(repeated, np.arange(len(index)) - starts, -1)
        book = F.with_children(book, index, child)
    else:
        book = book.take(pa.array(index))
    return F.with_payload(book, table)


def _as_table(out: Any, op_name: str) -> pa.Table:
    if isinstance(out, pa.Table):
        return out
    if isinstance(out, pa.RecordBatch):
        return pa.Table.from_batches([out])
    if type(out).__module__.startswith("polars"):
        return out.to_arrow()
    raise WrongTypeError(
        f"operator {op_name!r}: process_columns returned {type(out).__name__}; return a "
        "pyarrow.RecordBatch, pyarrow.Table or polars.DataFrame (or (batch, rows))."
    )
