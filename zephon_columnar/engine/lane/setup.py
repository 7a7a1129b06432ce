"""What a lane is built from (`LaneSetup`), what flows through it (`EpochStart`, `LaneItem`) and
the bookkeeping its source, stages and collector share (`LaneShared`)."""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from zephon_columnar.engine.plan import Plan
from zephon_columnar.engine.prefetch import ShardPrefetcher
from zephon_columnar.engine.realized import MixtureCounts
from zephon_columnar.losses import Notices
from zephon_columnar.ops.accumulators.lane import NO_EXHAUSTION, ChunkExhaustion, LaneContext
from zephon_columnar.work.base import WorkSource
from zephon_columnar.work.chunk import WorkChunk


@dataclass(frozen=True, kw_only=True)
class LaneSetup:
    """What every lane of a run is built from; the engine makes one (`Engine.lane_setup`).

    ``plan``: the compiled stages. ``work_source``: the stream's, which each lane clones for
    itself. ``canonical_replicas``: how many lanes the stream is split into. ``rows_per_frame``:
    the largest pointer frame a source makes. ``resume_by_input``: no stage keeps state or makes
    more than one row of one, so a delivered row's offset says where to resume.
    ``fields``: per dataset id, its payload fields when datasets differ (else empty), for row
    views. ``window``: frames each stateless stage may run ahead (the runner's look-ahead).
    ``prefetcher``: downloads remote shards ahead of fetch (None: none).
    """

    plan: Plan
    work_source: WorkSource
    canonical_replicas: int
    rows_per_frame: int
    resume_by_input: bool
    fields: Mapping[int, frozenset[str]]
    window: int
    prefetcher: ShardPrefetcher | None

    @property
    def rows_per_item(self) -> int:
        """Rows in each item a lane delivers: the batch size, or 1 for records."""
        return self.plan.batch.microbatch_size if self.plan.batch is not None else 1


@dataclass(frozen=True)
class EpochStart:
    """Marker: the lane's flush epoch ``epoch`` starts here; the work source was in
    ``source_state`` before its first chunk. Accumulators flush and reset on it."""

    epoch: int
    source_state: Mapping[str, Any]


@dataclass(frozen=True)
class LaneItem:
    """A delivered item (a `SampleBatch` or `SampleRecord`), its rows as a frame, and where it
    ends in its lane: in flush epoch ``epoch`` (the work source in ``source_state`` at its start),
    after ``inputs`` source rows (when the plan resumes by input) or ``rows`` rows of the epoch,
    with ``carries`` the rows ordered stages carried into the epoch (what a replay needs)."""

    lane: int
    value: Any
    table: pa.Table
    epoch: int
    inputs: int
    rows: int
    source_state: Mapping[str, Any]
    carries: Mapping[int, pa.Table]


class LaneShared:
    """Per-lane bookkeeping shared by a lane's source, ordered stages and collector: its
    `LaneContext`, the chunks' target mixtures and what they say of components running out,
    the realized mixture, and the rows each ordered stage carried across each flush point
    (``carries[epoch][stage]``). Its start (`zephon_columnar.engine.lane.start`) primes it."""

    def __init__(self, lane: int, ws: WorkSource, rows_per_item: int, notices: Notices, lanes: int) -> None:
        recipe = ws.recipe()
        self.targets: dict[int, Mapping[str, float] | None] = {}
        self.exhaustion: dict[int, ChunkExhaustion] = {}  # chunks that say nothing are left out
        # What the lane's chunks said had run out before each flush epoch, as change points
        # [(first epoch, components)] (it changes once per component at most).
        self.exhausted_changes: list[tuple[int, frozenset[str]]] = []
        names = {cid: name for name, cid in ws.component_ids().items()}
        self.component_ids = {name: cid for cid, name in names.items()}
        self.mixture = MixtureCounts(names)  # the realized mixture: rows read and delivered per component
        seed = recipe.get("seed", 0) if isinstance(recipe.get("seed", 0), int) else 0
        self.ctx = LaneContext(
            lane=lane,
            seed=seed,
            component_names=names,
            chunk_target=self.targets.get,
            rows_per_item=rows_per_item,
            notices=notices,
            rows_per_pass=ws.rows_per_pass(),
            lanes=lanes,
            continuing=frozenset(ws.continues_after_exhaustion()),
            chunk_exhaustion=lambda chunk_id: self.exhaustion.get(chunk_id, NO_EXHAUSTION),
            exhausted_before=self.exhausted_before,
        )
        # Whether the lane starts its pass at the beginning (no item delivered before): only then
        # do its rows read and delivered compare (`zephon_columnar.engine.realized`).
        self.fresh = True
        self.carries: dict[int, dict[int, pa.Table]] = {}
        # The rows each ordered stage takes into flush epoch ``carried_into[0]`` when the lane
        # starts inside it: ``(epoch, {stage position: frame})`` (None: the lane starts fresh).
        self.carried_into: tuple[int, Mapping[int, pa.Table]] | None = None

    def note_chunk(self, chunk_id: int, chunk: WorkChunk, epoch: int) -> None:
        """Chunk ``chunk_id`` of flush epoch ``epoch`` is read: its target (what the source
        aimed for, else what the chunk holds: ensure_mixture's, and the realized mixture's) and
        what it says ran out."""
        target = self.targets[chunk_id] = chunk.target_mixture or chunk.mixture
        ids = self.component_ids
        self.mixture.planned(epoch, {ids[n]: w for n, w in target.items() if n in ids}, len(chunk))
        if chunk.source_exhausted:
            through = frozenset(chunk.source_exhausted)
            present = {name for name, pointers in chunk.component_arrays.items() if len(pointers)}
            self.exhaustion[chunk_id] = ChunkExhaustion(through=through, before=through - present)

    def epoch_starts(self, epoch: int, exhausted: frozenset[str]) -> None:
        """The source starts flush epoch ``epoch`` having seen ``exhausted`` run out."""
        if exhausted != self.exhausted_before(epoch):
            self.exhausted_changes.append((epoch, exhausted))

    def exhausted_before(self, epoch: int) -> frozenset[str]:
        """The components the lane's chunks before flush epoch ``epoch`` said have run out."""
        at = bisect.bisect_right(self.exhausted_changes, epoch, key=lambda change: change[0])
        return self.exhausted_changes[at - 1][1] if at else frozenset()

    def epoch_reached(self, epoch: int, first_chunk: int) -> Mapping[int, pa.Table]:
        """The collector is in ``epoch`` (whose first chunk is ``first_chunk``): drop older
        carries, and the targets of older chunks (every stage was drained at the flush point,
        so no row of theirs is left in the lane; a target is kept until then however far the
        source reads ahead); the carries of ``epoch``."""
        for e in [e for e in self.carries if e < epoch]:
            del self.carries[e]
        for c in [c for c in self.targets if c < first_chunk]:
            del self.targets[c]
            self.exhaustion.pop(c, None)
        return self.carries.get(epoch, {})
