"""pack_flat(algorithm="first_fit" | "best_fit"): whole documents into at most num_bins open bins;
the same rows whatever the frame cuts; Zephon 0.2.0's placement, eviction and flush order."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.ops.pack._helpers import docs_of, docs_table, packed_rows, real_tokens
from zephon_columnar.errors import DatasetFormatError
from zephon_columnar.ops.pack import PackFlatOp
from zephon_columnar.testing import run_accumulator as run
from zephon_columnar.types import PADDING_LENGTH


def fit(algorithm: str, max_length: int, num_bins: int, **kw):
    return PackFlatOp(max_length, algorithm=algorithm, num_bins=num_bins, pad_token_id=0, **kw).lane_accumulator()


def bins_of(out) -> list[list[int]]:
    """Each packed row as the sample rows (document indices) of its segments, in order."""
    if not out:
        return []
    return [[seg["row"] for seg in row] for row in pa.concat_tables(out).column("__segments").to_pylist()]


def reference_fit(epochs, max_length, num_bins, algorithm, fullest=False, min_room=1, cap=None):
    """Zephon's placement rule, one document at a time (the specification)."""
    rows, index = [], 0
    for docs in epochs:
        bins: list[list] = []  # [used, [doc indices]] in opening order
        for doc in docs:
            n = len(doc)
            i, index = index, index + 1
            if n == 0 or n > max_length:
                continue
            fits = [b for b in bins if max_length - b[0] >= n]
            if algorithm == "best_fit":
                target = min(fits, key=lambda b: max_length - b[0]) if fits else None
            else:
                target = fits[0] if fits else None
            fresh = target is None
            if fresh:
                target = [0, []]
            target[0] += n
            target[1].append(i)
            full = max_length - target[0] < min_room or (cap is not None and len(target[1]) >= cap)
            if fresh and not full:
                while len(bins) >= num_bins:
                    victim = min(bins, key=lambda b: max_length - b[0]) if fullest else bins[0]
                    bins.remove(victim)
                    rows.append(victim[1])
                bins.append(target)
            elif full:
                if not fresh:
                    bins.remove(target)
                rows.append(target[1])
        rows.extend(b[1] for b in bins)
    return rows


def test_zephons_trace_first_fit_and_best_fit():
    docs = docs_of([5, 3, 7, 2, 6, 4, 8, 1])
    assert bins_of(run(fit("first_fit", 10, 2), [docs_table(docs)])) == [[0, 1, 3], [4, 5], [2, 7], [6]]
    assert bins_of(run(fit("best_fit", 10, 2), [docs_table(docs)])) == [[0, 1, 3], [4, 5], [2], [6, 7]]


def test_eviction_fifo_and_fullest():
    docs = docs_of([6, 7, 5])
    assert bins_of(run(fit("first_fit", 10, 2), [docs_table(docs)]))[0] == [0]
    assert bins_of(run(fit("first_fit", 10, 2, flush_strategy="fullest"), [docs_table(docs)]))[0] == [1]


@settings(max_examples=120, deadline=None)
@given(data=st.data(), algorithm=st.sampled_from(["first_fit", "best_fit"]), max_length=st.integers(2, 16),
       num_bins=st.integers(1, 4), fullest=st.booleans(), min_room=st.integers(1, 3),
       cap=st.sampled_from([None, None, 1, 2, 3]))
def test_matches_reference_whatever_the_frame_cuts(data, algorithm, max_length, num_bins, fullest, min_room, cap):
    min_room = min(min_room, max_length)
    lengths = data.draw(st.lists(st.integers(0, max_length + 3), max_size=30), label="lengths")
    docs = docs_of(lengths)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, len(docs))), max_size=6), label="cuts")))
    bounds = [0] + [c for c in cuts if c < len(docs)] + [len(docs)]
    whole = docs_table(docs)
    frames = [whole.slice(a, b - a) for a, b in zip(bounds, bounds[1:])]
    flush_after = set(data.draw(st.lists(st.integers(0, max(0, len(frames) - 1)), max_size=3), label="flushes"))
    kw = dict(flush_strategy="fullest" if fullest else "fifo", min_sequence_length=min_room,
              max_sequences_per_bin=cap)
    packer = fit(algorithm, max_length, num_bins, **kw)
    out = run(packer, frames, flush_after)
    epochs, cur = [], []
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        cur.extend(docs[a:b])
        if i in flush_after:
            epochs.append(cur)
            cur = []
    epochs.append(cur)
    expected = reference_fit(epochs, max_length, num_bins, algorithm, fullest, min_room, cap)
    assert bins_of(out) == expected
    rows = packed_rows(out)
    assert all(len(r) == max_length for r in rows["input_ids"])
    kept = [i for i, d in enumerate(docs) if 0 < len(d) <= max_length]
    assert sorted(real_tokens(rows)) == sorted(t for i in kept for t in docs[i])  # whole documents, once each
    assert packer.ctx.stats.get("pack_oversized_docs", 0) == sum(len(d) > max_length for d in docs)
    # Frame-split invariance: one frame per document gives the same rows.
    alone = run(fit(algorithm, max_length, num_bins, **kw), [whole.slice(i, 1) for i in range(len(docs))],
                {j for j in range(len(docs)) if any(bounds[k + 1] - 1 == j for k in flush_after)})
    assert packed_rows(alone) == rows


def test_oversized_documents_are_dropped_or_refused():
    docs = docs_of([3, 12, 4])
    packer = fit("first_fit", 8, 2)
    assert bins_of(run(packer, [docs_table(docs)])) == [[0, 2]]
    assert packer.ctx.stats == {"pack_oversized_docs": 1, "pack_oversized_tokens": 12, "pack_docs_seen": 3,
                                "pack_tokens_seen": 19}
    with pytest.raises(DatasetFormatError, match=r"12 tokens, longer than max_length=8.*row=1.*drop_oversized"):
        run(fit("first_fit", 8, 2, drop_oversized=False), [docs_table(docs)])


def test_rows_are_padded_and_the_pad_is_masked():
    out = run(fit("best_fit", 8, 1), [docs_table(docs_of([3, 2, 6]))])
    rows = packed_rows(out)
    assert rows["input_ids"] == [[1, 2, 3, 4, 5, 0, 0, 0], [6, 7, 8, 9, 10, 11, 0, 0]]
    assert rows[PADDING_LENGTH] == [3, 2]
    assert rows["positions"] == [[0, 1, 2, 0, 1, 0, 1, 2], [0, 1, 2, 3, 4, 5, 0, 1]]


def test_packed_records_report_their_contributors_and_counts():
    from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource

    a = Dataset.from_tables("a", [pa.table({"input_ids": pa.array([[1] * 3, [2] * 4], pa.list_(pa.int32()))})])
    b = Dataset.from_tables("b", [pa.table({"input_ids": pa.array([[3] * 2, [4] * 5], pa.list_(pa.int32()))})])
    ws = StaticMixtureWorkSource([a, b], {"a": 0.5, "b": 0.5}, chunk_size=4, shuffle_shards=False)
    pipe = Pipeline(ws).pack_flat(8, algorithm="first_fit", num_bins=2, pad_token_id=0).batch(1, drop_last=False)
    metas = [r.meta for batch in pipe for r in batch.records]
    assert sum(sum(m.component_sample_counts.values()) for m in metas) == 4  # each document once
    for m in metas:
        assert sum(m.component_token_counts.values()) == 8 - m.padding_length
        assert [c.length for c in m.contributors] and all(c.is_last_child for c in m.contributors)
        assert sum(c.length for c in m.contributors) == 8 - m.padding_length
        assert m.sample_id == m.contributors[0].cursor.sample_id
        real = 8 - m.padding_length  # Zephon's tag on a packed record, as its tests read it
        assert m.tags["_packing_metadata"] == {
            "num_sequences": len(m.contributors),
            "total_length": real,
            "packing_efficiency": real / 8,
            "padding_length": m.padding_length,
        }
    assert {c for m in metas for c in m.component_token_counts} == {0, 1}  # both components counted


def test_domain_groups_must_name_mixture_components():
    from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
    from zephon_columnar.ops import DomainGroups

    a = Dataset.from_tables("a", [pa.table({"input_ids": pa.array([[1]], pa.list_(pa.int32()))})])
    ws = StaticMixtureWorkSource([a], {"a": 1.0})
    with pytest.raises(ValueError, match=r"components not in the mixture: \['nope'\]"):
        Pipeline(ws).pack_flat(8, algorithm="wrap", homogeneity="group", groups={"g": ["nope"]})
    with pytest.raises(ValueError, match="at most one group"):
        DomainGroups({"g": ["a"], "h": ["a"]})
