"""Megatron-LM's Zephon GPT pretraining provider (``megatron/training/datasets/zephon_dataloader.py``
in datologyai/Megatron-LM-zephon, as ``../shared/reference/clients.md`` section 2 records it),
called as it calls Zephon with ``import zephon_columnar as zephon``: a token-unit mixture, the
process runner with ``mtp_mode=True``, ``to_training`` with Megatron's key set (edited in place),
and the ``torch.save`` checkpoint file every DP rank reloads."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

import zephon_columnar as zephon
from zephon_columnar.io import Dataset
from zephon_columnar.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation

SEQ, MICRO = 16, 2
EOD = 1  # </s>


def build(root: Path, *, runner: str = "process", mtp_mode: bool = True, dp: int = 1, rank: int = 0,
          canonical_replicas: int = 2) -> zephon.Pipeline:
    datasets = [Dataset.from_path(name="web", path=str(root / "web"), fmt="jsonl"),
                Dataset.from_path(name="code", path=str(root / "code"), fmt="parquet")]
    ws = StaticMixtureWorkSource(datasets=datasets, mixture=MixtureSpec({"web": 3.0, "code": 1.0}), chunk_size=4,
                                 seed=1234, exhausted_policy="repeat", shuffle_shards=True,
                                 shuffle_within_shard=True, shuffle_block_size="auto",
                                 token_estimation=TokenEstimation())
    pipe = zephon.Pipeline(ws).prefetch(buffer_size=4, parallelism=2).fetch_parallelism(1)
    pipe = pipe.tokenize(tokenizer_id=str(root / "tokenizer"), field="text", add_attention_mask=False,
                         max_length=SEQ + 1, split_long_samples=True, special_tokens="bos_eos", bos_token_id=0,
                         eos_token_id=EOD, parallelism=None)
    pipe = pipe.pack_flat(max_length=SEQ + 1, algorithm="wrap", emit_positions=True, parallelism=None)
    pipe = pipe.shuffle(seed=1234, buffer_size=None, parallelism=None)
    pipe = pipe.batch(MICRO, drop_last=True)
    pipe.options(deterministic=True, dp_degree=dp, world_size=dp, dp_group_id=rank, global_rank=rank, runner=runner,
                 mtp_mode=mtp_mode, canonical_replicas=canonical_replicas,
                 io_options=zephon.io.StoreOptions(cache=zephon.io.CacheOptions.from_any(
                     {"enabled": True, "root": str(root / "cache"), "limit_bytes": "50gb"})))
    pipe.preflight_tokenizers()
    return pipe


def megatron_batch(batch, *, cu_seqlens: bool = False) -> dict[str, torch.Tensor]:
    out = batch.to_training(tokens_field="input_ids", return_labels=True, return_loss_mask=True,
                            return_cu_seqlens=cu_seqlens, dtype=torch.long, ignore_index=-100,
                            rename_fields={"input_ids": "tokens", "positions": "position_ids"},
                            exclude_fields=("ids", "texts"))
    out["loss_mask"][out["tokens"] == EOD] = 0.0  # --eod-mask-loss, in place
    return out


def plain(out: dict[str, torch.Tensor]) -> dict[str, list]:
    return {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in out.items()}


def test_training_batches_have_megatrons_keys_and_accept_in_place_edits(client_corpus):
    it = iter(build(client_corpus, runner="inline", mtp_mode=False))
    out = megatron_batch(next(it))
    assert sorted(out) == ["labels", "loss_mask", "position_ids", "tokens"]
    assert out["tokens"].shape == out["labels"].shape == out["loss_mask"].shape == (MICRO, SEQ)
    assert out["loss_mask"].dtype == torch.float32
    assert bool((out["loss_mask"][out["tokens"] == EOD] == 0).all())
    with_cu = megatron_batch(next(it), cu_seqlens=True)
    assert sorted(with_cu) == ["cu_seqlens", "labels", "loss_mask", "max_seqlen", "position_ids", "tokens"]
    it.close()


def test_process_runner_in_mtp_mode_gives_the_threads_data_and_resumes_from_the_torch_save_file(client_corpus,
                                                                                                 tmp_path):
    reference = [plain(megatron_batch(b)) for _, b in zip(range(10), build(client_corpus, runner="threads",
                                                                          mtp_mode=False))]
    pipe = build(client_corpus)
    it = iter(pipe)
    head = [plain(megatron_batch(next(it))) for _ in range(4)]
    assert head == reference[:4]
    # save_state() under --dataloader-save, then torch.load(weights_only=False) on every DP rank
    path = tmp_path / "dataloader.pt"
    torch.save({"iteration": 4, "dataloader_state_dict": {"zephon": pickle.dumps(pipe.checkpoint())}}, path)
    it.close()
    loaded = torch.load(path, map_location="cpu", weights_only=False)
    assert loaded["iteration"] == 4
    resumed = build(client_corpus)
    resumed.restore(pickle.loads(loaded["dataloader_state_dict"]["zephon"]))
    assert [plain(megatron_batch(b)) for _, b in zip(range(6), resumed)] == reference[4:]


def test_restore_errors_are_value_errors_the_provider_can_rewrap(client_corpus):
    pipe = build(client_corpus, runner="inline", mtp_mode=False)
    with pytest.raises(ValueError):
        pipe.restore({"format": "something else"})
    with pytest.raises(ValueError, match="pickle"):
        pipe.restore(pickle.dumps({"zephon": b""}))
