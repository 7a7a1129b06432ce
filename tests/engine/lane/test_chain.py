"""The lane chain on its own: built from a `LaneSetup`, a runner and a start, with no `Engine`,
`Session` or `Pipeline`. A lane delivers each of its rows once, and its checkpoint (by
reference, or by replay for an accumulator without reference state) restores into a new chain
that continues exactly as the uninterrupted one."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from zephon_columnar import Dataset, MixtureSpec, StaticMixtureWorkSource
from zephon_columnar.engine.checkpoint import LaneCursor, LaneSnapshot, checkpoint_mode
from zephon_columnar.engine.lane import LaneChain, LaneItem, LaneSetup, lane_start
from zephon_columnar.engine.plan import compile_plan
from zephon_columnar.engine.runners import Runner, start_runner
from zephon_columnar.errors import CheckpointError
from zephon_columnar.io.readers import ReaderPool
from zephon_columnar.losses import Notices
from zephon_columnar.ops.base import BaseOp, OrderedOp
from zephon_columnar.ops.batch import BatchOp
from zephon_columnar.ops.fetch import FetchOp
from zephon_columnar.ops.pack import PackFlatOp
from zephon_columnar.ops.shuffle import ShuffleOp
from zephon_columnar.ops.traits import OpTraits

RNG = np.random.default_rng(7)
DOCS = [list(range(i * 100, i * 100 + int(n))) for i, n in enumerate(RNG.integers(1, 9, size=120))]
A = Dataset.from_tables(
    "a", [pa.table({"id": list(range(s * 40, s * 40 + 40)), "input_ids": DOCS[s * 40 : s * 40 + 40]}) for s in range(3)]
)


class _ReverseEachEpoch(OrderedOp):
    """Holds a lane's rows and emits them reversed at each flush point: state that only a replay
    rebuilds (no `ReferenceState`)."""

    name = "reverse_epoch"

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=False)

    def lane_accumulator(self, ctx: Any = None) -> Any:
        return _ReverseAccumulator()


class _ReverseAccumulator:
    def __init__(self) -> None:
        self.frames: list[pa.Table] = []

    def push(self, frame: pa.Table) -> list[pa.Table]:
        self.frames.append(frame)
        return []

    def carry(self) -> None:
        return None

    def flush(self, *, reset: bool, end: bool = False) -> list[pa.Table]:
        frames, self.frames = self.frames, []
        if not frames:
            return []
        table = pa.concat_tables(frames)
        return [table.take(pa.array(np.arange(table.num_rows)[::-1]))]


PLANS: dict[str, list[BaseOp]] = {
    "stateless": [FetchOp(max_batch=5)],
    "shuffle": [FetchOp(max_batch=5), ShuffleOp(7, seed=3)],
    "pack": [FetchOp(max_batch=5), PackFlatOp(12, pad_token_id=0)],
    "shuffle-pack": [FetchOp(max_batch=5), ShuffleOp(9, seed=1), PackFlatOp(10, algorithm="first_fit", num_bins=2)],
    "replay": [FetchOp(max_batch=5), _ReverseEachEpoch()],
}


def _work_source() -> StaticMixtureWorkSource:
    return StaticMixtureWorkSource([A], MixtureSpec({"a": 1.0}), chunk_size=8, seed=11, shuffle_within_shard=True)


def _setup(ops: Sequence[BaseOp], *, lanes: int = 1) -> LaneSetup:
    plan = compile_plan([*ops, BatchOp(3, drop_last=False)], flush_every_k_chunks=2)
    return LaneSetup(
        plan=plan,
        work_source=_work_source(),
        canonical_replicas=lanes,
        rows_per_frame=5,
        resume_by_input=not plan.stateful,
        fields={},
        window=2,
        prefetcher=None,
    )


def _runner(setup: LaneSetup) -> Runner:
    services = {
        "datasets_by_id": setup.work_source.datasets_by_id,
        "reader_pool": ReaderPool(),
        "shard_cache": None,
        "decoded_cache_bytes": None,
        "collect_stats": False,
    }
    return start_runner("threads", [s.ops for s in setup.plan.parallel_stages()], services, 2)


def _initial(setup: LaneSetup, lane: int) -> LaneCursor:
    ws = setup.work_source.clone_for_lane(lane, setup.canonical_replicas)
    return LaneCursor(epoch=0, rows=0, items=0, inputs=0, source_state=ws.state_dict(), carries={}, exhausted=frozenset())


def _chain(setup: LaneSetup, runner: Runner, saved: LaneCursor | LaneSnapshot, *, lane: int = 0, **kw: Any) -> LaneChain:
    return LaneChain(setup, lane, lane_start(saved), runner, Notices(), checkpoint_mode(setup.plan), **kw)


def _rows(item: LaneItem) -> list[Any]:
    table = item.value.table
    return table.column("id" if "id" in table.column_names else "input_ids").to_pylist()


def _take(items: Iterator[LaneItem], chain: LaneChain, n: int) -> list[list[Any]]:
    out = []
    for delivered in range(1, n + 1):  # every chain here starts at the stream's start
        item = next(items)
        chain.delivered(item, delivered)
        out.append(_rows(item))
    return out


@pytest.mark.parametrize("plan", sorted(PLANS))
def test_a_chain_delivers_each_row_of_its_lane_once(plan: str) -> None:
    setup = _setup(PLANS[plan])
    runner = _runner(setup)
    try:
        items = list(_chain(setup, runner, _initial(setup, 0)))
    finally:
        runner.close()
    if plan in ("pack", "shuffle-pack"):
        tokens = [t for item in items for row in item.value.table.column("input_ids").to_pylist() for t in row if t]
        every = {t for doc in DOCS for t in doc if t}  # the pad id 0 aside
        assert len(tokens) == len(set(tokens)) and set(tokens) <= every
        # wrap drops the lane's final partial row (counted and said); first_fit drops nothing here
        assert 0 <= len(every) - len(tokens) < (12 if plan == "pack" else 1)
    else:
        ids = [i for item in items for i in item.value.table.column("id").to_pylist()]
        assert sorted(ids) == list(range(120))


@pytest.mark.parametrize("plan", sorted(PLANS))
@pytest.mark.parametrize("lanes", [1, 3])
def test_a_chain_restored_from_its_state_continues_exactly(plan: str, lanes: int) -> None:
    setup = _setup(PLANS[plan], lanes=lanes)
    by = checkpoint_mode(setup.plan).by
    assert by == ("replay" if plan == "replay" else "reference")
    runner = _runner(setup)
    try:
        for lane in range(lanes):
            full = [_rows(item) for item in _chain(setup, runner, _initial(setup, lane), lane=lane)]
            assert full
            for k in sorted({0, 1, len(full) // 2, len(full) - 1, len(full)}):
                chain = _chain(setup, runner, _initial(setup, lane), lane=lane)
                items = iter(chain)
                head = _take(items, chain, k)
                state = chain.state(k)
                assert isinstance(state, LaneSnapshot if by == "reference" else LaneCursor)
                assert state.items == k
                rest = [_rows(item) for item in _chain(setup, runner, state, lane=lane)]
                assert head + rest == full, (plan, lane, k)
    finally:
        runner.close()


def test_undelivered_items_go_back_into_a_snapshot() -> None:
    """Items made ahead and not handed over (a prefetch queue) come again after a restore."""
    setup = _setup(PLANS["shuffle"])
    runner = _runner(setup)
    try:
        full = [_rows(item) for item in _chain(setup, runner, _initial(setup, 0))]
        chain = _chain(setup, runner, _initial(setup, 0))
        items = iter(chain)
        head = _take(items, chain, 2)
        ahead = [next(items), next(items)]  # made, never delivered
        state = chain.state(2, [item.table for item in ahead])
        rest = [_rows(item) for item in _chain(setup, runner, state)]
        assert head + rest == full
    finally:
        runner.close()


def test_replay_keeps_the_cursors_of_items_still_in_transit() -> None:
    setup = _setup(PLANS["replay"])
    runner = _runner(setup)
    try:
        full = [_rows(item) for item in _chain(setup, runner, _initial(setup, 0))]
        chain = _chain(setup, runner, _initial(setup, 0), in_transit=2)
        items = iter(chain)
        head = _take(items, chain, 6)
        for held in (0, 1, 2):  # the last `held` items never reached their consumer
            state = chain.state(6 - held)
            rest = [_rows(item) for item in _chain(setup, runner, state)]
            assert head[: 6 - held] + rest == full
        with pytest.raises(CheckpointError, match="no cursor after item 3"):
            chain.state(3)
    finally:
        runner.close()


def test_a_plan_checkpointed_by_replay_refuses_a_snapshot() -> None:
    reference, replay = _setup(PLANS["shuffle"]), _setup(PLANS["replay"])
    runner = _runner(reference)
    try:
        chain = _chain(reference, runner, _initial(reference, 0))
        items = iter(chain)
        _take(items, chain, 2)
        snapshot = chain.state(2)
    finally:
        runner.close()
    runner = _runner(replay)
    try:
        with pytest.raises(CheckpointError, match="checkpointed by replay"):
            _chain(replay, runner, snapshot)
    finally:
        runner.close()


def test_two_packers_are_checkpointed_by_replay() -> None:
    """A row a packer made is named by its pieces: a second packer's rows cannot be."""
    two = compile_plan(
        [FetchOp(), PackFlatOp(8, pad_token_id=0), PackFlatOp(16, pad_token_id=0), BatchOp(2)], flush_every_k_chunks=None
    )
    mode = checkpoint_mode(two)
    assert (mode.by, mode.reason) == ("replay", "a packer packs rows another packer made")
    one = compile_plan([FetchOp(), PackFlatOp(8, pad_token_id=0), BatchOp(2)], flush_every_k_chunks=None)
    assert checkpoint_mode(one).by == "reference"
