"""Rows computed again from their references (`frame.refs_of`), through the plan's operators:
what a restore by reference uses for the rows in transit and the rows ordered stages hold.

A row is named by its bookkeeping (chunk, offset, lineage, first segment); running its source
rows through the stateless stages and the ordered stages' ``rebuild`` gives it back, the same
bytes, because operators are deterministic (a row that does not come back is an error naming it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.engine.lane.setup import LaneShared
from zephon_columnar.engine.lane.steps import OrderedStep, ParallelStep
from zephon_columnar.engine.plan import ParallelStage, Plan
from zephon_columnar.engine.runners import Runner
from zephon_columnar.errors import CheckpointError
from zephon_columnar.ops.accumulators.lane import restorable_by_reference


class Regenerator:
    """Computes rows again from their references, through the plan's operators: what restore
    uses for rows in transit and for the rows ordered stages hold."""

    def __init__(
        self, plan: Plan, runner: Runner, shared: LaneShared, steps: Sequence[ParallelStep | OrderedStep]
    ) -> None:
        self.plan = plan
        self.runner = runner
        self.shared = shared
        self.steps = steps  # the chain's, aligned with the plan's stages (filled as the chain is built)
        index, self.parallel_index = 0, {}
        for pos, stage in enumerate(self.plan.stages):
            if isinstance(stage, ParallelStage):
                self.parallel_index[pos] = index
                index += 1

    def source_for(self, pos: int) -> Callable[..., pa.Table]:
        """Rows at the input of the stage at plan position ``pos``, from their references (and,
        for packed rows, their payload schema)."""
        return lambda refs, schema=None: self.outputs_of(pos - 1, refs, schema)

    def output_source(self, pos: int, schema: pa.Schema | None) -> Callable[[pa.Table], pa.Table]:
        """Rows at the output of the stage at plan position ``pos`` with payload ``schema``, from
        their references: what a restore uses for rows in transit after that stage."""
        return lambda refs: self.outputs_of(pos, refs, schema)

    def outputs_of(self, pos: int, refs: pa.Table, schema: pa.Schema | None = None) -> pa.Table:
        """Rows at the output of the stage at plan position ``pos`` (-1: the source's pointer
        frames), in the order of ``refs``."""
        if pos < 0:
            return _pointer_rows(refs, self.shared.ctx.lane)
        stage = self.plan.stages[pos]
        if isinstance(stage, ParallelStage):
            before = self.outputs_of(pos - 1, refs, schema)
            runner = self.runner
            rows = runner.result(runner.submit(self.parallel_index[pos], before))
            return _select(rows, refs, what=", ".join(op.op_name() for op in stage.ops))
        step = self.steps[pos] if pos < len(self.steps) else None
        acc = step.acc if isinstance(step, OrderedStep) else stage.op.lane_accumulator(self.shared.ctx)
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


def _keys(frame: pa.Table) -> list[tuple[Any, ...]]:
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
