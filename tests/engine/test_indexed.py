"""Map-style access (`Pipeline.to_indexable_torch_dataset`): sample ``i`` equals the stream's
``i``-th sample, for every 1:1 operator; a clear error names what makes a pipeline not indexable."""

from __future__ import annotations

import pickle

import numpy as np
import polars as pl
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, DistributedSampler

from tests.conftest import write_jsonl_dataset, write_parquet_dataset
from tests.ops._tokenizers import make_tokenizer
from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.errors import ConfigError, PipelineError
from zephon_columnar.work import TokenEstimation


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("indexed")
    web = Dataset.from_path("web", str(write_parquet_dataset(root / "web", shards=3, rows_per_shard=30)))
    code = Dataset.from_path("code", str(write_jsonl_dataset(root / "code", shards=2, rows_per_shard=11,
                                                             start=1000)))
    return web, code


def mixture(sources, **kw) -> StaticMixtureWorkSource:
    web, code = sources
    args = dict(chunk_size=16, seed=7, shuffle_within_shard=True, shuffle_block_size=8)
    args.update(kw)
    return StaticMixtureWorkSource([web, code], {"web": 0.7, "code": 0.3}, **args)


def tokenized(sources, **kw) -> Pipeline:
    return (Pipeline(mixture(sources, **kw))
            .map_transform(pl.col("text").str.to_uppercase())
            .tokenize(make_tokenizer(), field="text", preserve_upstream_payload=True)
            .map_transform(lambda p: {**p, "n": len(p["input_ids"])}))


def payload(record) -> dict:
    return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in record.payload.items()}


def test_every_position_equals_the_streams_sample(sources):
    stream = list(tokenized(sources))
    ds = tokenized(sources).to_indexable_torch_dataset()
    assert len(ds) == len(stream) > 100
    got = [ds.record(i) for i in range(len(ds))]
    assert [payload(r) for r in got] == [payload(r) for r in stream]
    assert [r.meta.sample_id for r in got] == [r.meta.sample_id for r in stream]
    assert [(r.meta.chunk_id, r.meta.chunk_offset) for r in got] == [(r.meta.chunk_id, r.meta.chunk_offset)
                                                                     for r in stream]


def test_items_are_tensors_and_a_batch_is_read_in_one_pass(sources):
    ds = tokenized(sources).to_indexable_torch_dataset()
    item = ds[5]
    assert isinstance(item["input_ids"], torch.Tensor) and item["input_ids"].dtype == torch.int64
    assert item["input_ids"].tolist() == list(ds.record(5).payload["input_ids"])
    assert item["n"] == len(item["input_ids"]) and isinstance(item["text"], str)
    batch = ds.__getitems__([9, 2, 9, -1])
    assert [b["id"] for b in batch] == [ds[i]["id"] for i in (9, 2, 9, len(ds) - 1)]
    assert batch[0]["input_ids"].tolist() == batch[2]["input_ids"].tolist()
    batch[0]["input_ids"][0] = -5  # writable tensors that do not alias another sample's
    assert batch[2]["input_ids"][0] != -5


def ids_of(rows: list[dict]) -> list[int]:
    return [r["id"] for r in rows]


def test_dataloader_with_distributed_samplers_and_workers_covers_every_position(sources):
    pipe = tokenized(sources)
    expected = sorted(r.payload["id"] for r in pipe)
    ds = pipe.to_indexable_torch_dataset()
    seen = []
    for rank in range(2):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=1, drop_last=False)
        loader = DataLoader(ds, batch_size=4, sampler=sampler, num_workers=2, collate_fn=ids_of,
                            multiprocessing_context="spawn", timeout=120)
        seen += [i for batch in loader for i in batch]
    # DistributedSampler pads to a multiple of the ranks with repeats; everything is there
    assert sorted(set(seen)) == sorted(set(expected)) and len(seen) - len(expected) < 2


def test_workers_forked_after_polars_ran_fail_with_advice_instead_of_hanging(sources):
    pipe = tokenized(sources)
    list(pipe)  # Polars has run in this process: its thread pool would not survive a fork
    loader = DataLoader(pipe.to_indexable_torch_dataset(), batch_size=4, num_workers=1, collate_fn=ids_of,
                        multiprocessing_context="fork", timeout=120)
    with pytest.raises(PipelineError, match="multiprocessing_context='spawn'"):
        next(iter(loader))


def test_fixed_length_rows_collate_with_the_default_collate(tmp_path):
    import pyarrow as pa

    ids = [[i, i + 1, i + 2, i + 3] for i in range(40)]
    ds = Dataset.from_tables("pre", [pa.table({"input_ids": ids[:25]}), pa.table({"input_ids": ids[25:]})])
    pipe = Pipeline(StaticMixtureWorkSource([ds], {"pre": 1.0}, chunk_size=8, seed=1))
    loader = DataLoader(pipe.to_indexable_torch_dataset(), batch_size=8, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    batches = list(loader)
    assert [b["input_ids"].shape for b in batches] == [torch.Size([8, 4])] * 5
    assert sorted(map(tuple, torch.cat([b["input_ids"] for b in batches]).tolist())) == sorted(map(tuple, ids))


def test_repeats_and_mixture_weights_follow_the_stream(sources):
    # two passes of the small dataset: positions cover the repeats, as the stream does
    pipe = Pipeline(mixture(sources, stop_after_passes=2, chunk_size=10))
    stream = [r.meta.sample_id for r in pipe]
    ds = pipe.to_indexable_torch_dataset()
    assert [ds.record(i).meta.sample_id for i in range(len(ds))] == stream


def test_token_unit_mixture_is_primed_before_positions_are_planned(sources):
    est = TokenEstimation(primer="measure", calibration_samples=16)
    pipe = tokenized(sources, token_estimation=est)
    stream = [r.meta.sample_id for r in pipe]
    ds = tokenized(sources, token_estimation=est).to_indexable_torch_dataset()
    assert [ds.record(i).meta.sample_id for i in range(len(ds))] == stream


def test_pickles_into_a_fresh_process_state(sources):
    ds = tokenized(sources).to_indexable_torch_dataset()
    first = ds[3]["input_ids"].tolist()
    copy = pickle.loads(pickle.dumps(ds))
    assert copy[3]["input_ids"].tolist() == first
    copy.close()
    assert copy[3]["input_ids"].tolist() == first  # set up again after close


def test_out_of_range_and_wrong_type_positions(sources):
    ds = tokenized(sources).to_indexable_torch_dataset()
    with pytest.raises(IndexError, match=f"position {len(ds)} is out of range"):
        ds[len(ds)]
    with pytest.raises(TypeError, match="integer positions"):
        ds["3"]
    assert len(list(ds)) == len(ds)  # the sequence protocol stops at the IndexError


@pytest.mark.parametrize("build, culprit", [
    (lambda p: p.filter(pl.col("id") > 3), "'filter'"),
    (lambda p: p.shuffle(16), "'shuffle'"),
    (lambda p: p.tokenize(make_tokenizer(), field="text").pack_flat(32, algorithm="wrap"), "'pack_flat'"),
    (lambda p: p.tokenize(make_tokenizer(), field="text", max_length=4, split_long_samples=True), "'tokenize'"),
    (lambda p: p.batch(4), "'batch'"),
    (lambda p: p.stateful_transform("dedup", init_state=set, push=lambda s, r: (s, [r])), "'dedup'"),
])
def test_not_indexable_names_the_operator(sources, build, culprit):
    pipe = build(Pipeline(mixture(sources)))
    assert not pipe.is_indexable
    with pytest.raises(ConfigError, match=f"not indexable: operator {culprit}"):
        pipe.to_indexable_torch_dataset()


def test_endless_stream_is_not_indexable(sources):
    pipe = Pipeline(mixture(sources, exhausted_policy="repeat"))
    assert not pipe.is_indexable
    with pytest.raises(ConfigError, match="stream never ends"):
        pipe.to_indexable_torch_dataset()
    assert Pipeline(mixture(sources)).is_indexable


def test_a_map_that_drops_a_row_is_an_error_naming_it(sources):
    pipe = Pipeline(mixture(sources)).map_transform(lambda p: None if p["id"] == 1005 else p)
    ds = pipe.to_indexable_torch_dataset()
    where = [r.payload["id"] for r in Pipeline(mixture(sources))].index(1005)
    assert ds[where - 1]["id"] != 1005 and ds[where + 1]["id"] != 1005
    with pytest.raises(PipelineError, match=r"'map_transform' returned 0 rows for 1 at positions \[%d\]" % where):
        ds[where]


@settings(max_examples=25, deadline=None)
@given(chunk=st.integers(1, 40), seed=st.integers(0, 50), web=st.floats(0.05, 0.95),
       passes=st.integers(1, 2), picks=st.lists(st.integers(0, 10_000), min_size=1, max_size=20))
def test_property_positions_match_the_stream(sources, chunk, seed, web, passes, picks):
    w, c = sources
    def source():
        return StaticMixtureWorkSource([w, c], {"web": web, "code": 1 - web}, chunk_size=chunk, seed=seed,
                                       shuffle_within_shard=seed % 2 == 0, stop_after_passes=passes)
    stream = [r.meta.sample_id for r in Pipeline(source())]
    positions = source().positions()
    assert len(positions) == len(stream)
    idx = [p % len(stream) for p in picks]
    assert [tuple(p) for p in positions.locate(idx).pointers.tolist()] == [stream[i] for i in idx]
