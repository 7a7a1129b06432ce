"""Exact resume: checkpoint after k items, JSON round trip, restore, continue == uninterrupted."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_columnar import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource
from zephon_columnar.errors import CheckpointError
from zephon_columnar.ops import ColumnarOp, OpTraits
from zephon_columnar.ops.base import OrderedOp
from zephon_columnar.testing import assert_resumes_exactly, collect, take_and_checkpoint

A = Dataset.from_tables("a", [pa.table({"id": list(range(s * 30, s * 30 + 30))}) for s in range(3)])
B = Dataset.from_tables("b", [pa.table({"id": list(range(1000 + s * 20, 1020 + s * 20))}) for s in range(2)])


def build(*, seed=5, chunk_size=8, weights=None, batch=3, drop_last=False, runner="inline", lanes=1, **ws_kw):
    weights = weights or {"a": 0.6, "b": 0.4}
    datasets = [d for d in (A, B) if d.name in weights]
    ws = StaticMixtureWorkSource(datasets, MixtureSpec(weights), chunk_size=chunk_size, seed=seed,
                                 shuffle_within_shard=True, **ws_kw)
    pipe = Pipeline(ws).fetch(max_batch=3)
    if batch:
        pipe = pipe.batch(batch, drop_last=drop_last)
    return pipe.options(runner=runner, canonical_replicas=lanes)


def test_resume_at_boundaries_and_mid_chunk():
    full = collect(build())
    # 0, 1, mid-chunk, chunk boundary (8 rows / 3 per batch does not align: several), last, past the end
    assert_resumes_exactly(build, ks=[0, 1, 2, 3, 5, 8, len(full) - 1, len(full)])


@pytest.mark.parametrize("runner", ["threads", "process"])
def test_resume_with_parallel_runners(runner):
    assert_resumes_exactly(lambda: build(runner=runner), ks=[4, 11])


def test_resume_records_without_batch():
    assert_resumes_exactly(lambda: build(batch=None), ks=[0, 1, 7, 8, 9, 40])


def test_resume_many_lanes():
    full = assert_resumes_exactly(lambda: build(lanes=4), ks=[0, 1, 2, 3, 4, 5, 13, 30])
    assert len({sig[1] for sig in full}) == 4  # every lane delivered


@settings(max_examples=25, deadline=None)
@given(k=st.integers(0, 60), lanes=st.integers(1, 4), batch=st.integers(1, 5), chunk=st.integers(1, 12))
def test_resume_equals_uninterrupted_property(k, lanes, batch, chunk):
    def make():
        return build(lanes=lanes, batch=batch, chunk_size=chunk)

    full = collect(make())
    k = min(k, len(full))
    head, ckpt = take_and_checkpoint(make(), k)
    resumed = make()
    resumed.restore(ckpt)
    assert head + collect(resumed) == full


def test_restore_twice_in_a_row_and_checkpoint_before_iterating():
    pipe = build()
    ckpt = json.loads(json.dumps(pipe.checkpoint()))  # before any iteration: the start
    full = collect(build())
    pipe.restore(ckpt)
    assert collect(pipe) == full
    head, ck = take_and_checkpoint(build(), 4)
    p2 = build()
    p2.restore(ck)
    assert p2.checkpoint()["lanes"] == ck["lanes"]  # pending restore is what checkpoint() reports
    assert head + collect(p2) == full


def test_checkpoint_size_does_not_grow():
    big = Dataset.from_tables("a", [pa.table({"id": list(range(5000))})])
    ws = StaticMixtureWorkSource([big], {"a": 1.0}, chunk_size=16, seed=1)
    pipe = Pipeline(ws).batch(4).options(runner="inline")
    it = iter(pipe)
    sizes = []
    for i, _ in enumerate(it):
        if i in (1, 100, 1000):
            sizes.append(len(json.dumps(pipe.checkpoint())))
    assert max(sizes) - min(sizes) < 40, sizes  # a few digits longer, nothing proportional


@pytest.mark.parametrize("change, needle", [
    (dict(seed=6), "seed"),
    (dict(chunk_size=9), "chunk_size"),
    (dict(weights={"a": 0.5, "b": 0.5}), "mixture"),
    (dict(lanes=2), "canonical_replicas"),
])
def test_restore_with_another_recipe_raises_naming_it(change, needle):
    _, ckpt = take_and_checkpoint(build(), 3)
    other = build(**change)
    with pytest.raises(CheckpointError, match=needle):
        other.restore(ckpt)


def test_restore_with_other_operators_raises():
    _, ckpt = take_and_checkpoint(build(), 3)
    other = build(batch=None).map_transform(lambda p: p).batch(3, drop_last=False)
    with pytest.raises(CheckpointError, match="ops"):
        other.restore(ckpt)


def test_batch_size_may_change_on_resume():
    head, ckpt = take_and_checkpoint(build(batch=4), 3)  # 12 rows delivered
    resumed = build(batch=2)
    resumed.restore(ckpt)
    rows_after = [i for b in resumed for i in b.to_pydict()["id"]]
    full_rows = [i for b in build(batch=1) for i in b.to_pydict()["id"]]
    assert rows_after == full_rows[12:]


@pytest.mark.parametrize("bad, needle", [
    ("not json", "not valid JSON"),
    ({"lanes": {}}, "not a zephon_columnar checkpoint"),
    ({"format": "zephon_columnar.checkpoint", "version": 99, "recipe": {}, "world": {}, "lanes": {}}, "version"),
    (42, "must be a dict"),
])
def test_malformed_checkpoints_raise(bad, needle):
    with pytest.raises(CheckpointError, match=needle):
        build().restore(bad)


def test_checkpoint_with_broken_lane_fields_raises():
    _, ckpt = take_and_checkpoint(build(), 3)
    assert ckpt["lanes"]["0"]["mode"] == "reference"
    ckpt["lanes"]["0"]["resume"]["offset"] = -1
    with pytest.raises(CheckpointError, match="resume.offset"):
        build().restore(ckpt)
    _, ckpt = take_and_checkpoint(build(), 3)
    del ckpt["lanes"]["0"]["resume"]["source_state"]
    with pytest.raises(CheckpointError, match="source_state"):
        build().restore(ckpt)
    _, ckpt = take_and_checkpoint(replay_build(), 3)
    assert ckpt["lanes"]["0"]["mode"] == "replay"
    ckpt["lanes"]["0"]["rows"] = -1
    with pytest.raises(CheckpointError, match="rows"):
        replay_build().restore(ckpt)


class _AddOne(ColumnarOp):
    """A user operator (the columnar hook): may fan out as far as the engine knows, so resume
    replays rows."""

    def traits(self):
        return OpTraits(preserves_cursor_order=True)

    def process_columns(self, batch):
        i = batch.schema.names.index("id")
        return batch.set_column(i, "id", pc.add(batch.column("id"), 1))


class _ReverseEachEpoch(OrderedOp):
    """An ordered, stateful operator: holds each lane's rows and emits them reversed at every
    flush point (exercises epoch replay; built-in stateful operators come with packing)."""

    name = "reverse_epoch"

    def traits(self):
        return OpTraits(preserves_cursor_order=False)

    def lane_accumulator(self, ctx=None):
        return _ReverseAcc()


class _ReverseAcc:
    def __init__(self):
        self.frames = []

    def push(self, frame):
        self.frames.append(frame)
        return []

    def carry(self):
        return None

    def flush(self, *, reset, end=False):
        frames, self.frames = self.frames, []
        if not frames:
            return []
        table = pa.concat_tables(frames)
        return [table.take(pa.array(range(table.num_rows - 1, -1, -1)))]


@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_resume_with_a_fanning_out_user_op(runner):
    assert_resumes_exactly(lambda: build(runner=runner, batch=None).add_op(_AddOne()).batch(3, drop_last=False),
                           ks=[0, 1, 5, 9, 20])


def replay_build(runner="inline", lanes=1, flush_every=2):
    """A plan with an ordered stage whose state only a replay rebuilds."""
    pipe = build(runner=runner, batch=None, lanes=lanes)
    pipe._add(_ReverseEachEpoch())  # noqa: SLF001 - an accumulator without ReferenceState
    return pipe.batch(3, drop_last=False).options(flush_every_k_chunks=flush_every)


@pytest.mark.parametrize("flush_every", [1, 2, 3])
@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_resume_with_a_stateful_operator(flush_every, runner):
    def make():
        return replay_build(runner=runner, lanes=2, flush_every=flush_every)

    full = collect(make())
    assert_resumes_exactly(make, ks=[0, 1, 2, 5, 8, len(full) - 1])
    reversed_somewhere = any(json.loads(sig[3])["id"] != sorted(json.loads(sig[3])["id"]) for sig in full)
    assert reversed_somewhere  # the operator really reorders


class _FrameSizes(ColumnarOp):
    """Records the rows of every frame it sees (a class attribute: copies per worker share it)."""

    seen: list[int] = []

    def traits(self):
        return OpTraits(preserves_cursor_order=True)

    def process_columns(self, batch):
        _FrameSizes.seen.append(batch.num_rows)
        return batch


def _stateless(runner, *, user_op=False, lanes=1, frame_rows=None):
    ws = StaticMixtureWorkSource([A, B], MixtureSpec({"a": 0.6, "b": 0.4}), chunk_size=8, seed=5,
                                 shuffle_within_shard=True)
    pipe = Pipeline(ws).fetch(max_batch=frame_rows)
    if user_op:
        pipe = pipe.add_op(_FrameSizes())
    return pipe.batch(3, drop_last=False).options(runner=runner, canonical_replicas=lanes)


@pytest.mark.parametrize("runner", ["inline", "threads"])
@pytest.mark.parametrize("user_op", [False, True])
def test_frames_of_several_chunks_give_the_same_stream_and_resume_exactly(runner, user_op):
    # Without ordered stages a frame takes the rows of several chunks (chunks of 8 rows here):
    # one row per input resumes by position, a user op (which may fan out) by replay.
    _FrameSizes.seen = []
    full = collect(_stateless(runner, user_op=True))
    assert max(_FrameSizes.seen) > 8  # frames did cross chunk boundaries
    assert collect(_stateless(runner, user_op=user_op, frame_rows=8)) == full  # one chunk a frame
    assert_resumes_exactly(lambda: _stateless(runner, user_op=user_op, lanes=2), ks=[0, 1, 5, 17, 40])
    # The frame size is a performance knob: a checkpoint restores under another one.
    head, ckpt = take_and_checkpoint(_stateless(runner, user_op=user_op), 17)
    other = _stateless(runner, user_op=user_op, frame_rows=3)
    other.restore(json.loads(json.dumps(ckpt)))
    assert head + collect(other) == full
