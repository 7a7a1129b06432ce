"""The examples that ship with Zephon (``examples/guide/**`` of datologyai/zephon, as
``../shared/reference/clients.md`` section 4 records them), with ``import zephon_columnar as
zephon``: the calls each example makes, on local data and a local tokenizer directory instead of
``s3://`` and hub ids."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.utils.data

import zephon_columnar as zephon
from zephon_columnar.io import Dataset
from zephon_columnar.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation


def work_source(root: Path, **kwargs) -> StaticMixtureWorkSource:
    code, web = Dataset.from_path("code", str(root / "code")), Dataset.from_path("web", str(root / "web"))
    return StaticMixtureWorkSource(datasets=[code, web], mixture=MixtureSpec({"code": .25, "web": .75}), seed=42,
                                   **kwargs)


def tokenized(root: Path, **kwargs) -> zephon.Pipeline:
    return zephon.Pipeline(work_source(root, **kwargs)).tokenize(tokenizer_id=str(root / "tokenizer"), field="text")


def test_first_pipeline_batches_records(client_corpus):
    batches = list(zephon.Pipeline(work_source(client_corpus)).batch(microbatch_size=32))
    assert batches and all(len(b.records) == 32 for b in batches)


def test_checkpoint_inside_a_torch_save_file_loads_with_weights_only_and_restores(client_corpus, tmp_path):
    def build() -> zephon.Pipeline:
        return tokenized(client_corpus, exhausted_policy="repeat").pack_flat(
            max_length=65, algorithm="wrap", pad_token_id=0).batch(microbatch_size=4)

    pipeline = build()
    it = iter(pipeline)
    for _ in range(3):
        next(it)
    model = torch.nn.Linear(2, 2)
    torch.save({"model": model.state_dict(), "optimizer": {"lr": 0.1}, "data": pipeline.checkpoint()},
               tmp_path / "step.pt")
    expected = [next(it).to_training(return_labels=True)["labels"].tolist() for _ in range(4)]
    checkpoint = torch.load(tmp_path / "step.pt")  # the default weights_only=True: plain types only
    resumed = build()
    resumed.restore(checkpoint["data"])
    it = iter(resumed)
    assert [next(it).to_training(return_labels=True)["labels"].tolist() for _ in range(4)] == expected


def test_elastic_resume_8_groups_on_4_and_hsdp_identity(client_corpus):
    def group(dp_degree: int, dp_group_id: int) -> zephon.Pipeline:
        return zephon.Pipeline(work_source(client_corpus, chunk_size=2)).batch(2).options(
            canonical_replicas=8, dp_degree=dp_degree, dp_group_id=dp_group_id, runner="inline")

    def ids(batch) -> list:
        return [r.meta.sample_id for r in batch.records]

    eight = [group(8, g) for g in range(8)]
    heads = []
    for p in eight:
        it = iter(p)
        heads += [ids(next(it)) for _ in range(2)]
        it.close()
    saved = zephon.Pipeline.merge_checkpoints([p.checkpoint() for p in eight])
    # HSDP: replicate x shard = 2 x 2 groups, dp_group_id = replicate_rank * shard.size() + shard_rank
    rest = []
    for replicate_rank in range(2):
        for shard_rank in range(2):
            p = group(2 * 2, replicate_rank * 2 + shard_rank)
            p.restore(saved)
            rest += [ids(b) for b in p]
    everything = [ids(b) for g in range(8) for b in group(8, g)]
    assert sorted(map(str, heads + rest)) == sorted(map(str, everything))


def test_torch_dataloader_and_the_two_to_training_shapes(client_corpus):
    pipeline = tokenized(client_corpus).pack_flat(max_length=33, algorithm="first_fit", num_bins=8,
                                                  pad_token_id=0).batch(microbatch_size=4)
    loader = torch.utils.data.DataLoader(pipeline.to_torch_dataset(), batch_size=None, num_workers=0)
    batch = next(iter(loader))
    titan = batch.to_training(return_labels=True, flatten=True, return_padding_mask=True,
                              return_num_valid_tokens=True)
    assert titan["input_ids"].shape == (4 * 32,) and titan["num_valid_tokens"] == int((titan["labels"] != -100).sum())
    megatron = batch.to_training(return_labels=True, return_loss_mask=True, return_cu_seqlens=True,
                                 rename_fields={"input_ids": "tokens"})
    assert megatron["tokens"].shape == (4, 32) and {"loss_mask", "cu_seqlens", "max_seqlen"} <= set(megatron)


def test_the_guide_operators_chain(client_corpus):
    pipeline = (zephon.Pipeline(work_source(client_corpus)).decode_text()
                .tokenize(tokenizer_id=str(client_corpus / "tokenizer"), field="text", max_length=2048,
                          split_long_samples=True)
                .ensure_mixture(max_buffer_size=1000, warn_tolerance=0.05)
                .shuffle(buffer_size=16384, seed=42)
                .pack_sequences(max_length=4097, num_bins=8, algorithm="first_fit")
                .batch(microbatch_size=2))
    records = [r for b in pipeline for r in b.records]
    segments = [seg for r in records for seg in r.payload["packed_samples"]]
    assert records and all(sum(len(s["input_ids"]) for s in r.payload["packed_samples"]) <= 4097 for r in records)
    assert len(segments) >= 0.9 * sum(ds.total() for ds in work_source(client_corpus).datasets_by_id.values())


def test_work_source_examples_per_dataset_policies_and_token_estimation(client_corpus):
    # chunk_size: the guide's corpus is far larger than this one; a 'stop' dataset must fill its
    # quota of the first chunk (as in Zephon), so the chunks are sized to this corpus.
    ws = work_source(client_corpus, exhausted_policy={"code": "repeat", "web": "stop"},
                     max_repeats={"code": 2, "web": None}, reshuffle_on_repeat={"code": True, "web": False},
                     token_estimation=TokenEstimation(primer="measure", calibration_samples=2048), chunk_size=16)
    pipeline = (zephon.Pipeline(ws).tokenize(tokenizer_id=str(client_corpus / "tokenizer"), field="text")
                .batch(4, drop_last=False))
    read = {0: 0, 1: 0}
    for b in pipeline:
        for r in b.records:
            read[r.meta.sample_id[0]] += 1
    assert ws.tokens_per_byte is not None and set(ws.tokens_per_byte) == {"code", "web"}
    # web: at most one pass (the stream stops at the first chunk it cannot fill); code: 1 + 2 repeats
    assert 90 - 16 < read[1] <= 90 and 0 < read[0] <= 3 * 60
    with pytest.warns(RuntimeWarning, match=r"max_repeats\['code'\]=1 has no effect"):  # as Zephon: a warning
        work_source(client_corpus, exhausted_policy={"code": "stop", "web": "repeat"}, max_repeats={"code": 1})
