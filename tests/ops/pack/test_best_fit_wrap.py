"""pack_flat(algorithm="best_fit_wrap"): a candidate pool, best fit, at most one split per row;
Zephon 0.2.0's examples, conservation and frame-split invariance."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.ops.pack._helpers import docs_of, docs_table, packed_rows, real_tokens
from zephon_columnar.ops.pack import PackFlatOp
from zephon_columnar.testing import run_accumulator as run


def bfw(max_length: int, **kw):
    return PackFlatOp(max_length, algorithm="best_fit_wrap", pad_token_id=0, **kw).lane_accumulator()


def pieces(out):
    """Each row as (sample row, start, length) pieces."""
    rows = pa.concat_tables(out).column("__segments").to_pylist()
    return [[(s["row"], s["start"], s["length"]) for s in row] for row in rows]


def test_zephons_examples():
    # pool 1, lengths 8, 8: r0 + the suffix of r1 (a tail cut), then the flush gives r1's prefix.
    assert pieces(run(bfw(10, candidate_pool_size=1), [docs_table(docs_of([8, 8]))])) == [
        [(0, 0, 8), (1, 6, 2)], [(1, 0, 6)]]
    # lengths 3, 9: r1 whole + the suffix of r0.
    assert pieces(run(bfw(10, candidate_pool_size=1), [docs_table(docs_of([3, 9]))]))[0] == [(1, 0, 9), (0, 2, 1)]
    # flush of a large pool: full rows by best fit, then the rest in arrival order.
    got = pieces(run(bfw(10, candidate_pool_size=100), [docs_table(docs_of([6, 3, 9, 4, 2, 8, 5, 1]))]))
    assert [[p[0] for p in row] for row in got] == [[2, 7], [5, 4], [0, 3], [1, 6]]


def test_long_documents_emit_full_windows_first():
    got = pieces(run(bfw(4, candidate_pool_size=2), [docs_table(docs_of([9, 2]))]))
    assert got[:2] == [[(0, 0, 4)], [(0, 4, 4)]]
    assert sorted(p for row in got[2:] for p in row) == [(0, 8, 1), (1, 0, 2)]


@settings(max_examples=100, deadline=None)
@given(data=st.data(), max_length=st.integers(2, 12), pool=st.integers(1, 6), age=st.sampled_from([None, 1, 3]),
       cap=st.sampled_from([None, None, 2, 3]))
def test_conserves_tokens_at_most_one_split_per_row_and_ignores_frame_cuts(data, max_length, pool, age, cap):
    lengths = data.draw(st.lists(st.integers(0, 2 * max_length + 1), max_size=25), label="lengths")
    docs = docs_of(lengths)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, len(docs))), max_size=5), label="cuts")))
    bounds = [0] + [c for c in cuts if c < len(docs)] + [len(docs)]
    whole = docs_table(docs)
    kw = dict(candidate_pool_size=pool, max_candidate_age=age, max_sequences_per_bin=cap)
    out = run(bfw(max_length, **kw), [whole.slice(a, b - a) for a, b in zip(bounds, bounds[1:])])
    rows = packed_rows(out)
    assert all(len(r) == max_length for r in rows["input_ids"])
    assert sorted(real_tokens(rows)) == sorted(t for d in docs for t in d)  # nothing lost, nothing twice
    if out:
        for row in pieces(out):
            assert len({p[0] for p in row}) == len(row)  # never two pieces of one document in a row
        if cap is None:  # uncapped: only the last row of the stream may be padded
            assert not any(rows["__padding_length"][:-1])
    alone = run(bfw(max_length, **kw), [whole.slice(i, 1) for i in range(len(docs))])
    assert packed_rows(alone) == rows
