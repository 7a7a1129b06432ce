"""The engine's accumulators: `LaneAccumulator`, all state that spans rows in a built-in stage.

One instance per lane and ordered stage, fed that lane's frames in order on one thread, with a
`LaneContext` saying which lane it serves. Every built-in ordered stage (shuffle, packing,
ensure_mixture, stateful_transform, a user operator's `Accumulator`) is one.

The contract every `LaneAccumulator` keeps (what makes runners, frame sizes and restarts
invisible in the data; `zephon_columnar.testing.assert_frame_split_invariant` checks it):

1. *Frame-split invariance*: the sequence of output rows depends only on the sequence of input
   rows, never on how they were cut into frames (nor on how its output is cut).
   Randomness is a pure function of the lane's seed, the lane and the rows' identity
   (`zephon_columnar.frame.row_keys`), never of counters of frames.
2. *Reset is fresh*: after ``flush(reset=True)`` the accumulator behaves exactly like a new one,
   except for ``carry()``: rows it deliberately keeps across the flush point because dropping
   or padding them would lose data (uncapped wrap packing's partial row). A fresh accumulator
   primed with those rows (``push`` of ``carry()``, which emits nothing) is the same state.
3. ``flush(reset=True, end=True)`` is the end of the lane: emit or drop everything; nothing is
   carried.

Example:
    >>> LaneContext(lane=1, seed=7).rows_per_item
    1
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeGuard, runtime_checkable

import pyarrow as pa

from zephon_columnar.losses import Notices


@dataclass(frozen=True, kw_only=True)
class ChunkExhaustion:
    """What one of a lane's chunks says of components running out (its
    ``WorkChunk.source_exhausted``), by component name.

    ``through``: every component it names, whose last row is in this chunk or an earlier one.
    ``before``: those of them without rows in this chunk: their last row came in an earlier
    chunk, so every row of theirs in the lane has gone ahead of this chunk's.

    Example:
        >>> ChunkExhaustion(through=frozenset({"a"}), before=frozenset()).through
        frozenset({'a'})
    """

    through: frozenset[str]
    before: frozenset[str]


NO_EXHAUSTION = ChunkExhaustion(through=frozenset(), before=frozenset())


@dataclass(frozen=True, kw_only=True)
class LaneContext:
    """What an ordered stage is told about the lane it serves.

    ``seed``: the data recipe's seed (the work source's), which stage randomness mixes with its
    own seed argument. ``component_names``: mixture component id -> name.
    ``chunk_target(chunk_id)``: the target mixture ``{name: weight}`` of one of this lane's
    chunks (None when the source does not say), for stages that enforce the mixture.
    ``stats``: counters the stage may add to (reported by ``Pipeline.metrics_snapshot``).
    ``rows_per_item``: rows in each item the lane delivers (the batch size; 1 for records), for
    stages that size their work by it. ``flush_epoch()``: the flush epoch the stage is in (the
    number of flush points it has passed, counted from the lane's start). ``notices``: where a
    stage warns about data it drops (`Notices`: once per pass of the pipeline, shared by its
    lanes; the counts go in ``stats``). ``rows_per_pass``: the rows of one pass over every
    dataset of the work source (None: unknown), and ``lanes`` the lanes the stream is split
    into (each reads its share of every pass), for stages that tell a scarce input from a
    missing one. ``chunk_exhaustion(chunk_id)``: what the chunk says of components running out
    (`ChunkExhaustion`), and ``continuing`` the components the work source goes on without once
    they have (``WorkSource.continues_after_exhaustion``), for stages that react to it;
    ``exhausted_before(epoch)``: the components the lane's chunks before flush epoch ``epoch``
    said have run out (replay-mode stages: the engine keeps it for the epochs it may replay).
    """

    lane: int = 0
    seed: int = 0
    component_names: Mapping[int, str] = field(default_factory=dict)
    chunk_target: Callable[[int], Mapping[str, float] | None] = lambda chunk_id: None
    stats: dict[str, int] = field(default_factory=dict)
    rows_per_item: int = 1
    flush_epoch: Callable[[], int] = lambda: 0
    notices: Notices = field(default_factory=Notices)
    rows_per_pass: int | None = None
    lanes: int = 1
    chunk_exhaustion: Callable[[int], ChunkExhaustion] = lambda chunk_id: NO_EXHAUSTION
    continuing: frozenset[str] = frozenset()
    exhausted_before: Callable[[int], frozenset[str]] = lambda epoch: frozenset()


#: Computes rows again from their references (`frame.refs_of`), in the references' order:
#: ``source(refs, schema=None)``, what the engine gives an ordered stage on restore, built from
#: the stateless operators before it. ``schema``: the payload schema of the rows, which rows a
#: packer made need (the columns it packed).
RowSource = Callable[..., pa.Table]


class LaneAccumulator(Protocol):
    """Per-lane ordered state of an operator (see the module docstring for the contract)."""

    def push(self, frame: pa.Table) -> list[pa.Table]:
        """Rows in (one frame of this lane, in stream order); the frames now ready out."""
        ...

    def flush(self, *, reset: bool, end: bool = False) -> list[pa.Table]:
        """Everything ready or buffered, at a flush point (``reset=True``: then be fresh but
        for ``carry()``) or at the end of the lane (``end=True``)."""
        ...

    def carry(self) -> pa.Table | None:
        """Rows held across the last flush point (None: nothing), as a frame of this stage's
        input rows; pushing them into a fresh accumulator rebuilds this state."""
        ...


@runtime_checkable
class ReferenceState(Protocol):
    """What a `LaneAccumulator` implements to be checkpointed *by reference* (every built-in
    reordering stage does): its state is a small JSON-able dict plus the rows it holds as
    references, and restore recomputes rows only when they are emitted. Accumulators without
    these methods are restored by replaying the flush epoch.

    snapshot()                        -> (state, references of the rows held, or None)
    restore(state, rows, source)      on a fresh accumulator: the state `snapshot` returned;
                                      ``source(refs)`` computes held rows when needed
    rebuild(refs, schema, source)     rows this stage emitted, from their references (rows in
                                      transit downstream at the checkpoint); ``schema`` is
                                      their payload schema
    """

    def snapshot(self) -> tuple[dict[str, Any], pa.Table | None]: ...

    def restore(self, state: dict[str, Any], rows: pa.Table | None, source: RowSource) -> None: ...

    def rebuild(self, refs: pa.Table, schema: pa.Schema | None, source: RowSource) -> pa.Table: ...


@runtime_checkable
class Rewinds(Protocol):
    """What a `LaneAccumulator` implements when its whole state can be a position in its input
    (a wrap packer fed one row per sample): a checkpoint of the lane is then a few numbers.

    can_rewind()       whether this configuration can (the engine asks before relying on it)
    rewind(first_out)  ``(chunk, offset)`` to read the input again from (None: nothing held)
                       and the state a fresh accumulator restores to skip what was delivered;
                       ``first_out``: its oldest rows not delivered yet
    skip_pending()     restored by rewinding, and nothing pushed since
    """

    def can_rewind(self) -> bool: ...

    def rewind(self, first_out: pa.Table | None) -> tuple[tuple[int, int] | None, dict[str, Any]]: ...

    def skip_pending(self) -> bool: ...


@runtime_checkable
class ReadsChunkTargets(Protocol):
    """What a `LaneAccumulator` declares when it reads its chunks' target mixtures
    (`LaneContext.chunk_target`): a checkpoint then keeps the targets of the chunks that rows
    still in the lane come from."""

    uses_chunk_targets: bool


def restorable_by_reference(acc: object) -> TypeGuard[ReferenceState]:
    """Whether ``acc`` implements `ReferenceState`."""
    return isinstance(acc, ReferenceState)


__all__ = [
    "NO_EXHAUSTION",
    "ChunkExhaustion",
    "LaneAccumulator",
    "LaneContext",
    "ReadsChunkTargets",
    "ReferenceState",
    "Rewinds",
    "RowSource",
    "restorable_by_reference",
]
