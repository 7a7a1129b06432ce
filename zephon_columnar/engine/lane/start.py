"""Where a lane starts, one start object per kind of saved state, and what a run keeps to
checkpoint the lane, one ledger per checkpoint mode. With `zephon_columnar.engine.checkpoint`,
the only code that knows the two modes.

    FromCursor      a `LaneCursor`: the start of the stream, or a flush epoch replayed from its
                    first chunk with the rows already delivered skipped (by replay)
    FromSnapshot    a `LaneSnapshot`: stages get their state back, rows held by reference are
                    computed when taken, the source continues where it stopped (by reference)
    ByReplay        the cursor after each item delivered (the state is the last one's)
    ByReference     a snapshot of the chain when asked (`zephon_columnar.engine.lane.snapshot`)
"""

from __future__ import annotations

import dataclasses
import json
from collections import deque
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.engine.checkpoint import (
    CheckpointMode,
    EpochMarker,
    HeldRows,
    LaneCursor,
    LaneSnapshot,
    LaneState,
    StageState,
)
from zephon_columnar.engine.lane import snapshot as lane_snapshot
from zephon_columnar.engine.lane.collector import Collector
from zephon_columnar.engine.lane.regenerate import Regenerator
from zephon_columnar.engine.lane.setup import EpochStart, LaneItem, LaneShared
from zephon_columnar.engine.lane.steps import LazyRows, OrderedStep
from zephon_columnar.errors import CheckpointError
from zephon_columnar.ops.accumulators.lane import ReferenceState, RowSource

if TYPE_CHECKING:
    from zephon_columnar.engine.lane.chain import LaneChain


class LaneStart(Protocol):
    """Where a lane starts: the work source in ``source_state``; how the
    chain's parts are primed (`zephon_columnar.engine.lane.chain.LaneChain` calls these in
    order, once)."""

    source_state: Mapping[str, Any]
    #: the snapshot the lane was restored from (None: not restored from one)
    restored_from: LaneSnapshot | None

    def prime(self, shared: LaneShared) -> None:
        """Give the lane's bookkeeping what the saved state says."""

    def source_position(self, k: int) -> tuple[int, int, bool]:
        """``(chunk, offset, marker)`` the source starts at, with ``k`` chunks per flush epoch."""

    def flush_epochs(self, k: int, ordered: int) -> list[int]:
        """The flush epoch each of the ``ordered`` ordered stages starts in, then the collector's."""

    def restore_stage(
        self, index: int, pos: int, acc: Any, regen: Regenerator, *, op: str
    ) -> tuple[list[Any] | None, list[Any] | None]:
        """Give ordered stage ``index`` (at plan position ``pos``) its state back; what it had
        emitted and not passed on, and its input not pushed (None: nothing)."""

    def restore_collector(self, collector: Collector, regen: Regenerator, last_pos: int) -> None:
        """Give the collector the rows not yet in an item (``last_pos``: the last stage's position)."""

    def collector_skip(self) -> tuple[int, Mapping[str, Any]]:
        """Rows of the collector's first flush epoch already delivered, and the work-source
        state at that epoch's start."""

    def restated(self, source_state: Mapping[str, Any]) -> LaneStart:
        """This start with ``source_state`` for its own: the state the lane's work source gives
        once it has loaded ``self.source_state`` (the same position, stated by this source: a
        scheduled mixture adds the changes it had beyond the saved ones), so that every later
        checkpoint of the lane carries it."""


class FromCursor:
    """A lane from a `LaneCursor` (see the module docstring)."""

    def __init__(self, cursor: LaneCursor) -> None:
        self.restored_from: LaneSnapshot | None = None
        self.cursor = cursor
        self.source_state = cursor.source_state

    def prime(self, shared: LaneShared) -> None:
        c = self.cursor
        shared.fresh = c.items == 0
        shared.exhausted_changes.append((c.epoch, c.exhausted))
        shared.carries[c.epoch] = dict(c.carries)
        shared.carried_into = (c.epoch, c.carries)

    def source_position(self, k: int) -> tuple[int, int, bool]:
        return (self.cursor.epoch * k, self.cursor.inputs, True)

    def flush_epochs(self, k: int, ordered: int) -> list[int]:
        return [self.cursor.epoch] * (ordered + 1)

    def restore_stage(
        self, index: int, pos: int, acc: Any, regen: Regenerator, *, op: str
    ) -> tuple[list[Any] | None, list[Any] | None]:
        return None, None  # every stage starts fresh at the epoch's start

    def restore_collector(self, collector: Collector, regen: Regenerator, last_pos: int) -> None:
        pass

    def collector_skip(self) -> tuple[int, Mapping[str, Any]]:
        return self.cursor.rows, self.cursor.source_state

    def restated(self, source_state: Mapping[str, Any]) -> FromCursor:
        return FromCursor(dataclasses.replace(self.cursor, source_state=source_state))


class FromSnapshot:
    """A lane from a `LaneSnapshot` (see the module docstring)."""

    def __init__(self, saved: LaneSnapshot) -> None:
        self.saved = saved
        self.restored_from: LaneSnapshot | None = saved
        self.source_state = saved.resume.source_state

    def prime(self, shared: LaneShared) -> None:
        shared.fresh = False
        shared.targets.update(self.saved.targets)
        shared.exhaustion.update(self.saved.exhaustion)

    def source_position(self, k: int) -> tuple[int, int, bool]:
        resume = self.saved.resume
        return (resume.chunk, resume.offset, resume.marker)

    def flush_epochs(self, k: int, ordered: int) -> list[int]:
        return _epochs_at(self.saved, k)

    def restore_stage(
        self, index: int, pos: int, acc: Any, regen: Regenerator, *, op: str
    ) -> tuple[list[Any] | None, list[Any] | None]:
        saved = self.saved.stages[index]
        source = regen.source_for(pos)
        _restore_accumulator(acc, saved, source, lane=regen.shared.ctx.lane, stage=index, op=op)
        queued: list[Any] = [
            EpochStart(e.epoch, {})
            if isinstance(e, EpochMarker)
            else LazyRows(e.refs, regen.output_source(pos, e.schema), e.schema)
            for e in saved.queue
        ]
        inbox = None
        if saved.inbox is not None:
            size = OrderedStep.INPUT_SLICE
            inbox = [LazyRows(saved.inbox.slice(i, size), source) for i in range(0, saved.inbox.num_rows, size)]
        return queued, inbox

    def restore_collector(self, collector: Collector, regen: Regenerator, last_pos: int) -> None:
        held = self.saved.pending
        if held is not None:
            collector.restore_pending(LazyRows(held.refs, regen.output_source(last_pos, held.schema), held.schema))

    def collector_skip(self) -> tuple[int, Mapping[str, Any]]:
        return 0, self.saved.resume.source_state

    def restated(self, source_state: Mapping[str, Any]) -> FromSnapshot:
        resume = dataclasses.replace(self.saved.resume, source_state=source_state)
        return FromSnapshot(dataclasses.replace(self.saved, resume=resume))


def lane_start(saved: LaneState) -> LaneStart:
    """The start object for a lane's saved state."""
    return FromSnapshot(saved) if isinstance(saved, LaneSnapshot) else FromCursor(saved)


# ---------------------------------------------------------------------- ledgers
class LaneLedger(Protocol):
    """What a run keeps to checkpoint one lane: told of every item delivered to the caller,
    asked for the lane's state after its first ``items`` items, the ``undelivered`` item
    frames (made ahead, not handed over) going back into the lane."""

    def delivered(self, item: LaneItem, items: int) -> None: ...

    def state(self, items: int, undelivered: Sequence[pa.Table]) -> LaneState: ...


class ByReplay:
    """By replay: the cursor after each item, built from the item's bookkeeping. Keeps the last
    ``in_transit + 1``: items delivered here may still be on their way to the consumer (a side
    process's ring) when a checkpoint is asked for."""

    def __init__(self, start: LaneStart, shared: LaneShared, in_transit: int) -> None:
        if not isinstance(start, FromCursor):
            raise CheckpointError(
                f"checkpoint lane {shared.ctx.lane}: a snapshot by reference, but this plan is checkpointed by "
                "replay; the checkpoint belongs to another pipeline."
            )
        self.shared: LaneShared = shared
        self.start = start.cursor
        # The bookkeeping of the last items delivered (a tuple each: a cursor per item cost 8 us);
        # a cursor is made of one when asked (what the chunks before an epoch said ran out never
        # changes once the epoch started).
        self.in_transit = in_transit
        self.delivered_items: deque[_Delivered] = deque(maxlen=in_transit + 1)

    def delivered(self, item: LaneItem, items: int) -> None:
        self.delivered_items.append((items, item.epoch, item.inputs, item.rows, item.source_state, item.carries))

    def state(self, items: int, undelivered: Sequence[pa.Table]) -> LaneState:
        # Undelivered items have no cursor kept: the last delivered one's is the state.
        for count, epoch, inputs, rows, source_state, carries in reversed(self.delivered_items):
            if count == items:
                return LaneCursor(
                    epoch=epoch,
                    inputs=inputs,
                    rows=rows,
                    items=count,
                    source_state=source_state,
                    carries=carries,
                    exhausted=self.shared.exhausted_before(epoch),
                )
        if self.start.items == items and len(self.delivered_items) <= self.in_transit:  # the start not yet pushed out
            return self.start
        raise CheckpointError(
            f"lane {self.shared.ctx.lane}: no cursor after item {items} is kept (the last "
            f"{len(self.delivered_items)} are); this is a bug, please report it with the pipeline's explain()"
        )


#: What `ByReplay` keeps of a delivered item: (items so far, epoch, inputs, rows, source state, carries).
_Delivered = tuple[int, int, int, int, Mapping[str, Any], Mapping[int, pa.Table]]


class ByReference:
    """By reference: a snapshot of the chain when asked; items made ahead go back in front of
    the collector's rows."""

    def __init__(self, chain: LaneChain) -> None:
        self.chain = chain

    def delivered(self, item: LaneItem, items: int) -> None:
        pass  # the chain itself is the state

    def state(self, items: int, undelivered: Sequence[pa.Table]) -> LaneState:
        snap = lane_snapshot.snapshot(self.chain, items)
        if not undelivered:
            return snap
        refs = [F.refs_of(t) for t in undelivered] + ([snap.pending.refs] if snap.pending is not None else [])
        schema = F.payload_of(F.concat_frames(list(undelivered))).schema
        return dataclasses.replace(snap, pending=HeldRows(refs=F.concat_frames(refs), schema=schema))


def lane_ledger(mode: CheckpointMode, chain: LaneChain, start: LaneStart, *, in_transit: int = 0) -> LaneLedger:
    """The ledger of ``chain`` (started from ``start``) for checkpoints in ``mode``."""
    if mode.by == "replay":
        return ByReplay(start, chain.shared, in_transit)
    return ByReference(chain)


# ---------------------------------------------------------------------- restore by reference
def _epochs_at(snapshot: LaneSnapshot, k: int) -> list[int]:
    """The flush epoch each ordered stage of a restored lane is in, then the collector's. The
    source resumes in ``chunk // k`` (one before, when that epoch's marker has yet to go out);
    what follows a stage is in the same epoch, unless a marker is queued between them: then it
    is still in the epoch before that marker."""
    resume = snapshot.resume
    epoch = max(0, resume.chunk // k - int(resume.marker))
    epochs = [epoch]
    for stage in snapshot.stages:  # what ordered stage j emitted, in front of the next one
        markers = [e.epoch for e in stage.queue if isinstance(e, EpochMarker)]
        epochs.append(markers[0] - 1 if markers else epochs[-1])
    return epochs


def _restore_accumulator(
    acc: ReferenceState, saved: StageState, source: RowSource, *, lane: int, stage: int, op: str
) -> None:
    """``acc.restore`` from a checkpoint's stage state. Restore checked the checkpoint's shape
    and digest; a state an accumulator still cannot read (written by hand, or by a bug) is a
    `CheckpointError` naming the stage, not the accumulator's own KeyError or TypeError."""
    where = f"checkpoint lanes.{lane}.stages[{stage}] ({op!r})"
    try:
        acc.restore(dict(saved.state), saved.rows, source)
        # What a well-formed state restores to snapshots back as it was written; a value the
        # accumulator read another way (a fraction taken as an int, a field it ignored) does not.
        state, rows = acc.snapshot()
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, AssertionError, OverflowError) as err:
        raise CheckpointError(
            f"{where}: its state cannot be restored ({type(err).__name__}: {err}); the checkpoint "
            "is damaged or was written by another version."
        ) from err
    if _canonical(state) != _canonical(saved.state) or not _same_refs(rows, saved.rows):
        raise CheckpointError(
            f"{where}: its state does not read back as written ({_canonical(saved.state)[:200]} "
            f"restores as {_canonical(state)[:200]}); the checkpoint is damaged."
        )


def _canonical(state: Any) -> str:
    return json.dumps(state, sort_keys=True, default=repr)


def _same_refs(a: pa.Table | None, b: pa.Table | None) -> bool:
    if a is None or b is None or not a.num_rows or not b.num_rows:
        return (a is None or not a.num_rows) and (b is None or not b.num_rows)
    return (
        a.num_rows == b.num_rows
        and set(a.column_names) == set(b.column_names)
        and a.select(b.column_names).equals(b, check_metadata=False)
    )
