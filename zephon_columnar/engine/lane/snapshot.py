"""A lane's checkpoint by reference: a snapshot of its chain between two deliveries.

Where the source resumes (a chunk, an offset in it, the work-source state before that chunk),
each ordered stage's own state (`ReferenceState`: scalars and the rows it holds, by reference),
and the rows in transit, by reference. The source resumes as late as it can: at the first row
not yet in a batch when the plan resumes by input, else at the first ordered stage's first
input not pushed when nothing fans out before it, else at the first frame in flight. A lane
whose only state is a packer that `Rewinds` is a source position (`rewind`).

Nothing here changes the chain; `resume_floor` says how far back a snapshot may ever reach, so
the source can drop the older work-source states.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow.compute as pc

from zephon_columnar import frame as F
from zephon_columnar.engine.checkpoint import EpochMarker, HeldRows, LaneSnapshot, QueueEntry, ResumePoint, StageState
from zephon_columnar.engine.lane import rewind
from zephon_columnar.engine.lane.setup import EpochStart
from zephon_columnar.engine.lane.steps import LazyRows, OrderedStep, ParallelStep
from zephon_columnar.ops.accumulators.lane import ReadsChunkTargets

if TYPE_CHECKING:
    from zephon_columnar.engine.lane.chain import LaneChain


def resume_floor(chain: LaneChain) -> int:
    """The oldest chunk `snapshot` could resume from now or later: rows only move downstream,
    so the positions it chooses from (the collector's first row, the first ordered stage's
    first input, the first row in flight, the source's next row) never move back. Rows a
    restore holds by reference are not counted: a snapshot keeps them by reference."""
    source, steps = chain.source, chain.steps
    chunks = [source.next_position[0]]
    inflight = steps[0].in_transit() if isinstance(steps[0], ParallelStep) else []
    if inflight:
        chunks.append(source.position_of(inflight[0])[0])
    head = steps[1] if len(steps) > 1 and isinstance(steps[1], OrderedStep) else None
    held = [
        list(head.inbox) if head is not None else [],
        [e[0] for e in chain.collector.pending] if chain.setup.resume_by_input else [],
    ]
    for rows in held:
        first = next((r for r in rows if not isinstance(r, LazyRows) and r.num_rows), None)
        if first is not None:
            chunks.append(source.position_of(first)[0])
    return min(chunks)


def snapshot(chain: LaneChain, items: int) -> LaneSnapshot:
    """This lane's state between two deliveries (see the module docstring)."""
    rewound = rewind.rewound(chain, items)
    if rewound is not None:
        return rewound
    steps, source = chain.steps, chain.source
    first = steps[0]
    assert isinstance(first, ParallelStep)  # fetch is always first
    inflight = first.in_transit()
    rows = chain.collector.pending_rows()
    head = steps[1] if len(steps) > 1 and isinstance(steps[1], OrderedStep) else None
    inbox = [p for p in head.inbox if p.num_rows] if head is not None else []
    one_to_one = not any(op.traits().fans_out for op in chain.setup.plan.fetch_stage().ops)
    # Rows a restore put back by reference come from before this run's first chunk, where the
    # source has no state: they stay references, and the lane resumes after them.
    at = None
    if chain.setup.resume_by_input and rows:
        # No state and at most one row per input: the first row not yet in a batch says where
        # to resume, and nothing needs to be held by reference.
        at = source.position_of(rows[0])
        if source.knows_state_before(at[0]):
            rows = []
        else:
            at = None
    if at is None and one_to_one and inbox:
        # The first ordered stage's unpushed input maps to source positions: resume there.
        at = source.position_of(inbox[0].refs if isinstance(inbox[0], LazyRows) else inbox[0])
        if source.knows_state_before(at[0]):
            head = None
        else:
            at = None
    if at is None:
        at = source.position_of(inflight[0]) if inflight else source.next_position
    chunk, offset, marker = at
    resume = ResumePoint(chunk=chunk, offset=offset, marker=marker, source_state=source.state_before(chunk))
    stages = []
    for pos, step in enumerate(steps):
        if not isinstance(step, OrderedStep):
            continue
        state, held = step.acc.snapshot()
        transit = list(step.out)
        following = steps[pos + 1] if pos + 1 < len(steps) else None
        if isinstance(following, ParallelStep):
            transit = following.in_transit() + transit
        stages.append(
            StageState(
                state=state,
                rows=held,
                inbox=None if step is steps[1] and head is None else step.inbox_refs(),
                queue=tuple(queue_entry(ev) for ev in transit if isinstance(ev, EpochStart) or ev.num_rows),
            )
        )
    pending = HeldRows(refs=F.concat_frames(rows), schema=chain.collector.payload_schema()) if rows else None
    targets, exhaustion = {}, {}
    if any(isinstance(s.acc, ReadsChunkTargets) for s in steps if isinstance(s, OrderedStep)):
        # Rows still in the lane come from chunks at or after the oldest one they name.
        named = (
            [t for s in stages for t in (s.rows, s.inbox) if t is not None]
            + [e.refs for s in stages for e in s.queue if isinstance(e, HeldRows)]
            + ([pending.refs] if pending is not None else [])
        )
        oldest = min([int(pc.min(t.column(F.CHUNK)).as_py()) for t in named if t.num_rows] + [chunk])
        targets = {c: t for c, t in chain.shared.targets.items() if c >= oldest}
        exhaustion = {c: e for c, e in chain.shared.exhaustion.items() if c >= oldest}
    return LaneSnapshot(
        items=items, resume=resume, stages=tuple(stages), pending=pending, targets=targets, exhaustion=exhaustion
    )


def queue_entry(ev: Any) -> QueueEntry:
    if isinstance(ev, EpochStart):
        return EpochMarker(epoch=ev.epoch)
    if isinstance(ev, LazyRows):  # restored and not passed on yet: still references
        return HeldRows(refs=ev.refs, schema=ev.schema)
    return HeldRows(refs=F.refs_of(ev), schema=F.payload_of(ev).schema)
