"""A lane's collector: cuts the lane's rows into batches (or single records), the lane's
items, each with where it ends in the lane (`LaneItem`).

``pending`` holds the rows not yet in an item, as entries ``[frame, epoch, source_state, index
in the epoch of the frame's first row, carries]``; a checkpoint reads them between two items.
A lane restored inside a flush epoch by replay skips the ``skip`` rows of it already delivered.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.engine.lane.setup import EpochStart, LaneItem, LaneSetup, LaneShared
from zephon_columnar.engine.lane.steps import LazyRows
from zephon_columnar.engine.realized import ROWS_BATCHED, starved_message
from zephon_columnar.errors import CheckpointError, PassTailWarning, StarvedComponentWarning
from zephon_columnar.losses import Notice, share_text
from zephon_columnar.records import records_of
from zephon_columnar.types import SampleBatch

#: Lane counter: rows ``batch(drop_last=True)`` dropped at the ends of lanes, short of a batch.
DROPPED_FINAL_ROWS = "batch_dropped_final_rows"


class Collector:
    """Cuts a lane's rows into batches (or single records). ``pending``: entries
    ``[frame, epoch, source_state, index in the epoch of the frame's first row, carries]``."""

    def __init__(
        self,
        setup: LaneSetup,
        shared: LaneShared,
        upstream: Iterator[Any],
        epoch: int,
        skip: int,
        source_state: Mapping[str, Any],
    ) -> None:
        self.setup = setup
        self.shared = shared
        self.upstream = upstream
        self.epoch = epoch
        self.skip = skip
        self.state = source_state
        self.pending: deque[list[Any]] = deque()
        self.restored_schema: pa.Schema | None = None

    def restore_pending(self, rows: LazyRows) -> None:
        """After a restore: the rows not yet in a batch, by reference (computed when taken)."""
        self.restored_schema = rows.schema
        if rows.num_rows:
            self.pending.append([rows, self.epoch, self.state, 0, self._epoch_reached(self.epoch)])

    def payload_schema(self) -> pa.Schema | None:
        """The payload schema of the rows not yet in a batch (what recomputing them gives)."""
        for entry in self.pending:
            if not isinstance(entry[0], LazyRows):
                return F.payload_of(entry[0]).schema
        return self.restored_schema

    def pending_rows(self) -> list[pa.Table]:
        """References of the rows not yet in a batch, oldest first."""
        return [e[0].refs if isinstance(e[0], LazyRows) else F.refs_of(e[0]) for e in self.pending if e[0].num_rows]

    def __iter__(self) -> Iterator[LaneItem]:
        """The lane's items; their rows are counted in the realized mixture as they reach the
        batcher (`zephon_columnar.engine.realized`)."""
        setup = self.setup
        lane = self.shared.ctx.lane
        batch = setup.plan.batch
        size = batch.microbatch_size if batch else 1
        fields = setup.fields
        pending = self.pending
        pending_rows = sum(e[0].num_rows for e in pending)
        epoch, state, skip = self.epoch, self.state, self.skip
        carries = self._epoch_reached(epoch)
        rows_in_epoch = 0
        while batch is not None and pending_rows >= size:
            yield take_batch(lane, pending, size, fields)
            pending_rows -= size
        for ev in self.upstream:
            if isinstance(ev, EpochStart):
                if skip and ev.epoch != self.epoch:
                    raise self._replay_overrun(skip)
                epoch, state, rows_in_epoch = ev.epoch, ev.source_state, 0
                carries = self._epoch_reached(epoch)
                self._judge_mixture(epoch)
                continue
            frame: pa.Table = ev
            if skip:
                # Replay restore: drop the rows of the replayed epoch that were already delivered.
                dropped = min(skip, frame.num_rows)
                frame = frame.slice(dropped)
                skip -= dropped
                rows_in_epoch += dropped
            if frame.num_rows == 0:
                continue
            self.shared.mixture.delivered(frame)  # counted whole frames at a time (a batch's worth waits)
            pending.append([frame, epoch, state, rows_in_epoch, carries])
            rows_in_epoch += frame.num_rows
            pending_rows += frame.num_rows
            if batch is None:
                yield from drain_records(lane, pending, fields)
                pending_rows = 0
                continue
            while pending_rows >= size:
                yield take_batch(lane, pending, size, fields)
                pending_rows -= size
        if skip:
            raise self._replay_overrun(skip)
        if batch is None:
            yield from drain_records(lane, pending, fields)
        elif pending_rows and not batch.drop_last:
            yield take_batch(lane, pending, pending_rows, fields)
        elif pending_rows:
            self._dropped_final_rows(pending_rows, size)

    def _judge_mixture(self, epoch: int) -> None:
        """Flush epoch ``epoch`` starts: every row of the earlier ones reached the batcher. In an
        endless stream (whose pass never ends to say it), a component far behind its target
        there is warned of once."""
        starved = self.shared.mixture.settle(epoch)
        notices = self.shared.ctx.notices
        if starved and not notices.pass_ends:
            for share in starved:
                notices.warn(
                    f"starved.{share.name}",
                    starved_message([share], [self.shared.ctx.lane], scope="so far"),
                    StarvedComponentWarning,
                )

    def _dropped_final_rows(self, rows: int, size: int) -> None:
        """``drop_last=True`` (Zephon's default) at the end of the lane: the rows short of a batch
        are counted, and noted: a routine tail (`zephon_columnar.losses`)."""
        ctx = self.shared.ctx
        ctx.stats[DROPPED_FINAL_ROWS] = ctx.stats.get(DROPPED_FINAL_ROWS, 0) + rows

        def text(c: Mapping[str, int], scope: str) -> str:
            dropped, batched = c.get(DROPPED_FINAL_ROWS, 0), c.get(ROWS_BATCHED, 0)
            return (
                f"batch({size}) dropped {dropped} of {batched} rows ({share_text(dropped, batched)}) {scope}: each "
                "lane's last rows short of a batch (drop_last=True, the default). Counted in metrics_snapshot() as "
                f"{DROPPED_FINAL_ROWS}; pass batch({size}, drop_last=False) to get them as a short batch."
            )

        def share(c: Mapping[str, int]) -> float:
            return c.get(DROPPED_FINAL_ROWS, 0) / max(1, c.get(ROWS_BATCHED, 0))

        notice = Notice(kind=DROPPED_FINAL_ROWS, category=PassTailWarning, text=text, share=share)
        ctx.notices.note(notice, ctx.stats, lane=ctx.lane)

    def _epoch_reached(self, epoch: int) -> Mapping[int, pa.Table]:
        return self.shared.epoch_reached(epoch, epoch * self.setup.plan.flush_every)

    def _replay_overrun(self, left: int) -> CheckpointError:
        return CheckpointError(
            f"checkpoint lane {self.shared.ctx.lane}: {self.skip} rows of flush epoch {self.epoch} were delivered, "
            f"it says, but replaying the epoch gives {self.skip - left}; the checkpoint is corrupt or belongs to other "
            "data."
        )


def take_batch(lane: int, pending: deque[list[Any]], size: int, fields: Any) -> LaneItem:
    """The next ``size`` pending rows as a batch, ending after the epoch's first ``rows`` rows
    (a replay cursor skips them; a checkpoint by reference reads the lane itself)."""
    parts = []
    need = size
    while need:
        entry = pending[0]
        frame = entry[0]
        if isinstance(frame, LazyRows):  # restored rows held by reference: compute what is needed
            frame, rest = frame.head(min(need, frame.num_rows))
            if rest is not None:
                pending.insert(1, [rest, *entry[1:]])
            entry[0] = frame
        if frame.num_rows <= need:
            parts.append(frame)
            need -= frame.num_rows
            pending.popleft()
            last = entry[1], entry[2], entry[3] + frame.num_rows, entry[4]
        else:
            parts.append(frame.slice(0, need))
            entry[0] = frame.slice(need)
            entry[3] += need
            last = entry[1], entry[2], entry[3], entry[4]
            need = 0
    table = parts[0] if len(parts) == 1 else F.concat_frames(parts)
    epoch, state, rows, carries = last
    return LaneItem(lane, SampleBatch(table, fields=fields or None), table, epoch, 0, rows, state, carries)


def drain_records(lane: int, pending: deque[list[Any]], fields: Any) -> Iterator[LaneItem]:
    """Every pending row as a record. The entry keeps what is left of its frame, so a checkpoint
    taken between two records sees the rows not yet delivered."""
    while pending:
        entry = pending[0]
        if isinstance(entry[0], LazyRows):
            entry[0], _ = entry[0].head(entry[0].num_rows)
        frame, epoch, state, first, carries = entry
        for i, rec in enumerate(records_of(frame, fields or None)):
            entry[0], entry[3] = frame.slice(i + 1), first + i + 1
            yield LaneItem(lane, rec, frame.slice(i, 1), epoch, 0, first + i + 1, state, carries)
        pending.popleft()
