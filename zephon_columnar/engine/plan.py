"""The plan compiler: the user's operator list -> stages.

Consecutive stateless operators fuse into one *parallel* stage (run on workers, re-sequenced);
an operator with per-lane state becomes an *ordered* stage (its accumulator sees each lane's
rows in order on one thread); a user operator becomes the stages its accumulator calls for
(`zephon_columnar.ops.user.stages_of`); `batch` closes the plan, and only ``map_batch`` may
follow it. Whether the plan has any ordered stage decides the flush cadence (see
`Plan.flush_every`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from zephon_columnar.errors import ConfigError
from zephon_columnar.ops.base import BaseOp
from zephon_columnar.ops.batch import BatchOp
from zephon_columnar.ops.map import MapBatchOp
from zephon_columnar.ops.user import stages_of

#: Chunks per flush epoch when a plan has stateful operators and no explicit cadence
#: (Zephon's default). Plans without stateful operators replay from every chunk boundary.
DEFAULT_FLUSH_EVERY = 8


@dataclass(frozen=True)
class ParallelStage:
    ops: tuple[BaseOp, ...]

    @property
    def parallelism(self) -> int:
        return max(op.traits().workers() for op in self.ops)


@dataclass(frozen=True)
class OrderedStage:
    op: BaseOp


Stage = ParallelStage | OrderedStage


@dataclass(frozen=True)
class Plan:
    stages: tuple[Stage, ...]
    batch: BatchOp | None
    flush_every: int
    after_batch: tuple[MapBatchOp, ...] = ()

    def fetch_stage(self) -> ParallelStage:
        """The first stage: the parallel one that starts with the fetch (every plan has it)."""
        first = self.stages[0]
        assert isinstance(first, ParallelStage), "a plan starts with its fetch stage"
        return first

    @property
    def stateful(self) -> bool:
        return any(isinstance(s, OrderedStage) for s in self.stages)

    def parallel_stages(self) -> list[ParallelStage]:
        return [s for s in self.stages if isinstance(s, ParallelStage)]

    def ordered_stages(self) -> list[OrderedStage]:
        return [s for s in self.stages if isinstance(s, OrderedStage)]

    def fingerprint(self) -> list[dict[str, Any]]:
        """What the operators do to the data (batching excluded: batch size may change on resume)."""
        out: list[dict[str, Any]] = []
        for stage in self.stages:
            ops = stage.ops if isinstance(stage, ParallelStage) else (stage.op,)
            out.extend(op.fingerprint() for op in ops)
        return out + [op.fingerprint() for op in self.after_batch]


def compile_plan(ops: Sequence[BaseOp], *, flush_every_k_chunks: int | None) -> Plan:
    stages: list[Stage] = []
    run: list[BaseOp] = []
    batch: BatchOp | None = None
    after_batch: list[MapBatchOp] = []
    for given in ops:
        if batch is not None:
            if isinstance(given, MapBatchOp):
                after_batch.append(given)
                continue
            raise ConfigError(
                f"operator {given.op_name()!r} comes after batch(); only map_batch may follow batch(). "
                "Move it before batch()."
            )
        if isinstance(given, MapBatchOp):
            raise ConfigError(
                "map_batch comes before batch(); it transforms SampleBatches, so add it after "
                "batch(), or use map_transform for records."
            )
        if isinstance(given, BatchOp):
            batch = given
            continue
        for op in stages_of(given):
            if not op.is_ordered():
                run.append(op)
                continue
            if run:
                stages.append(ParallelStage(tuple(run)))
                run = []
            stages.append(OrderedStage(op))
    if run:
        stages.append(ParallelStage(tuple(run)))
    stateful = any(isinstance(s, OrderedStage) for s in stages)
    if stateful:
        if flush_every_k_chunks == 0:
            raise ConfigError(
                "options(flush_every_k_chunks=0) with stateful operators "
                f"({[s.op.op_name() for s in stages if isinstance(s, OrderedStage)]}): a flush point is "
                "needed to bound checkpoint replay; pass a positive cadence (default 8)."
            )
        flush_every = flush_every_k_chunks or DEFAULT_FLUSH_EVERY
    else:
        # No state to flush: replay points only, whatever the option says (the engine spaces them
        # by its frame size).
        flush_every = 1
    return Plan(stages=tuple(stages), batch=batch, flush_every=flush_every, after_batch=tuple(after_batch))
