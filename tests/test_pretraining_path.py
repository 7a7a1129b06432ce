"""The standard pretraining job end to end: Parquet text -> tokenize -> pack_flat(wrap) -> batch.

Conservation (every real token of every document delivered once, in each lane's order, but the
final partial row of each lane, which uncapped wrap drops; nothing lost at flush points),
determinism across runners, and exact resume mid-row, on real files and a trained tokenizer.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.ops._tokenizers import make_texts, make_tokenizer
from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.testing import assert_resumes_exactly, collect

L = 48


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("text")
    texts = make_texts(300, seed=3, max_words=40)
    for s in range(3):
        part = list(range(s, 300, 3))
        pq.write_table(pa.table({"id": part, "text": [texts[i] for i in part]}), root / f"p{s}.parquet",
                       row_group_size=32)
    tok = make_tokenizer()
    path = root / "tokenizer.json"
    tok.save(str(path))
    return root, str(path), texts, tok


def source(corpus):
    return StaticMixtureWorkSource([Dataset.from_path("web", str(corpus[0]))], {"web": 1.0}, chunk_size=20, seed=9)


def build(corpus, **opts):
    tok_path = corpus[1]
    return (Pipeline(source(corpus)).tokenize(tokenizer_id=tok_path, field="text", special_tokens="eos", eos_token_id=1,
                                  add_attention_mask=False)
            .pack_flat(L, algorithm="wrap", pad_token_id=2).batch(3, drop_last=False)
            .options(canonical_replicas=2, flush_every_k_chunks=2, **opts))


def test_every_token_once_in_lane_order(corpus):
    _, _, texts, tok = corpus
    lanes: dict[int, list[int]] = defaultdict(list)
    order: dict[int, list[int]] = defaultdict(list)
    for batch in build(corpus, runner="inline"):
        t = batch.to_training(return_padding_mask=True)
        assert t["input_ids"].shape[1] == L
        real = t["input_ids"][~t["padding_mask"]].tolist()
        lanes[batch.lane_id].extend(real)
    # Reference: each lane's documents in the lane's own order, through plain records.
    for rec in Pipeline(source(corpus)).options(canonical_replicas=2, runner="inline"):
        order[rec.meta.lane_id].append(rec.payload["id"])
    for lane, ids in order.items():
        expected = []
        for i in ids:
            expected += tok.encode(texts[i], add_special_tokens=False).ids + [1]
        assert lanes[lane] == expected[: len(expected) // L * L]
        assert len(expected) - len(lanes[lane]) < L
    assert sorted(i for ids in order.values() for i in ids) == list(range(300))


@pytest.mark.parametrize("opts", [dict(runner="threads"), dict(runner="threads", prefetch_batches=2),
                                  dict(runner="process")])
def test_same_batches_on_every_runner(corpus, opts):
    assert collect(build(corpus, **opts)) == collect(build(corpus, runner="inline"))


@pytest.mark.parametrize("opts", [{}, dict(prefetch_batches=2)])
def test_resume_mid_row(corpus, opts):
    full = collect(build(corpus, **opts))
    assert len(full) > 10
    assert_resumes_exactly(lambda: build(corpus, **opts), ks=[0, 1, 3, 7, len(full) // 2, len(full) - 1])


def test_positions_restart_at_documents(corpus):
    batch = next(iter(build(corpus, runner="inline")))
    t = batch.to_training()
    pos = t["positions"].numpy()
    ids = t["input_ids"].numpy()
    # A new document starts right after each EOS (id 1), and only there (or at a row start).
    starts = np.zeros_like(pos, dtype=bool)
    starts[:, 0] = True
    starts[:, 1:] = ids[:, :-1] == 1
    assert ((pos == 0) == starts).all()
