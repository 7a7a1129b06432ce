"""A lane's source: the pointer frames of its chunks, with an `EpochStart` before every K-th
chunk, from any position ``(chunk, offset, marker)`` a checkpoint names.

Frames never change the data: the first frames of a pass (or after a restore) are small and
grow 4x up to ``rows_per_frame``, so the first batch waits only for the rows it needs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.engine.lane.setup import EpochStart, LaneSetup, LaneShared
from zephon_columnar.errors import CheckpointError, PipelineError
from zephon_columnar.work.base import WorkSource
from zephon_columnar.work.chunk import WorkChunk

#: Rows of a lane's first frame when it cannot be one batch; frames grow 4x up to the fetch
#: batch size.
FIRST_FRAME_ROWS = 64
#: Work-source states of the most recent chunks a lane keeps whatever else it holds: an uncapped
#: wrap packer rewinds to one of them (a small checkpoint) when its oldest document is that recent.
KEEP_STATES = 256


@dataclass(frozen=True)
class _Piece:
    """Rows ``[start, end)`` of chunk ``chunk`` (of ``rows`` pointers) waiting for a frame."""

    chunk: int
    start: int
    end: int
    rows: int
    pointers: np.ndarray
    components: np.ndarray


class Source:
    """A lane's source events from a position ``(chunk, offset, marker)``: chunk ``chunk``'s
    pointers from ``offset`` on, preceded by its `EpochStart` when it starts an epoch and
    ``marker`` is true (the marker has not gone out yet)."""

    def __init__(
        self, setup: LaneSetup, shared: LaneShared, ws: WorkSource, chunk: int, offset: int, marker: bool
    ) -> None:
        self.setup = setup
        self.shared = shared
        self.ws = ws
        self.k = setup.plan.flush_every
        # The work-source state before every chunk a checkpoint may resume from: chunks from the
        # chain's `resume_floor` on (set by the chain), and the last `KEEP_STATES`.
        self.states: dict[int, Mapping[str, Any]] = {}
        self.resume_floor: Callable[[], int] = lambda: 0
        self._prune_above = 2 * KEEP_STATES
        self._next_pull = chunk  # the chunk ``ws.next_chunk()`` returns next
        self.start = (chunk, offset, marker)
        self.next_position = (chunk, offset, marker)

    def knows_state_before(self, chunk: int) -> bool:
        return chunk in self.states or chunk == self._next_pull

    def _keep_state(self, chunk: int, state: Mapping[str, Any]) -> None:
        """Keep the state before ``chunk``; drop those no checkpoint can resume from any more
        (amortized: only when the kept states have doubled since the last time)."""
        states = self.states
        states[chunk] = state
        if len(states) > self._prune_above:
            keep_from = min(self.resume_floor(), chunk - KEEP_STATES)
            for c in [c for c in states if c < keep_from]:
                del states[c]
            self._prune_above = max(2 * KEEP_STATES, 2 * len(states))

    def state_before(self, chunk: int) -> Mapping[str, Any]:
        """The work-source state before chunk ``chunk`` (one in flight, or the next to pull)."""
        if chunk in self.states:
            return self.states[chunk]
        if chunk == self._next_pull:
            return self.ws.state_dict()
        raise PipelineError(
            f"lane {self.shared.ctx.lane}: no work-source state for chunk {chunk}; this is a bug, "
            "please report it with the pipeline's explain()"
        )

    def position_of(self, event: pa.Table | EpochStart) -> tuple[int, int, bool]:
        """Where ``event`` (emitted by this source) starts."""
        if isinstance(event, EpochStart):
            return (event.epoch * self.k, 0, True)
        return (int(event.column(F.CHUNK)[0].as_py()), int(event.column(F.OFFSET)[0].as_py()), False)

    def __iter__(self) -> Iterator[pa.Table | EpochStart]:
        setup, shared, k = self.setup, self.shared, self.k
        lane = shared.ctx.lane
        comp_ids = self.ws.component_ids()
        # The first frames of a pass (or after a restore) are small and grow 4x to rows_per_frame,
        # so the first batch waits for the rows it needs, not a whole frame. A frame may take
        # rows of several chunks of one flush epoch (small chunks would otherwise cap it), never
        # rows of two epochs: the marker goes between them. Frame sizes never change the data.
        first = FIRST_FRAME_ROWS
        if setup.plan.batch is not None and not setup.plan.stateful:
            first = setup.plan.batch.microbatch_size
        step = min(setup.rows_per_frame, first)
        chunk0, skip, marker = self.start
        # what the lane's chunks so far said had run out (a snapshot restore, which no stage that
        # reads it allows, starts from nothing)
        exhausted = shared.exhausted_before(chunk0 // k)
        last_epoch: int | None = None
        held: list[_Piece] = []  # rows pulled but not yet in a frame
        held_rows = 0
        for chunk_id, chunk in self._chunks_ahead(chunk0):
            pointers, comp_index = chunk.ordered()
            n = len(pointers)
            start = min(skip, n) if chunk_id == chunk0 else 0  # restore: pointers already consumed
            if chunk_id == chunk0 and skip > n:
                raise CheckpointError(
                    f"checkpoint lane {lane}: resumes chunk {chunk0} after {skip} rows, but the "
                    f"chunk has {n}; the checkpoint is corrupt or belongs to other data."
                )
            if chunk_id % k == 0 and (chunk_id != chunk0 or marker):
                if held:
                    yield self._frame(lane, held)
                    held, held_rows = [], 0
                self.next_position = (chunk_id, start, False)  # once handed over, the marker is out
                shared.epoch_starts(chunk_id // k, exhausted)
                yield EpochStart(chunk_id // k, self.states[chunk_id])
            shared.note_chunk(chunk_id, chunk, chunk_id // k)
            exhausted |= frozenset(chunk.source_exhausted)
            comp_map = np.array([comp_ids[name] for name in chunk.component_names], dtype=np.int32)
            components = comp_map[comp_index] if len(comp_index) else np.zeros(0, np.int32)
            while start < n:
                end = min(n, start + step - held_rows)
                held.append(_Piece(chunk_id, start, end, n, pointers, components))
                held_rows += end - start
                start = end
                if held_rows == step:
                    yield self._frame(lane, held)
                    held, held_rows = [], 0
                    step = min(setup.rows_per_frame, step * 4)
            if n == 0 and not held:
                self.next_position = (chunk_id + 1, 0, (chunk_id + 1) % k == 0)
            last_epoch = chunk_id // k
        if last_epoch is not None:  # for the flush at the end of the lane
            shared.epoch_starts(last_epoch + 1, exhausted)
        if held:
            yield self._frame(lane, held)

    def _frame(self, lane: int, pieces: list[_Piece]) -> pa.Table:
        """The pointer frame of ``pieces`` (consecutive rows of consecutive chunks); sets
        ``next_position`` to the row after it."""
        last = pieces[-1]
        self.next_position = (
            (last.chunk, last.end, False)
            if last.end < last.rows
            else (last.chunk + 1, 0, (last.chunk + 1) % self.k == 0)
        )
        sizes = [p.end - p.start for p in pieces]
        components = np.concatenate([p.components[p.start : p.end] for p in pieces])
        self.shared.mixture.read(components)
        return F.pointer_frame(
            lane=lane,
            chunk_id=np.repeat([p.chunk for p in pieces], sizes),
            offsets=np.concatenate([np.arange(p.start, p.end) for p in pieces]),
            pointers=np.concatenate([p.pointers[p.start : p.end] for p in pieces]),
            components=components,
        )

    def _chunks_ahead(self, chunk_id: int) -> Iterator[tuple[int, WorkChunk]]:
        """(chunk_id, chunk), pulled up to the prefetcher's ``buffer_size`` samples ahead so
        remote shards download early; the work-source state before each chunk is kept."""
        prefetcher = self.setup.prefetcher
        ahead = prefetcher.buffer_size if prefetcher is not None else 0
        buffered: deque[tuple[int, WorkChunk]] = deque()
        samples = 0
        exhausted = False
        ws = self.ws
        while True:
            while not exhausted and (not buffered or samples < ahead):
                self._keep_state(chunk_id, ws.state_dict())
                chunk = ws.next_chunk()
                if chunk is None:
                    exhausted = True
                    break
                self._next_pull = chunk_id + 1
                if prefetcher is not None:
                    prefetcher.warm(
                        np.concatenate([np.asarray(v).reshape(-1, 3) for v in chunk.component_arrays.values()])
                    )
                buffered.append((chunk_id, chunk))
                samples += len(chunk)
                chunk_id += 1
            if not buffered:
                return
            item = buffered.popleft()
            samples -= len(item[1])
            yield item
