"""pack_sequences: the packing algorithms with each row's segments kept apart (whole payloads for
first_fit/best_fit, aligned slices for wrap/best_fit_wrap), pack_payloads merges, exact resume."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from tests.ops.pack._helpers import docs_table
from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.errors import ConfigError
from zephon_columnar.ops.pack import PackSequencesOp
from zephon_columnar.testing import assert_resumes_exactly, collect

DOCS = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10], [11]]


def run(op, frames):
    acc = op.lane_accumulator()
    out = [t for f in frames for t in acc.push(f)] + acc.flush(reset=True, end=True)
    return [row for t in out for row in t.column("packed_samples").to_pylist()]


def test_first_fit_keeps_whole_payloads():
    rows = run(PackSequencesOp(6, algorithm="first_fit", num_bins=2), [docs_table(DOCS)])
    assert [[seg["input_ids"] for seg in row] for row in rows] == [[[1, 2, 3], [4, 5], [11]], [[6, 7, 8, 9, 10]]]
    seg = rows[0][0]
    assert seg["text"] == "1 2 3" and seg["doc_id"] == 0 and seg["loss_mask"] is not None  # every field


def test_wrap_keeps_aligned_slices_only():
    rows = run(PackSequencesOp(4, algorithm="wrap"), [docs_table(DOCS)])
    # [9, 10], [11]: the final partial row, which uncapped wrap drops.
    assert [[seg["input_ids"] for seg in row] for row in rows] == [[[1, 2, 3], [4]], [[5], [6, 7, 8]]]
    assert set(rows[0][0]) == {"input_ids", "loss_mask"}


def _pipe(**kw):
    ds = Dataset.from_tables("d", [pa.table({"input_ids": pa.array(
        [list(range(i * 10, i * 10 + 1 + i % 7)) for i in range(60)], pa.list_(pa.int32())),
        "doc": list(range(60))})])
    ws = StaticMixtureWorkSource([ds], {"d": 1.0}, chunk_size=8, seed=1)
    return Pipeline(ws).pack_sequences(16, **kw).batch(2, drop_last=False).options(flush_every_k_chunks=2)


@pytest.mark.parametrize("algorithm", ["first_fit", "wrap"])
def test_segments_keep_the_kind_of_the_tokens_they_were_packed_from(algorithm, tmp_path):
    # As the records were: token lists read from the data are numpy arrays, tokenize's ids lists.
    from tests.ops._tokenizers import make_tokenizer

    def kinds(pipe):
        return {type(seg["input_ids"]) for b in pipe for r in b.records for seg in r.payload["packed_samples"]}

    bins = {"num_bins": 2} if algorithm == "first_fit" else {}
    assert kinds(_pipe(algorithm=algorithm, **bins)) == {np.ndarray}
    tokenizer = tmp_path / "tokenizer.json"
    make_tokenizer().save(str(tokenizer))
    ds = Dataset.from_tables("t", [pa.table({"text": [f"document number {i} " * (1 + i % 4) for i in range(40)]})])
    def tokenized():
        ws = StaticMixtureWorkSource([ds], {"t": 1.0}, chunk_size=8, seed=1)
        return (Pipeline(ws).tokenize(tokenizer_id=str(tokenizer), field="text").pack_sequences(
            32, algorithm=algorithm, **bins).batch(2, drop_last=False).options(flush_every_k_chunks=2))
    assert kinds(tokenized()) == {list}
    # a restore rebuilds held rows with the same kinds (the signature compares values and kinds)
    assert_resumes_exactly(tokenized, ks=[1, 3])
    assert_resumes_exactly(lambda: _pipe(algorithm=algorithm, **bins), ks=[1, 3])


def test_merged_payloads_are_arrays_and_tensors():
    for merge, kind in (("numpy_array", np.ndarray), ("torch_tensor", torch.Tensor)):
        batch = next(iter(_pipe(algorithm="wrap", pack_payloads=merge)))
        merged = batch.records[0].payload["packed_samples"]
        assert isinstance(merged["input_ids"], kind) and len(merged["input_ids"]) == 16
    with pytest.raises(TypeError, match="cannot be concatenated"):
        collect(_pipe(algorithm="first_fit", num_bins=2, pack_payloads="numpy_array"))


def test_a_callable_merges_each_row():
    batch = next(iter(_pipe(algorithm="first_fit", num_bins=2, pack_payloads=lambda segs: len(segs))))
    assert all(isinstance(r.payload["packed_samples"], int) for r in batch.records)


@pytest.mark.parametrize("algorithm", ["first_fit", "wrap", "best_fit_wrap"])
def test_resumes_exactly(algorithm):
    kw = dict(algorithm=algorithm, num_bins=2) if algorithm == "first_fit" else dict(algorithm=algorithm)
    full = collect(_pipe(**kw))
    assert_resumes_exactly(lambda: _pipe(**kw), ks=[0, 1, 4, len(full) - 1])


def test_length_fn_and_bad_merges_are_refused():
    with pytest.raises(ConfigError, match="length_fn"):
        _pipe(algorithm="first_fit", num_bins=2, length_fn=len)
    with pytest.raises(ConfigError, match="pack_payloads='tensor'"):
        _pipe(algorithm="wrap", pack_payloads="tensor")
