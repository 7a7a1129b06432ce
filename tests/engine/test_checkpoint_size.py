"""Checkpoints by reference stay small and restore computes only what the next batches need."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.testing import collect, take_and_checkpoint


def tokens_dataset(n: int, seed: int = 0, shards: int = 4) -> Dataset:
    rng = np.random.default_rng(seed)
    per = n // shards
    tables = []
    for s in range(shards):
        lengths = rng.integers(20, 400, per)
        ids = [rng.integers(0, 32000, int(k)).astype(np.int32) for k in lengths]
        tables.append(pa.table({"input_ids": pa.array(ids, pa.list_(pa.int32())), "text": ["x"] * per}))
    return Dataset.from_tables("d", tables)


DS = tokens_dataset(24000)


def test_the_wrap_pipeline_checkpoints_in_under_2_kb_per_lane():
    ws = StaticMixtureWorkSource([DS], {"d": 1.0}, chunk_size=1024, seed=3, shuffle_within_shard=True)
    pipe = Pipeline(ws).pack_flat(2048, algorithm="wrap").batch(8).options(canonical_replicas=2)
    sizes = []
    it = iter(pipe)
    for step in range(1, 260):
        next(it)
        if step % 37 == 0:
            sizes.extend(len(json.dumps(v)) for v in pipe.checkpoint()["lanes"].values())
    it.close()
    assert max(sizes) < 2048, sizes


def test_a_full_8192_row_shuffle_buffer_fits_64_kb():
    ws = StaticMixtureWorkSource([tokens_dataset(40000, seed=4)], {"d": 1.0}, chunk_size=1024, seed=3,
                                 shuffle_within_shard=True)
    pipe = (Pipeline(ws).shuffle(8192, seed=1).pack_flat(256, algorithm="wrap").batch(8)
            .options(flush_every_k_chunks=64))
    it = iter(pipe)
    lane = {}
    while not lane or lane["stages"][0]["state"]["arrivals"] < 2 * 8192:  # past the reservoir's growth
        for _ in range(200):
            next(it)
        lane = pipe.checkpoint()["lanes"]["0"]
    it.close()
    assert isinstance(lane["stages"][0]["rows"], str)  # 8192 references, compressed
    assert len(json.dumps(lane)) < 64 * 1024


CALLS = {"n": 0}


def counted(payload):
    CALLS["n"] += 1
    return payload


def test_restore_computes_only_the_rows_the_next_batch_needs():
    small = tokens_dataset(4000, seed=1)

    def make():
        ws = StaticMixtureWorkSource([small], {"d": 1.0}, chunk_size=256, seed=2)
        return (Pipeline(ws).map_transform(counted).shuffle(1024, seed=5).pack_flat(512, algorithm="first_fit",
                                                                                   num_bins=8)
                .batch(4).options(runner="inline", flush_every_k_chunks=16))

    full = collect(make())
    head, ckpt = take_and_checkpoint(make(), 60)
    assert ckpt["lanes"]["0"]["stages"][0]["state"]["arrivals"] > 1000  # a full buffer is held
    resumed = make()
    resumed.restore(ckpt)
    it = iter(resumed)
    CALLS["n"] = 0
    first = next(it)
    recomputed = CALLS["n"]
    it.close()
    assert recomputed < 300  # the shuffle holds ~1000 rows; the first batch needs a few dozen
    assert first.ids == full[60][2]
    resumed = make()
    resumed.restore(ckpt)
    assert head + collect(resumed) == full
