"""shuffle: a permutation within each flush epoch, the same whatever the frame cuts, runner or
restart, different across seeds and lanes; the reservoir really mixes."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar import frame as F
from zephon_columnar.errors import ConfigError
from zephon_columnar.ops.accumulators.lane import LaneContext
from zephon_columnar.ops.shuffle import ShuffleOp, warmup_size
from zephon_columnar.testing import assert_resumes_exactly, collect


def rows(n: int, first: int = 0) -> pa.Table:
    return F.frame_of({"x": list(range(first, first + n))}, first_row=first)


def run(acc, frames, flush_after=()):
    out = []
    for i, f in enumerate(frames):
        out += acc.push(f)
        if i in flush_after:
            out += acc.flush(reset=True)
    out += acc.flush(reset=True, end=True)
    return [x for t in out for x in t.column("x").to_pylist()]


def reference_streaming(keys, fill_rule_size, victim):
    """The reservoir one arrival at a time (the specification): slots, warm-up, growth."""
    B, W = fill_rule_size, warmup_size(fill_rule_size)
    slots, out = [], []
    for i, k in enumerate(keys):
        j = i - W
        if j < 0 or (j < 2 * (B - W) and j % 2 == 1):
            slots.append(i)
            continue
        v = victim(i, len(slots))
        if v == len(slots):
            out.append(i)
        else:
            out.append(slots[v])
            slots[v] = i
    return out, slots


@settings(max_examples=60, deadline=None)
@given(data=st.data(), size=st.integers(1, 40), algorithm=st.sampled_from(["streaming", "block", "block_warmup"]),
       n=st.integers(0, 150))
def test_a_permutation_per_epoch_whatever_the_frame_cuts(data, size, algorithm, n):
    op = ShuffleOp(size, seed=3, algorithm=algorithm, warmup_growth=1.5)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, n)), max_size=8), label="cuts")))
    bounds = [0] + [c for c in cuts if c < n] + [n]
    frames = [rows(b - a, a) for a, b in zip(bounds, bounds[1:])]
    flush_after = set(data.draw(st.lists(st.integers(0, max(0, len(frames) - 1)), max_size=2), label="flushes"))
    got = run(op.lane_accumulator(), frames, flush_after)
    assert sorted(got) == list(range(n))  # nothing lost or repeated
    # Rows never cross a flush point.
    edges = [bounds[i + 1] for i in sorted(flush_after)]
    pos = 0
    for e in edges + [n]:
        if e <= pos:
            continue
        assert sorted(got[pos:e]) == list(range(pos, e))
        pos = e
    # One frame per row gives the same order (frame-split invariance).
    alone = run(op.lane_accumulator(), [rows(1, i) for i in range(n)],
                {bounds[i + 1] - 1 for i in flush_after if bounds[i + 1] > 0})
    assert alone == got


def test_streaming_matches_the_one_row_at_a_time_reservoir():
    op = ShuffleOp(50, seed=11)
    acc = op.lane_accumulator()
    frame = rows(400)
    keys = acc.keys(frame)
    got = run(op.lane_accumulator(), [frame.slice(0, 137), frame.slice(137)])
    out, slots = reference_streaming(keys, 50, lambda i, fill: int(keys[i] % np.uint64(fill + 1)))
    assert got[:len(out)] == out
    assert sorted(got[len(out):]) == sorted(slots)


def test_it_mixes_and_depends_on_seed_and_lane():
    def order(seed, lane):
        return run(ShuffleOp(256, seed=seed).lane_accumulator(LaneContext(lane=lane)), [rows(2000)])

    a = order(1, 0)
    assert a != list(range(2000)) and a != order(2, 0) and a != order(1, 1)
    assert a == order(1, 0)
    displacement = np.abs(np.array(a) - np.arange(2000))
    assert displacement.mean() > 60  # rows really move (a 256-row reservoir)
    assert warmup_size(8192) == 128 and warmup_size(1) == 0


def test_block_warmup_ramps_block_sizes():
    acc = ShuffleOp(40, seed=0, algorithm="block_warmup").lane_accumulator()
    sizes = [t.num_rows for t in acc.push(rows(60))]
    assert sizes == [2, 3, 5, 8, 12, 18]  # then 27: waiting for more rows


@pytest.mark.parametrize("kwargs, message", [
    (dict(buffer_size=0), "buffer_size=0"),
    (dict(seed=-1), "seed=-1"),
    (dict(algorithm="reservoir"), "algorithm='reservoir'"),
    (dict(warmup_growth=1.0), "warmup_growth=1.0"),
])
def test_argument_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        ShuffleOp(**kwargs)


DS = Dataset.from_tables("a", [pa.table({"id": list(range(s * 40, s * 40 + 40))}) for s in range(4)])


def build(runner="inline", lanes=2, algorithm="streaming", flush_every=2):
    ws = StaticMixtureWorkSource([DS], {"a": 1.0}, chunk_size=12, seed=4)
    return (Pipeline(ws).fetch(max_batch=5).shuffle(16, seed=9, algorithm=algorithm).batch(3, drop_last=False)
            .options(runner=runner, canonical_replicas=lanes, flush_every_k_chunks=flush_every))


@pytest.mark.parametrize("algorithm", ["streaming", "block", "block_warmup"])
def test_pipeline_every_row_once_same_on_every_runner_and_resumes(algorithm):
    full = collect(build(algorithm=algorithm))
    ids = [i for b in build(algorithm=algorithm) for i in b.to_pydict()["id"]]
    assert sorted(ids) == list(range(160)) and ids != sorted(ids)
    assert collect(build("threads", algorithm=algorithm)) == full
    assert_resumes_exactly(lambda: build(algorithm=algorithm), ks=[0, 1, 5, 17, len(full) - 1])
