"""pack_flat(algorithm="wrap"): rows of exactly max_length; uncapped wrap never pads, carries its
partial row across flush points and loses only the final partial row (counted); capped wrap pads;
positions restart at every segment, aligned fields follow, other fields are dropped by rule, the
pad tail is masked, reset is fresh but for the carry, and resume is exact mid-row."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.ops.pack._helpers import (
    docs_table,
    mask_of,
    packed_rows,
    real_tokens,
    reference_pack,
    wrap_kept,
)
from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar import frame as F
from zephon_columnar.errors import ConfigError, DatasetFormatError
from zephon_columnar.losses import said_of
from zephon_columnar.ops.pack import PackFlatOp
from zephon_columnar.ops.pack.packer import LanePacker
from zephon_columnar.testing import assert_resumes_exactly
from zephon_columnar.types import PADDING_LENGTH, SampleBatch


def wrap(max_length: int, **kw) -> LanePacker:
    return PackFlatOp(max_length, algorithm="wrap", **kw).lane_accumulator()


def run(packer, frames, flush_after=()) -> list[pa.Table]:
    """Push ``frames``; flush (reset) after the frames whose index is in ``flush_after``, and end."""
    out: list[pa.Table] = []
    for i, f in enumerate(frames):
        out += packer.push(f)
        if i in flush_after:
            out += packer.flush(reset=True)
    return out + packer.flush(reset=True, end=True)


# ---------------------------------------------------------------------- the specification, as a property
@settings(max_examples=150, deadline=None)
@given(data=st.data(), max_length=st.integers(2, 12), cap=st.sampled_from([None, None, 1, 2, 3]),
       pad=st.sampled_from([None, 0, 7]), chunked=st.booleans())
def test_wrap_matches_reference_with_random_pushes_and_flush_points(data, max_length, cap, pad, chunked):
    lengths = data.draw(st.lists(st.integers(0, 3 * max_length + 2), min_size=0, max_size=25), label="lengths")
    docs, nxt = [], 1
    for n in lengths:
        docs.append(list(range(nxt, nxt + n)))
        nxt += n
    # Cut the documents into frames (slices of one table: list arrays with offsets) and flush points.
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, len(docs))), max_size=6), label="cuts")))
    bounds = [0] + [c for c in cuts if c < len(docs)] + [len(docs)]
    whole = docs_table(docs)
    frames = []
    for a, b in zip(bounds, bounds[1:]):
        f = whole.slice(a, b - a)
        if chunked and b - a > 1:  # columns of several chunks
            f = pa.concat_tables([f.slice(0, 1), f.slice(1)])
        frames.append(f)
    flush_after = set(data.draw(st.lists(st.integers(0, max(0, len(frames) - 1)), max_size=3), label="flushes"))

    out = run(wrap(max_length, pad_token_id=pad, max_sequences_per_bin=cap), frames, flush_after)

    epochs, cur = [], []
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        cur.extend(docs[a:b])
        if i in flush_after:
            epochs.append(cur)
            cur = []
    epochs.append(cur)
    expected = reference_pack(epochs, max_length, 0 if pad is None else pad, cap)
    rows = packed_rows(out)
    stream = [t for d in docs for t in d]
    assert all(len(r) == max_length for r in rows["input_ids"])  # every row has length max_length
    # Conservation, in order: uncapped wrap loses only the final partial row, capped wrap nothing.
    assert real_tokens(rows) == (stream if cap is not None else wrap_kept(stream, max_length))
    assert rows["input_ids"] == [r["tokens"] for r in expected]
    assert rows["positions"] == [r["positions"] for r in expected]
    assert rows[PADDING_LENGTH] == [r["pad"] for r in expected]
    assert rows[F.ROW] == [r["doc"] for r in expected]  # bookkeeping of the first token's document
    real_masks = real_tokens({"input_ids": rows["loss_mask"], PADDING_LENGTH: rows[PADDING_LENGTH]})
    assert real_masks == [mask_of([t])[0] for t in real_tokens(rows)]  # the aligned field followed the tokens
    assert all(m[len(m) - p:] == [0] * p for m, p in zip(rows["loss_mask"], rows[PADDING_LENGTH]))
    if cap is None:  # uncapped wrap never pads, whatever the flush points
        assert not any(rows[PADDING_LENGTH])


def test_small_example_by_hand():
    packer = wrap(4)
    out = run(packer, [docs_table([[1, 2, 3], [4, 5, 6]]), docs_table([[7, 8, 9, 10, 11]], first_row=2)],
              flush_after={0})
    rows = packed_rows(out)
    # The flush after the first frame carries [5, 6] into the next epoch: no pad, nothing lost.
    assert rows["input_ids"] == [[1, 2, 3, 4], [5, 6, 7, 8]]
    # Zephon's rule: a document split across rows restarts at 0 in the next row.
    assert rows["positions"] == [[0, 1, 2, 0], [0, 1, 0, 1]]
    assert rows[PADDING_LENGTH] == [0, 0]
    assert rows[F.ROW] == [0, 1]
    assert packer.ctx.stats["pack_dropped_final_tokens"] == 3  # [9, 10, 11]: the final partial row


def test_the_final_partial_row_is_dropped_and_noted():
    packer = wrap(4)
    packer.push(docs_table([[1, 2, 3, 4, 5, 6]]))
    assert packer.flush(reset=True, end=True) == []
    assert packer.ctx.stats["pack_dropped_final_tokens"] == 2
    [notice] = packer.ctx.notices.noted()
    said = said_of(notice, packer.ctx.stats, "in this pass")
    assert "dropped 2 of 6 tokens (33.3%) in this pass, each lane's final partial row" in said.message


def test_segments_say_what_each_row_holds():
    out = run(wrap(4), [docs_table([[1, 2, 3], [4, 5, 6, 7, 8]])])
    segs = pa.concat_tables(out).column("__segments").to_pylist()
    assert [[(p["row"], p["start"], p["length"], p["closes"]) for p in row] for row in segs] == [
        [(0, 0, 3, True), (1, 0, 1, False)],
        [(1, 1, 4, True)],
    ]


def test_positions_give_document_ids_and_the_pad_tail_is_one_segment():
    out = run(wrap(8, max_sequences_per_bin=8), [docs_table([[5, 5, 5], [6, 6], [7]])])
    (pos,) = packed_rows(out)["positions"]
    assert pos == [0, 1, 2, 0, 1, 0, 0, 1]
    doc_ids = np.cumsum(np.array(pos) == 0) - 1
    assert doc_ids.tolist() == [0, 0, 0, 1, 1, 2, 3, 3]  # three documents, then the pad tail


def test_capped_rows_close_after_their_mth_segment():
    docs = [[1, 2], [3], [4, 5, 6, 7, 8, 10, 11], [12], [13]]
    out = run(wrap(5, max_sequences_per_bin=2, pad_token_id=9), [docs_table(docs)])
    rows = packed_rows(out)
    assert rows["input_ids"] == [[1, 2, 3, 9, 9], [4, 5, 6, 7, 8], [10, 11, 12, 9, 9], [13, 9, 9, 9, 9]]
    assert rows[PADDING_LENGTH] == [2, 0, 2, 4]


# ---------------------------------------------------------------------- fields
def test_aligned_fields_follow_and_other_fields_are_dropped():
    docs = [[1, 2, 3], [4, 5, 6, 7, 8]]
    extra = {
        "attention_mask": pa.array([[1] * len(d) for d in docs], pa.list_(pa.int8())),
        "flags": pa.array([[True, False, True], [False] * 5], pa.list_(pa.bool_())),
        "weights": pa.array([[0.5] * len(d) for d in docs], pa.large_list(pa.float32())),
        "spans": pa.array([[0, 1], [2]], pa.list_(pa.int64())),  # a list of another length
        "words": pa.array([["a", "b", "c"], list("vwxyz")], pa.list_(pa.string())),  # aligned, not numbers
        "meta": pa.array([{"k": 1}, {"k": 2}]),
        "score": pa.array([0.1, 0.2]),
    }
    out = run(wrap(4), [docs_table(docs, extra=extra)])
    table = pa.concat_tables(out)
    assert F.payload_names(table) == ["input_ids", "loss_mask", "attention_mask", "flags", "weights", "positions"]
    rows = table.to_pydict()
    assert rows["attention_mask"] == [[1, 1, 1, 1], [1, 1, 1, 1]]
    assert rows["flags"] == [[True, False, True, False], [False, False, False, False]]
    assert rows["weights"] == [[0.5] * 4, [0.5] * 4]
    assert table.schema.field("attention_mask").type == pa.list_(pa.int8())
    assert table.schema.field("flags").type == pa.list_(pa.bool_())
    assert table.schema.field("input_ids").type == pa.list_(pa.int32())
    assert table.schema.field("positions").type == pa.list_(pa.int32())
    assert table.schema.field(PADDING_LENGTH).type == pa.int32()


def test_alignment_is_decided_on_the_first_document_not_per_frame():
    # 'spans' happens to match the token length on a later frame only: still dropped.
    f1 = docs_table([[1, 2, 3]], extra={"spans": pa.array([[9]], pa.list_(pa.int32()))})
    f2 = docs_table([[4, 5]], first_row=1, extra={"spans": pa.array([[9, 9]], pa.list_(pa.int32()))})
    table = pa.concat_tables(run(wrap(2), [f1, f2]))
    assert "spans" not in table.column_names
    # 'ent' matches on the first document, then has another length: an error naming it and the sample.
    g1 = docs_table([[1, 2]], extra={"ent": pa.array([[1, 1]], pa.list_(pa.int32()))})
    g2 = docs_table([[3, 4, 5]], first_row=7, extra={"ent": pa.array([[1]], pa.list_(pa.int32()))})
    packer = wrap(2)
    packer.push(g1)
    with pytest.raises(DatasetFormatError, match=r"'ent'.*row=7.*Drop 'ent'"):
        packer.push(g2)
    # An empty first document decides nothing: the first non-empty one does.
    h = docs_table([[], [1, 2]], extra={"m": pa.array([[], [3]], pa.list_(pa.int32()))})
    assert "m" not in pa.concat_tables(run(wrap(2), [h])).column_names


def test_aligned_field_missing_later_is_an_error():
    packer = wrap(4)
    packer.push(docs_table([[1, 2]]))
    with pytest.raises(DatasetFormatError, match="'loss_mask'.*lacks it"):
        packer.push(docs_table([[3, 4]], aligned=False))


def test_existing_positions_column():
    extra = {"positions": pa.array([[0, 1, 2]], pa.list_(pa.int32()))}
    with pytest.raises(ConfigError, match="already has a 'positions' column.*emit_positions=False"):
        wrap(4).push(docs_table([[1, 2, 3]], extra=extra))
    out = run(wrap(4, emit_positions=False, max_sequences_per_bin=4), [docs_table([[1, 2, 3]], extra=extra)])
    assert packed_rows(out)["positions"] == [[0, 1, 2, 0]]  # packed as an ordinary aligned field


def test_token_column_resolution_and_errors():
    book = F.pointer_frame(lane=0, chunk_id=0, offsets=np.arange(1), pointers=np.array([[0, 0, 4]]),
                           components=np.zeros(1, np.int32))
    tokens = F.with_payload(book, pa.table({"tokens": pa.array([[1, 2, 3]], pa.list_(pa.int16()))}))
    assert packed_rows(run(wrap(2, max_sequences_per_bin=9), [tokens]), "tokens")["tokens"] == [[1, 2], [3, 0]]
    with pytest.raises(KeyError, match="no token column"):
        wrap(2).push(F.with_payload(book, pa.table({"text": ["hello"]})))
    with pytest.raises(TypeError, match="'text' has type string"):
        wrap(2, tokens_field="text").push(F.with_payload(book, pa.table({"text": ["hello"]})))
    with pytest.raises(KeyError, match="tokens_field='nope'"):
        wrap(2, tokens_field="nope").push(tokens)
    nulls = F.with_payload(book, pa.table({"input_ids": pa.array([None], pa.list_(pa.int32()))}))
    with pytest.raises(DatasetFormatError, match=r"null in sample \(dataset=0, shard=0, row=4\)"):
        wrap(2).push(nulls)
    small = F.with_payload(book, pa.table({"input_ids": pa.array([[1]], pa.list_(pa.uint8()))}))
    with pytest.raises(ConfigError, match="pad_token_id=300"):
        run(wrap(2, pad_token_id=300, max_sequences_per_bin=1), [small])


def test_token_types_of_later_frames_are_coerced_to_the_first():
    a = docs_table([[1, 2, 3]])
    b = docs_table([[4, 5]], token_type=pa.int64())
    table = pa.concat_tables(run(wrap(2), [a, b]))
    assert table.schema.field("input_ids").type == pa.list_(pa.int32())
    assert real_tokens(table.to_pydict()) == [1, 2, 3, 4]  # [5]: the final partial row
    big = docs_table([[2**40]], token_type=pa.int64())
    with pytest.raises(TypeError, match="cast it to one type"):
        run(wrap(2), [a, big])


def test_empty_inputs_emit_nothing():
    packer = wrap(3)
    assert packer.push(docs_table([])) == []
    assert packer.push(docs_table([[], []])) == []
    assert packer.flush(reset=True) == []


# ---------------------------------------------------------------------- to_training masks the pad
def test_padding_length_is_masked_by_to_training():
    # pad_token_id=5 is also a real token: masking must come from __padding_length, not the id.
    out = run(wrap(6, pad_token_id=5, max_sequences_per_bin=9),
              [docs_table([[5, 1, 2, 3, 4, 5, 6, 5], [7]], aligned=False)])
    batch = SampleBatch(pa.concat_tables(out))
    assert batch.table.column(PADDING_LENGTH).to_pylist() == [0, 3]
    t = batch.to_training(return_padding_mask=True, return_labels=True, return_num_valid_tokens=True)
    assert t["input_ids"].tolist() == [[5, 1, 2, 3, 4], [6, 5, 7, 5, 5]]
    assert t["padding_mask"].tolist() == [[False] * 5, [False, False, False, True, True]]
    assert t["labels"].tolist() == [[1, 2, 3, 4, 5], [5, 7, -100, -100, -100]]
    assert t["num_valid_tokens"] == 7
    assert t["positions"].tolist() == [[0, 1, 2, 3, 4], [0, 1, 0, 0, 1]]
    assert t["ids"] == [(0, 0, 0), (0, 0, 0)]  # the second row starts inside document 0


# ---------------------------------------------------------------------- reset
def test_flush_reset_gives_a_fresh_packer():
    a = [docs_table([[1, 2, 3, 4, 5]], extra={"x": pa.array([[0] * 5], pa.list_(pa.int32()))})]
    b = [docs_table([[6, 7], [8, 9, 10]], first_row=5, extra={"x": pa.array([[1], [1]], pa.list_(pa.int32()))})]
    packer = wrap(3, max_sequences_per_bin=2)
    first = run(packer, a)  # ends with flush(reset=True): 'x' was aligned in that epoch
    again = run(packer, b)  # after reset 'x' is decided afresh (not aligned: dropped, no error)
    fresh = run(wrap(3, max_sequences_per_bin=2), b)
    assert [t.to_pydict() for t in again] == [t.to_pydict() for t in fresh]
    assert "x" in first[0].column_names and "x" not in again[0].column_names
    # Capped: a partial row pending at reset is emitted padded by the flush.
    p = wrap(4, max_sequences_per_bin=3)
    p.push(docs_table([[1, 2, 3, 4, 5]]))
    assert packed_rows(p.flush(reset=True))["input_ids"] == [[5, 0, 0, 0]]
    assert [t.to_pydict() for t in run(p, b)] == [t.to_pydict() for t in run(wrap(4, max_sequences_per_bin=3), b)]


def test_uncapped_flush_carries_and_a_fresh_packer_primed_with_the_carry_continues_the_same():
    a = docs_table([[1, 2, 3, 4, 5]], extra={"x": pa.array([[0] * 5], pa.list_(pa.int32()))})
    b = docs_table([[6, 7], [8, 9, 10]], first_row=5, extra={"x": pa.array([[1, 1], [1, 1, 1]], pa.list_(pa.int32()))})
    p = wrap(4)
    first = p.push(a)
    assert p.flush(reset=True) == []  # nothing padded, nothing dropped
    carried = p.carry()
    assert carried.column("input_ids").to_pylist() == [[5]] and carried.column("__token_skip").to_pylist() == [4]
    rest = run(p, [b])
    primed = wrap(4)
    assert primed.push(carried) == []
    assert [t.to_pydict() for t in run(primed, [b])] == [t.to_pydict() for t in rest]
    rows = packed_rows(first + rest)
    assert rows["input_ids"] == [[1, 2, 3, 4], [5, 6, 7, 8]] and rows["x"] == [[0, 0, 0, 0], [0, 1, 1, 1]]
    # The carried piece still knows it is tokens 4.. of sample 0.
    assert [(s["row"], s["start"]) for s in rows["__segments"][1]] == [(0, 4), (5, 0), (6, 0)]


# ---------------------------------------------------------------------- the operator
@pytest.mark.parametrize("kwargs, message", [
    (dict(max_length=0), "max_length=0"),
    (dict(max_length=True), "max_length=True"),
    (dict(max_length=2.5), "max_length=2.5"),
    (dict(algorithm="first_fit"), "algorithm='first_fit'.*num_bins is required"),
    (dict(algorithm="best_fit"), "num_bins is required"),
    (dict(algorithm="greedy"), "algorithm='greedy'.*algorithm must be one of"),
    (dict(num_bins=4), "num_bins=4.*wrap"),
    (dict(num_bins=0), "num_bins=0"),
    (dict(max_sequences_per_bin=0), "max_sequences_per_bin=0"),
    (dict(tokens_field=""), "tokens_field"),
    (dict(tokens_field="__row"), "tokens_field"),
    (dict(pad_token_id="0"), "pad_token_id"),
    (dict(emit_positions=1), "emit_positions"),
    (dict(drop_oversized="yes"), "drop_oversized"),
    (dict(min_sequence_length=0), "min_sequence_length"),
    (dict(min_sequence_length=100), "min_sequence_length"),
    (dict(shuffle_strategy="sorted"), "shuffle_strategy='sorted'.*shuffle_strategy must be one of"),
    (dict(shuffle_seed=1.5), "shuffle_seed"),
    (dict(flush_strategy="lifo"), "flush_strategy"),
    (dict(candidate_pool_size=-1), "candidate_pool_size"),
    (dict(candidate_pool_size=8), "candidate_pool_size.*best_fit_wrap"),
    (dict(max_candidate_age=0), "max_candidate_age"),
    (dict(homogeneity="group"), "homogeneity='group'.*needs groups"),
    (dict(homogeneity="bogus"), "homogeneity='bogus'.*homogeneity must be one of"),
    (dict(groups={"a": ["x"]}), "groups"),
])
def test_argument_errors(kwargs, message):
    kwargs = {"max_length": 16, "algorithm": "wrap", **kwargs}
    with pytest.raises(ConfigError, match=message):
        PackFlatOp(kwargs.pop("max_length"), **kwargs)


def test_pipeline_default_algorithm_is_wrap_alone_and_first_fit_with_num_bins():
    ws = StaticMixtureWorkSource([Dataset.from_tables("d", [pa.table({"input_ids": [[1]]})])], {"d": 1.0})
    assert Pipeline(ws).pack_flat(8).spec.ops[-1].spec.algorithm == "wrap"
    assert Pipeline(ws).pack_flat(8, num_bins=2).spec.ops[-1].spec.algorithm == "first_fit"
    with pytest.raises(ConfigError, match="algorithm='first_fit'.*num_bins"):
        Pipeline(ws).pack_flat(8, algorithm="first_fit")
    with pytest.raises(ConfigError, match="algorithm='first_fit'.*num_bins"):
        Pipeline(ws).pack_sequences(8)


def test_operator_traits_and_fingerprint():
    op = PackFlatOp(64, algorithm="wrap", max_sequences_per_bin=3, parallelism=2, min_sequence_length=4)
    assert op.builtin and op.name == "pack_flat"
    assert op.traits().preserves_cursor_order is False
    fp = op.fingerprint()
    assert fp["op"] == "pack_flat" and fp["algorithm"] == "wrap" and fp["max_length"] == 64
    assert fp["max_sequences_per_bin"] == 3 and fp["min_sequence_length"] == 4 and fp["pad_token_id"] == 0
    assert PackFlatOp(64, algorithm="wrap", pad_token_id=2).fingerprint() != PackFlatOp(
        64, algorithm="wrap").fingerprint()
    assert isinstance(op.lane_accumulator(), LanePacker) and op.lane_accumulator() is not op.lane_accumulator()


# ---------------------------------------------------------------------- end to end through the Pipeline
def _corpus() -> list[list[int]]:
    rng = np.random.default_rng(7)
    lengths = np.where(rng.random(48) < 0.6, rng.integers(1, 40, 48), rng.integers(40, 3001, 48))
    lengths[:3] = [1, 3000, 2]
    docs, nxt = [], 0
    for n in lengths:
        docs.append(list(range(nxt, nxt + int(n))))
        nxt += int(n)
    return docs


DOCS = _corpus()
CORPUS = Dataset.from_tables("tok", [
    pa.table({"input_ids": pa.array(DOCS[a:b], pa.list_(pa.int32())),
              "text": [f"doc {i}" for i in range(a, b)]})
    for a, b in ((0, 20), (20, 35), (35, len(DOCS)))])
BY_ID = {(0, s, r): DOCS[a + r] for s, a in enumerate((0, 20, 35))
         for r in range((20, 15, len(DOCS) - 35)[s])}


def build(*, flush_every=2, lanes=1, runner="inline", pack=True, max_length=64):
    ws = StaticMixtureWorkSource([CORPUS], {"tok": 1.0}, chunk_size=5, seed=3, shuffle_within_shard=True)
    pipe = Pipeline(ws).fetch(max_batch=3)
    if pack:
        pipe = pipe.pack_flat(max_length, algorithm="wrap")
    return pipe.batch(4, drop_last=False).options(runner=runner, canonical_replicas=lanes,
                                                   flush_every_k_chunks=flush_every)


@pytest.mark.parametrize("flush_every, lanes", [(1, 1), (2, 3), (8, 3), (8, 1)])
def test_pipeline_conserves_tokens_per_lane(flush_every, lanes):
    order: dict[int, list] = {}
    for b in build(flush_every=flush_every, lanes=lanes, pack=False):
        order.setdefault(b.lane_id, []).extend(b.ids)
    packed: dict[int, dict[str, list]] = {}
    for b in build(flush_every=flush_every, lanes=lanes):
        rows = packed.setdefault(b.lane_id, {"input_ids": [], PADDING_LENGTH: [], "ids": []})
        rows["input_ids"] += b.table.column("input_ids").to_pylist()
        rows[PADDING_LENGTH] += b.table.column(PADDING_LENGTH).to_pylist()
        rows["ids"] += list(b.ids)
        assert "text" not in b.table.column_names
    assert sorted(order) == sorted(packed) == list(range(lanes))
    for lane, ids in order.items():
        rows = packed[lane]
        stream = [t for i in ids for t in BY_ID[i]]
        assert all(len(r) == 64 for r in rows["input_ids"])
        assert real_tokens(rows) == wrap_kept(stream, 64)  # nothing lost at flush points
        # Each row's sample id is the document of its first real token.
        owner = [i for i in ids for _ in BY_ID[i]]
        assert rows["ids"] == [owner[s] for s in range(0, len(rows["ids"]) * 64, 64)]
    dropped = sum(len(d) for d in DOCS) - sum(len(real_tokens(r)) for r in packed.values())
    assert 0 <= dropped < 64 * lanes  # at most the final partial row of each lane


@pytest.mark.parametrize("runner", ["inline", "threads"])
@pytest.mark.parametrize("flush_every, lanes", [(1, 1), (2, 3), (8, 3)])
def test_pipeline_resumes_exactly_mid_row(runner, flush_every, lanes):
    def make():
        return build(flush_every=flush_every, lanes=lanes, runner=runner)

    full = assert_resumes_exactly(make, ks=[0, 1, 3, 10, 37])
    n = len(full)
    assert n > 40
    assert_resumes_exactly(make, ks=[n - 1, n])


def test_pipeline_flush_cadence_does_not_change_uncapped_wrap():
    a = packed_rows([b.table for b in build(flush_every=1)])
    b = packed_rows([b.table for b in build(flush_every=8)])
    assert a["input_ids"] == b["input_ids"] and not any(a[PADDING_LENGTH])  # the carry crosses flush points


def test_pipeline_error_in_data_surfaces():
    bad = Dataset.from_tables("bad", [pa.table({"input_ids": pa.array([[1, 2]], pa.list_(pa.int32())),
                                                "loss_mask": pa.array([[1, 1]], pa.list_(pa.int8()))}),
                                      pa.table({"input_ids": pa.array([[1, 2, 3]], pa.list_(pa.int32())),
                                                "loss_mask": pa.array([[1]], pa.list_(pa.int8()))})])
    ws = StaticMixtureWorkSource([bad], {"bad": 1.0}, chunk_size=4, seed=0, shuffle_shards=False)
    pipe = Pipeline(ws).pack_flat(4, algorithm="wrap").batch(1).options(runner="inline")
    with pytest.raises((DatasetFormatError, ValueError), match="loss_mask"):
        list(pipe)


@pytest.mark.parametrize("chunks", [1, 3, 20])
def test_columns_chunked_differently_pack_like_one_chunk(chunks):
    """A frame whose columns have different chunk boundaries (or more chunks than the packer
    keeps as separate runs) packs exactly like the same frame in one chunk."""
    docs = [list(range(i * 10, i * 10 + 1 + (i * 7) % 9)) for i in range(20)]
    whole = docs_table(docs)
    cuts = np.linspace(0, len(docs), chunks + 1).astype(int)
    pieces = [whole.slice(a, b - a) for a, b in zip(cuts, cuts[1:])]
    frame = pa.concat_tables(pieces)
    # Re-chunk the aligned field at other boundaries than the tokens.
    mask = whole.column("loss_mask")
    frame = frame.set_column(frame.schema.get_field_index("loss_mask"), "loss_mask",
                             pa.chunked_array([mask.slice(0, 3).combine_chunks(), mask.slice(3).combine_chunks()]))
    assert frame.column("input_ids").num_chunks == chunks and frame.column("loss_mask").num_chunks == 2
    got = packed_rows(run(wrap(6), [frame]))
    want = packed_rows(run(wrap(6), [whole]))
    assert got == want
    assert real_tokens(got) == wrap_kept([t for d in docs for t in d], 6)


def test_pipeline_reports_the_dropped_final_row_in_explain_and_metrics():
    ds = Dataset.from_tables("d", [pa.table({"input_ids": pa.array([[1] * 5] * 7, pa.list_(pa.int32()))})])
    pipe = Pipeline(StaticMixtureWorkSource([ds], {"d": 1.0}, chunk_size=4)).pack_flat(8, algorithm="wrap").batch(1)
    assert pipe.metrics_snapshot() is None
    with pytest.warns(UserWarning, match="dropped 3 of 35 tokens"):
        rows = sum(len(b) for b in pipe)
    assert rows == 4  # 35 tokens: 4 rows of 8, 3 dropped
    assert "pack_dropped_final_tokens=3" in pipe.explain()
    assert {"lane": 0, "name": "pack_dropped_final_tokens", "value": 3} in pipe.metrics_snapshot().to_records()


@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_the_drop_warning_points_at_the_loop_that_iterates(runner):
    ds = Dataset.from_tables("d", [pa.table({"input_ids": pa.array([[1] * 5] * 7, pa.list_(pa.int32()))})])
    pipe = Pipeline(StaticMixtureWorkSource([ds], {"d": 1.0}, chunk_size=4)).pack_flat(8, algorithm="wrap").batch(1)
    with pytest.warns(UserWarning, match="each lane's final partial row") as seen:
        for _ in pipe.options(runner=runner):
            pass
    assert [w.filename for w in seen] == [__file__]  # not the engine's frame that flushed the packer
