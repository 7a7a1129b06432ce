"""Which of the two checkpoint modes a plan gets: *by reference* or *by replay* (see the
package docstring), decided once from what the plan's operators declare.

By replay when the work source's mixture may change during the run (`Pipeline.set_mixture`):
a replay cursor starts at its flush epoch's first chunk, so where a change may take effect
follows from what was delivered (`zephon_columnar.engine.checkpoint.change_point`). Else by
reference when every ordered stage's accumulator describes its state by reference
(`ReferenceState`), nothing after the first ordered stage may make several rows of one (rows
in transit are then named by their bookkeeping), and at most one ordered stage composes rows
of pieces of several inputs (`OpTraits.composes_rows`: a row a packer made is named by its
pieces, which a second packer's rows cannot be). Else by replay, with the reason.

Example:
    >>> from zephon_columnar.ops.fetch import FetchOp
    >>> from zephon_columnar.ops.shuffle import ShuffleOp
    >>> from zephon_columnar.engine.plan import compile_plan
    >>> checkpoint_mode(compile_plan([FetchOp(), ShuffleOp(8)], flush_every_k_chunks=None)).by
    'reference'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from zephon_columnar.engine.plan import OrderedStage, Plan
from zephon_columnar.ops.accumulators.lane import restorable_by_reference

CheckpointBy = Literal["reference", "replay"]


@dataclass(frozen=True, kw_only=True)
class CheckpointMode:
    """How a plan's checkpoints describe each lane (``by``), and why (``reason``, which
    ``explain()`` prints)."""

    by: CheckpointBy
    reason: str


def checkpoint_mode(plan: Plan, *, mixture_changes: bool = False) -> CheckpointMode:
    """The mode ``plan`` is checkpointed in, over a work source whose mixture may change during
    the run (``mixture_changes``) or not (see the module docstring)."""
    if mixture_changes:
        return CheckpointMode(
            by="replay", reason="the mixture may change during the run (set_mixture), where a replay cursor says"
        )
    seen_ordered = False
    composers = 0
    for stage in plan.stages:
        if isinstance(stage, OrderedStage):
            seen_ordered = True
            if not restorable_by_reference(stage.op.lane_accumulator()):
                return CheckpointMode(
                    by="replay", reason=f"{stage.op.op_name()!r} keeps state that only a replay rebuilds"
                )
            composers += stage.op.traits().composes_rows
            if composers > 1:
                return CheckpointMode(by="replay", reason="a packer packs rows another packer made")
        elif seen_ordered and (names := [op.op_name() for op in stage.ops if op.traits().fans_out]):
            return CheckpointMode(by="replay", reason=f"{names} may make several rows of one after an ordered stage")
    return CheckpointMode(by="reference", reason="every ordered stage describes its state by reference")
