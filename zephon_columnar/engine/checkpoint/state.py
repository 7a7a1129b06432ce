"""The checkpoint as typed, frozen values: one lane's state by replay (`LaneCursor`) or by
reference (`LaneSnapshot`, built of `ResumePoint`, `StageState`, `EpochMarker` and `HeldRows`),
and a pipeline's (`PipelineState`).

Every field is required (none has a default), and a changed copy is made with
``dataclasses.replace``: a field added later cannot be lost by one copy that forgot it. The
JSON form is `codec`'s.

Example:
    >>> import dataclasses, pyarrow as pa
    >>> lane = LaneSnapshot(items=3, resume=ResumePoint(chunk=4, offset=2, marker=False, source_state={}),
    ...                     stages=(), pending=None, targets={}, exhaustion={})
    >>> dataclasses.replace(lane, items=4).resume.chunk
    4
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from zephon_columnar.ops.accumulators.lane import ChunkExhaustion


@dataclass(frozen=True, kw_only=True)
class LaneCursor:
    """A lane's state *by replay*: where its delivered stream ends, after ``items`` items: in
    flush epoch ``epoch`` (whose work-source state at its start is ``source_state``), past the
    first ``inputs`` sample pointers of the epoch and then ``rows`` output rows.

    A restore replays the epoch and skips the ``rows`` delivered rows (``inputs``, pointers of
    the epoch's first chunk to skip before reading, is 0 in every cursor a run writes: a
    stateless plan checkpointed by replay, over a mixture that may change, replays too).
    ``carries``: rows ordered stages kept across the epoch's flush point (uncapped wrap's
    partial row), ``{stage index: frame}``; restore primes the fresh
    stages with them. ``exhausted``: the components the lane's chunks before the epoch said
    have run out (`WorkChunk.source_exhausted`), already announced to its accumulators.
    """

    epoch: int
    rows: int
    items: int
    inputs: int
    source_state: Mapping[str, Any]
    carries: Mapping[int, pa.Table]
    exhausted: frozenset[str]


@dataclass(frozen=True, kw_only=True)
class ResumePoint:
    """Where a lane's source continues: chunk ``chunk``'s pointers from ``offset`` on, preceded
    by the chunk's flush-epoch marker when ``marker`` (it has not gone out yet); the work source
    is in ``source_state`` before that chunk."""

    chunk: int
    offset: int
    marker: bool
    source_state: Mapping[str, Any]


@dataclass(frozen=True, kw_only=True)
class EpochMarker:
    """In a queue between two stages: the flush epoch ``epoch`` starts here."""

    epoch: int


@dataclass(frozen=True, kw_only=True)
class HeldRows:
    """Rows a lane holds by reference (`frame.refs_of`), computed again on restore; ``schema``:
    their payload schema (the columns a packer made), None when the stage that made them
    decides it."""

    refs: pa.Table
    schema: pa.Schema | None


QueueEntry = EpochMarker | HeldRows


@dataclass(frozen=True, kw_only=True)
class StageState:
    """One ordered stage of a lane: the accumulator's own state (``ReferenceState.snapshot``:
    a JSON-able dict) and the rows it holds (None: none), the input it took and has not pushed
    yet (None: none, or the lane resumes at its first row), and what it emitted that the next
    stage has not taken (markers and rows, in order)."""

    state: Mapping[str, Any]
    rows: pa.Table | None
    inbox: pa.Table | None
    queue: tuple[QueueEntry, ...]


@dataclass(frozen=True, kw_only=True)
class LaneSnapshot:
    """A lane's state *by reference* between two deliveries: ``items`` delivered, where the
    source resumes, each ordered stage's state, the collector's rows not yet in a batch
    (``pending``), and the target mixtures of the chunks rows in the lane still come from, for
    stages that read them (``{chunk: {component: weight}}``, ensure_mixture), with what those
    chunks say of components running out (``{chunk: ChunkExhaustion}``; chunks that say
    nothing are left out)."""

    items: int
    resume: ResumePoint
    stages: tuple[StageState, ...]
    pending: HeldRows | None
    targets: Mapping[int, Mapping[str, float] | None]
    exhaustion: Mapping[int, ChunkExhaustion]


LaneState = LaneCursor | LaneSnapshot


def source_state_of(lane: LaneState) -> Mapping[str, Any]:
    """The work-source state a lane's source restarts from."""
    return lane.source_state if isinstance(lane, LaneCursor) else lane.resume.source_state


def source_state_field(lane: LaneState) -> str:
    """Where `source_state_of` reads, as a checkpoint's field path (for messages)."""
    return "source_state" if isinstance(lane, LaneCursor) else "resume.source_state"


def held_for_collector(lane: LaneState) -> pa.Table | None:
    """References of the rows a lane holds for its collector (what its first item takes
    first; None: none, and a lane by replay holds none)."""
    return lane.pending.refs if isinstance(lane, LaneSnapshot) and lane.pending is not None else None


@dataclass(frozen=True, kw_only=True)
class PipelineState:
    """A whole checkpoint: the data recipe it was taken with (restore refuses another), the
    world that took it (data-parallel layout, for messages and merging) and its lanes."""

    recipe: Mapping[str, Any]
    world: Mapping[str, Any]
    lanes: Mapping[int, LaneState]
