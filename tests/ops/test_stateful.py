"""stateful_transform: per-lane state in user callbacks, windows of 64 records whatever the frame
cuts, flush at flush points and the end, transform on the workers, exact resume by replay."""

from __future__ import annotations

import pyarrow as pa
import pytest

from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.errors import ConfigError
from zephon_columnar.testing import assert_resumes_exactly, collect

DS = Dataset.from_tables("d", [pa.table({"id": [i % 37 for i in range(s * 100, s * 100 + 100)],
                                          "n": list(range(s * 100, s * 100 + 100))}) for s in range(3)])


def source(**kw):
    return StaticMixtureWorkSource([DS], {"d": 1.0}, chunk_size=32, seed=1, **kw)


def dedupe(seen, items):
    fresh, ids = [], set(seen)
    for r in items:
        if r.payload["id"] not in ids:
            ids.add(r.payload["id"])
            fresh.append(r)
    return frozenset(ids), fresh


def build(runner="inline", fetch=7, **opts):
    return (Pipeline(source()).fetch(max_batch=fetch)
            .stateful_transform("dedupe", init_state=frozenset, push=dedupe)
            .batch(5, drop_last=False).options(runner=runner, flush_every_k_chunks=2, **opts))


def test_dedupes_per_lane_within_each_flush_epoch():
    rows = [(b.lane_id, r.payload["id"]) for b in build(canonical_replicas=2) for r in b.records]
    seen = [i for _, i in rows]
    assert len(seen) < 300 and set(seen) == set(range(37))
    # The state restarts at every flush point (2 chunks of 32 rows): at most 37 ids an epoch.
    assert len(rows) <= 37 * (300 // 64 + 2)


def test_frame_sizes_and_runners_do_not_change_the_output():
    reference = collect(build())
    assert collect(build(fetch=3)) == reference
    assert collect(build(fetch=64)) == reference
    assert collect(build(runner="threads")) == reference


def test_resume_is_exact():
    full = collect(build(canonical_replicas=2))
    assert_resumes_exactly(lambda: build(canonical_replicas=2), ks=[0, 1, 4, 9, len(full) - 1])


def test_flush_and_should_flush_and_transform():
    # Zephon's example: batch records by token count, flush what is held; transform doubles n.
    def by_count(state, items, max_items=10):
        buffer, outputs = state["buffer"], []
        for item in items:
            if len(buffer) == max_items:
                outputs.extend(buffer)
                buffer = []
            buffer.append(item)
        return {"buffer": buffer}, outputs

    def double(records):
        for r in records:
            r.payload["n"] = r.payload["n"] * 2
        return records

    pipe = (Pipeline(source()).stateful_transform(
        "by_count", init_state=lambda: {"buffer": []}, push=by_count, flush=lambda s: s["buffer"],
        should_flush=lambda s: len(s["buffer"]) >= 8, transform=double, parallelism=2)
        .batch(4, drop_last=False).options(runner="threads"))
    ns = sorted(r.payload["n"] for b in pipe for r in b.records)
    assert ns == sorted(2 * i for i in range(300))  # nothing lost at flush points or the end


def test_errors_name_the_operator():
    with pytest.raises(ConfigError, match="push must be a callable"):
        Pipeline(source()).stateful_transform("x", init_state=dict, push=None)
    bad = Pipeline(source()).stateful_transform("bad", init_state=dict, push=lambda s, items: items)
    with pytest.raises(TypeError, match=r"'bad'.*\(new_state, outputs\)"):
        collect(bad)
    boom = Pipeline(source()).stateful_transform("boom", init_state=dict,
                                                 push=lambda s, items: 1 / 0)
    with pytest.raises(ZeroDivisionError, match=r"'boom'\): push failed on lane 0"):
        collect(boom)
