"""Test helpers for pipelines and operators, offered to users too.

`assert_resumes_exactly` is the invariant every operator keeps: checkpoint after k items,
JSON round trip, restore into a freshly built pipeline, continue: the concatenation equals
the uninterrupted stream.

Example:
    >>> assert_resumes_exactly(lambda: Pipeline(make_ws()).batch(4), ks=[0, 1, 7])  # doctest: +SKIP
"""

from __future__ import annotations

import itertools
import json
from typing import Any, Callable, Iterable, Sequence

from zephon_columnar import frame as F
from zephon_columnar.types import SampleBatch, SampleRecord


def signature(item: Any) -> tuple:
    """A hashable, comparable description of a delivered item: lane, sample ids, payload."""
    if isinstance(item, SampleBatch):
        payload = F.payload_of(item.table).to_pydict()
        return ("batch", item.lane_id, item.ids, json.dumps(payload, sort_keys=True, default=repr))
    if isinstance(item, SampleRecord):
        return ("record", item.meta.lane_id, item.meta.sample_id,
                json.dumps(item.payload, sort_keys=True, default=repr))
    raise TypeError(f"signature(): expected SampleBatch or SampleRecord, got {type(item).__name__}")


def collect(pipeline: Iterable[Any], limit: int | None = None) -> list[tuple]:
    """Signatures of the items of one pass (or of its first ``limit`` items)."""
    it = iter(pipeline)
    try:
        return [signature(x) for x in itertools.islice(it, limit)]
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()


def take_and_checkpoint(pipeline: Any, k: int) -> tuple[list[tuple], dict[str, Any]]:
    """The first ``k`` items and the checkpoint taken right after them, through JSON."""
    it = iter(pipeline)
    head = [signature(x) for x in itertools.islice(it, k)]
    ckpt = json.loads(json.dumps(pipeline.checkpoint()))
    it.close()
    return head, ckpt


def assert_resumes_exactly(make_pipeline: Callable[[], Any], ks: Sequence[int]) -> list[tuple]:
    """For each k: head + restored continuation == uninterrupted stream. Returns the stream."""
    full = collect(make_pipeline())
    for k in ks:
        head, ckpt = take_and_checkpoint(make_pipeline(), k)
        resumed = make_pipeline()
        resumed.restore(ckpt)
        rest = collect(resumed)
        assert head == full[:k], f"k={k}: the first {k} items differ from the uninterrupted run"
        if head + rest != full:
            first_bad = next((i for i, (a, b) in enumerate(zip(head + rest, full)) if a != b),
                             min(len(head + rest), len(full)))
            raise AssertionError(
                f"k={k}: resumed stream differs from the uninterrupted one at item {first_bad} "
                f"(resumed {len(head + rest)} items, uninterrupted {len(full)})"
            )
    return full
