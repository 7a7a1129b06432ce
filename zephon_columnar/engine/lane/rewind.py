"""A lane checkpointed as a source position: when its only state is one accumulator that
`Rewinds` (the uncapped wrap packer fed one row per sample, `LanePacker.rewind`), the lane's
snapshot is where to read its input again and the few numbers the packer restores to skip what
was delivered, with nothing held by reference.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.engine.checkpoint import HeldRows, LaneSnapshot, ResumePoint, StageState
from zephon_columnar.engine.lane.steps import OrderedStep, ParallelStep
from zephon_columnar.ops.accumulators.lane import Rewinds

if TYPE_CHECKING:
    from zephon_columnar.engine.lane.chain import LaneChain


def rewound(chain: LaneChain, items: int) -> LaneSnapshot | None:
    """The whole lane as a source position, when it is one stateless one-row-per-sample stage
    and an accumulator that implements `Rewinds` (today the uncapped wrap packer: see
    `LanePacker.rewind`). None otherwise."""
    steps, plan = chain.steps, chain.setup.plan
    ordered = [s for s in steps if isinstance(s, OrderedStep)]
    if len(ordered) != 1 or len(steps) < 2 or steps[1] is not ordered[0]:
        return None
    packer = ordered[0].acc
    if not (isinstance(packer, Rewinds) and packer.can_rewind()) or any(
        op.traits().fans_out for op in plan.fetch_stage().ops
    ):
        return None
    if packer.skip_pending() and chain.restored_from is not None:
        # Restored by rewinding and no document pushed since: the packer is where that
        # checkpoint put it (its skip included), and the only rows in the lane are what the
        # restore held for the collector (a rewound snapshot has nothing in transit).
        rows = chain.collector.pending_rows()
        start = chain.restored_from
        return dataclasses.replace(
            start,
            items=items,
            stages=tuple(dataclasses.replace(s, inbox=None, queue=()) for s in start.stages),
            pending=HeldRows(refs=F.concat_frames(rows), schema=chain.collector.payload_schema()) if rows else None,
        )
    # The oldest row of the packer not delivered yet: in the collector, then in transit.
    after = steps[2] if len(steps) > 2 else None
    downstream = chain.collector.pending_rows() + [
        F.refs_of(ev)
        for ev in (after.in_transit() if isinstance(after, ParallelStep) else []) + list(ordered[0].out)
        if isinstance(ev, pa.Table) and ev.num_rows
    ]
    where, state = packer.rewind(downstream[0] if downstream else None)
    if where is None:
        return None
    chunk, offset = where
    if chunk not in chain.source.states:
        return None  # too far back to regenerate cheaply: held by reference instead
    resume = ResumePoint(chunk=chunk, offset=offset, marker=False, source_state=chain.source.states[chunk])
    return LaneSnapshot(
        items=items,
        resume=resume,
        stages=(StageState(state=state, rows=None, inbox=None, queue=()),),
        pending=None,
        targets={},
        exhaustion={},
    )
