"""The operator contract: `BaseOp`, `OpTraits`, `OpContext`, `StageInfo`.

An operator is a pure function of its input rows plus, optionally, per-lane state that lives
in an accumulator. The engine may run the pure part on any worker, in any order, and puts the
results back in sequence; accumulators see one lane's rows in order on one thread. That split
is what makes parallelism a pure performance knob.

Two ways to write the pure part:
- ``process_frame(frame) -> frame``: columnar, takes and returns an Arrow table (the fast
  path; bookkeeping columns ``__*`` must be carried through for the rows kept);
- ``process_many(records) -> records``: Zephon's row API on `SampleRecord` views (slower).

Example:
    >>> class Upper(BaseOp):
    ...     def traits(self):
    ...         return OpTraits(preserves_cursor_order=True)
    ...     def process_frame(self, frame):
    ...         import pyarrow.compute as pc
    ...         i = frame.column_names.index("text")
    ...         return frame.set_column(i, "text", pc.utf8_upper(frame.column("text")))
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from zephon_columnar.ops.accumulators import Accumulator, LaneAccumulator, LaneContext
    from zephon_columnar.types import SampleRecord


@dataclass(frozen=True, kw_only=True)
class OpTraits:
    """How an operator behaves, for the planner.

    ``preserves_cursor_order``: outputs keep the order of their inputs (1:1 maps, filters).
    ``parallelism``: preferred worker count for the pure part.
    ``batch_shape_sensitive``: output depends on how rows are grouped into calls.
    ``requires_serial_state``: the op must run on one worker.
    """

    preserves_cursor_order: bool
    indexable: bool = True
    calibration_replayable: bool = False
    parallelism: int = 1
    batch_shape_sensitive: bool = False
    requires_serial_state: bool = False


@dataclass(frozen=True, kw_only=True)
class StageInfo:
    stage_index: int = -1
    stage_name: str = ""
    op_index: int = -1
    collect_stats: bool = False


@dataclass(kw_only=True)
class OpContext:
    """Services the engine offers an operator in ``setup``: ``datasets_by_id`` and friends."""

    services: dict[str, Any] = field(default_factory=dict)
    stage_info: StageInfo | None = None

    def get(self, key: str, default: Any = None) -> Any:
        return self.services.get(key, default)


class BaseOp:
    """Base class of every operator, built-in or user-defined.

    Lifecycle: ``__init__`` runs once in the driver (configuration only, picklable); the
    engine deep-copies the op per worker (cloudpickles it for process workers) and calls
    ``setup(ctx)`` once per copy before the first call; ``teardown()`` at the end.
    """

    #: Name used in plans, errors and checkpoints' recipes.
    name: str = ""
    #: Built-in operators are tested with the library and skipped by ``Pipeline.validate``.
    builtin: bool = False
    #: Whether one input row may become several output rows. False lets a checkpoint resume by
    #: input position instead of replaying; the safe default for unknown operators is True.
    fans_out: bool = True

    def __init__(self) -> None:
        self.stage_info: StageInfo | None = None

    # ---------------------------------------------------------------- contract
    def traits(self) -> OpTraits:
        raise NotImplementedError(f"{type(self).__name__} must implement traits() -> OpTraits")

    def setup(self, ctx: OpContext) -> None:
        self.stage_info = ctx.stage_info

    def teardown(self) -> None:
        pass

    def process_many(self, elems: list["SampleRecord"]) -> list["SampleRecord"]:
        raise NotImplementedError(
            f"{type(self).__name__} implements neither process_frame nor process_many; "
            "implement one of them"
        )

    def process_one(self, elem: "SampleRecord") -> list["SampleRecord"]:
        return self.process_many([elem])

    def process_frame(self, frame: pa.Table) -> pa.Table:
        """Columnar hook. The default runs ``process_many`` on row views of the frame."""
        from zephon_columnar.ops.rows import run_rows

        return run_rows(frame, self.process_many, op_name=self.op_name())

    def accumulator(self, *, deterministic: bool, ctx: dict[str, Any]) -> "Accumulator[Any] | None":
        """Zephon-style accumulator factory; None (the default) means stateless."""
        return None

    def lane_accumulator(self, ctx: "LaneContext | None" = None) -> "LaneAccumulator | None":
        """Per-lane state for ordered work, or None for a stateless operator.

        Stateful operators return a fresh `LaneAccumulator` for the lane ``ctx`` describes
        (a default context when None: lane 0, seed 0); the engine makes one per lane and
        flushes it at every flush point. An operator that overrides this is an ordered stage.
        """
        return None

    def is_ordered(self) -> bool:
        """Whether this operator keeps per-lane state (it overrides ``lane_accumulator``)."""
        return type(self).lane_accumulator is not BaseOp.lane_accumulator

    def validation_samples(self) -> list["SampleRecord"] | None:
        return None

    # ---------------------------------------------------------------- helpers
    def op_name(self) -> str:
        return self.name or type(self).__name__

    def fingerprint(self) -> dict[str, Any]:
        """JSON-friendly description of what this op does to the data (part of the recipe a
        checkpoint is checked against). Subclasses add the arguments that change the data."""
        return {"op": self.op_name()}

    def clone(self) -> "BaseOp":
        return copy.deepcopy(self)

    @classmethod
    def plan_identity(cls) -> str:
        return f"{cls.__module__}.{cls.__qualname__}"

