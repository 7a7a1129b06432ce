"""Test helpers for pipelines and operators, offered to users too.

`assert_resumes_exactly` is the invariant every operator keeps: checkpoint after k items,
JSON round trip, restore into a freshly built pipeline, continue: the concatenation equals
the uninterrupted stream. `assert_frame_split_invariant` is the contract of every ordered
stage (`zephon_columnar.ops.accumulators`): the rows it emits do not depend on how its input
was cut into frames.

Example:
    >>> def make_pipeline():  # a fresh pipeline each time: the same recipe
    ...     return Pipeline(StaticMixtureWorkSource([ds], {"web": 1.0}, chunk_size=8, seed=0)).shuffle(16).batch(4)
    >>> len(assert_resumes_exactly(make_pipeline, ks=[0, 1, 7]))  # batches of the uninterrupted pass
    8
    >>> from zephon_columnar.frame import frame_of
    >>> from zephon_columnar.ops.shuffle import ShuffleOp
    >>> rows = frame_of({"x": list(range(50))})
    >>> assert_frame_split_invariant(lambda: ShuffleOp(8).lane_accumulator(), rows, cuts=[[10, 11], [1, 2, 3]])
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from zephon_columnar import frame as F
from zephon_columnar.types import SampleBatch, SampleRecord


def signature(item: Any) -> tuple[Any, ...]:
    """A hashable, comparable description of a delivered item: lane, sample ids, payload."""
    if isinstance(item, SampleBatch):
        payload = F.payload_of(item.table).to_pydict()
        return ("batch", item.lane_id, item.ids, json.dumps(payload, sort_keys=True, default=repr))
    if isinstance(item, SampleRecord):
        return (
            "record",
            item.meta.lane_id,
            item.meta.sample_id,
            json.dumps(item.payload, sort_keys=True, default=_jsonable),
        )
    raise TypeError(f"signature(): expected SampleBatch or SampleRecord, got {type(item).__name__}")


def _jsonable(value: Any) -> Any:
    """Payload values JSON lacks: numpy arrays as their dtype and elements (repr would elide)."""
    if isinstance(value, np.ndarray):
        return [str(value.dtype), value.tolist()]
    return repr(value)


def collect(pipeline: Iterable[Any], limit: int | None = None) -> list[tuple[Any, ...]]:
    """Signatures of the items of one pass (or of its first ``limit`` items)."""
    it = iter(pipeline)
    try:
        return [signature(x) for x in itertools.islice(it, limit)]
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()


def take_and_checkpoint(pipeline: Any, k: int) -> tuple[list[tuple[Any, ...]], dict[str, Any]]:
    """The first ``k`` items and the checkpoint taken right after them, through JSON."""
    it = iter(pipeline)
    head = [signature(x) for x in itertools.islice(it, k)]
    ckpt = json.loads(json.dumps(pipeline.checkpoint()))
    it.close()
    return head, ckpt


def run_accumulator(acc: Any, frames: Sequence[Any], flush_after: Iterable[int] = ()) -> list[Any]:
    """Push ``frames`` into a `LaneAccumulator` as the engine would: a flush point (``flush(reset=
    True)``) after each frame whose index is in ``flush_after``, and the end of the lane; every
    frame it emitted, in order."""
    flush_after = set(flush_after)
    out: list[Any] = []
    for i, f in enumerate(frames):
        out += acc.push(f)
        if i in flush_after:
            out += acc.flush(reset=True)
    last: list[Any] = acc.flush(reset=True, end=True)
    return out + last


def assert_frame_split_invariant(
    make_accumulator: Callable[[], Any], rows: Any, *, cuts: Sequence[Sequence[int]], flush_at: Sequence[int] = ()
) -> None:
    """Push ``rows`` (a frame) into fresh accumulators cut into frames at each list of ``cuts``
    (row indices where a new frame starts), with flush points after the rows ``flush_at``: every
    cut must give the same output rows (payload and bookkeeping), in the same order, as one
    frame per flush epoch does.

    A `LaneAccumulator` that fails this makes runners, fetch sizes or restarts visible in the
    data (see the contract in `zephon_columnar.ops.accumulators`).
    """
    n = rows.num_rows

    def frames_for(starts: Sequence[int]) -> tuple[list[Any], set[int]]:
        bounds = sorted({0, n, *(c for c in starts if 0 < c < n), *(f for f in flush_at if 0 < f < n)})
        frames = [rows.slice(a, b - a) for a, b in itertools.pairwise(bounds)]
        flush_after = {i for i, b in enumerate(bounds[1:]) if b in set(flush_at)}
        return frames, flush_after

    def rows_of(out: list[Any]) -> list[dict[str, Any]]:
        tables = [t for t in out if t.num_rows]
        return [r for t in tables for r in t.to_pylist()]

    reference = rows_of(run_accumulator(make_accumulator(), *frames_for([])))
    for starts in cuts:
        got = rows_of(run_accumulator(make_accumulator(), *frames_for(starts)))
        if got != reference:
            first = next((i for i, (a, b) in enumerate(zip(got, reference)) if a != b), min(len(got), len(reference)))
            raise AssertionError(
                f"frames cut at {list(starts)}: output row {first} differs from one frame per "
                f"epoch ({len(got)} rows against {len(reference)})"
            )


def assert_resumes_exactly(
    make_pipeline: Callable[[], Any], ks: Sequence[int], *, again: Sequence[int] = (0, 1)
) -> list[tuple[Any, ...]]:
    """For each k: head + restored continuation == uninterrupted stream; and, for each j of
    ``again``, a checkpoint taken after j more items of the restored run resumes exactly too (a
    job that restarts and checkpoints again before, or right after, its first step). Returns
    the uninterrupted stream."""
    full = collect(make_pipeline())

    def check(got: list[tuple[Any, ...]], what: str) -> None:
        if got != full:
            first_bad = next((i for i, (a, b) in enumerate(zip(got, full)) if a != b), min(len(got), len(full)))
            raise AssertionError(
                f"{what}: resumed stream differs from the uninterrupted one at item {first_bad} "
                f"(resumed {len(got)} items, uninterrupted {len(full)})"
            )

    for k in ks:
        head, ckpt = take_and_checkpoint(make_pipeline(), k)
        assert head == full[:k], f"k={k}: the first {k} items differ from the uninterrupted run"
        resumed = make_pipeline()
        resumed.restore(ckpt)
        check(head + collect(resumed), f"k={k}")
        for j in again:
            if k + j > len(full):
                continue
            restored = make_pipeline()
            restored.restore(ckpt)
            more, ckpt2 = take_and_checkpoint(restored, j)
            third = make_pipeline()
            third.restore(ckpt2)
            check(head + more + collect(third), f"k={k}, checkpoint again {j} items after the restore")
    return full
