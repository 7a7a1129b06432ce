"""Restore warm-up: the samples a restored lane's pending rows name are read in the background,
into the readers the restored run's fetch uses; the stream is unchanged."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.engine.warmup import sample_pointers
from zephon_columnar.testing import assert_resumes_exactly, take_and_checkpoint


@pytest.fixture(scope="module")
def token_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokens")
    rng = np.random.default_rng(0)
    for s in range(3):
        docs = [rng.integers(1, 999, size=int(rng.integers(5, 60))).tolist() for _ in range(120)]
        pq.write_table(pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32()))}), root / f"shard-{s}.parquet",
                       row_group_size=40)
    return root


def build(root, runner="threads"):
    ws = StaticMixtureWorkSource([Dataset.from_path("tok", str(root))], {"tok": 1.0}, chunk_size=32, seed=1)
    return Pipeline(ws).pack_flat(64, algorithm="best_fit_wrap", pad_token_id=0).batch(3).options(runner=runner)


def test_restore_reads_the_pending_rows_samples_ahead_into_the_runs_readers(token_dir):
    _, ckpt = take_and_checkpoint(build(token_dir), 7)
    assert ckpt["lanes"]["0"]["pending"] is not None  # rows packed but not batched yet
    pipe = build(token_dir)
    pipe.restore(json.loads(json.dumps(ckpt)))
    warm = pipe.session._warmup  # noqa: SLF001 - the background read this test observes
    assert warm is not None
    warm._thread.join(timeout=30)  # noqa: SLF001
    reader = warm.pool._readers[0]._reader  # noqa: SLF001
    decoded = reader.stats["decoded_groups"]
    assert decoded >= 1
    it = iter(pipe)
    next(it)
    assert pipe.session.run._readers is warm.pool  # noqa: SLF001 - the run reads through the warmed readers
    assert reader.stats["cache_hits"] >= 1
    it.close()


@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_a_warmed_restore_resumes_exactly(token_dir, runner):
    assert_resumes_exactly(lambda: build(token_dir, runner), ks=[1, 7, 20])


def test_sample_pointers_of_packed_rows_are_their_pieces_samples():
    seg = pa.struct([("dataset", pa.int32()), ("shard", pa.int32()), ("row", pa.int64())])
    refs = pa.table({"__segments": pa.array([[{"dataset": 0, "shard": 2, "row": 5}, {"dataset": 0, "shard": 1, "row": 9}],
                                             [{"dataset": 0, "shard": 2, "row": 5}]], pa.list_(seg))})
    assert sample_pointers(refs).tolist() == [[0, 1, 9], [0, 2, 5]]
    plain = pa.table({"__dataset": [1, 0], "__shard": [0, 3], "__row": [4, 2]})
    assert sample_pointers(plain).tolist() == [[0, 3, 2], [1, 0, 4]]
