"""TorchTitan's Zephon data loader override (``torchtitan/overrides/zephon_dataloader.py`` in
datologyai/torchtitan-zephon, as ``../shared/reference/clients.md`` section 1 records it), called
exactly as it calls Zephon with ``import zephon_columnar as zephon``: the builder keywords, the
options in two calls, ``to_training`` and its squeeze, ``{"zephon": pickle.dumps(checkpoint())}``
state, and the elastic demo's global batch order over real gloo ranks."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import zephon_columnar as zephon
from zephon_columnar.io import Dataset
from zephon_columnar.work import MixtureSpec, StaticMixtureWorkSource

SEQ = 32  # num_tokens_per_batch
ALGORITHMS = ["wrap", "first_fit", "best_fit", "best_fit_wrap"]


class TitanLoader:
    """The override's shape: builds the pipeline once, yields trainer inputs, opaque state."""

    def __init__(self, root: Path, *, training: bool = True, algorithm: str = "wrap", dp: int = 1, rank: int = 0,
                 canonical_replicas: int = 2, shuffle_after_pack: bool = False, aggregate_dir: str | None = None,
                 run_id: str = "titan") -> None:
        datasets = [Dataset.from_path(name="web", path=str(root / "web"), fmt="jsonl"),
                    Dataset.from_path(name="code", path=str(root / "code"), fmt=None)]
        ws = StaticMixtureWorkSource(
            datasets=datasets, mixture=MixtureSpec({"web": 3.0, "code": 1.0}), chunk_size=4, seed=42,
            shuffle_shards=training, shuffle_within_shard=training, shuffle_block_size="auto",
            **({"exhausted_policy": "repeat"} if training else {}))
        pipe = zephon.Pipeline(ws).fetch_parallelism(2)
        pipe = pipe.tokenize(tokenizer_id=str(root / "tokenizer"), field="text", add_attention_mask=False,
                             max_length=SEQ + 1, split_long_samples=True, special_tokens="bos_eos")
        fit = {"num_bins": 4} if algorithm in ("first_fit", "best_fit") else {}
        pad = {} if algorithm == "wrap" else {"pad_token_id": 2}
        pipe = pipe.pack_flat(max_length=SEQ + 1, algorithm=algorithm, emit_positions=True, **fit, **pad)
        if shuffle_after_pack:
            pipe = pipe.shuffle(seed=42, buffer_size=8, parallelism=None)
        pipe.preflight_tokenizers()
        pipe = pipe.batch(1, drop_last=True)
        # two options() calls, as the newest override: base options, then cache and identity
        pipe.options(deterministic=True, dp_degree=dp, dp_group_id=rank, canonical_replicas=canonical_replicas,
                     runner="inline", mtp_mode=False)
        identity: dict[str, Any] = {"io_options": {"cache": {"enabled": True, "root": str(root / "cache")}}}
        if dist.is_available() and dist.is_initialized():
            identity.update(world_size=dist.get_world_size(), global_rank=dist.get_rank())
        if dp > 1:
            identity.update(aggregate_dir=aggregate_dir, run_id=run_id)
        pipe.options(**identity)
        self._pipeline = pipe
        self._it = None

    def __iter__(self):
        self._it = iter(self._pipeline)
        for batch in self._it:
            out = batch.to_training(tokens_field="input_ids", return_labels=True, dtype=torch.long, ignore_index=-100,
                                    rename_fields={"input_ids": "input"}, return_padding_mask=True)
            inputs = {k: out[k].squeeze(0) for k in ("input", "positions", "padding_mask")}
            labels = out["labels"].squeeze(0)
            yield inputs, labels, int((labels != -100).sum())

    def state_dict(self) -> dict[str, bytes]:
        return {"zephon": pickle.dumps(self._pipeline.checkpoint())}

    def load_state_dict(self, state: dict[str, bytes]) -> None:
        self._pipeline.restore(pickle.loads(state["zephon"]))


def as_lists(step) -> list[list[int]]:
    inputs, labels, _ = step
    return [inputs["input"].tolist(), inputs["positions"].tolist(), labels.tolist()]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_trainer_batches_have_the_override_shapes_and_resume_from_opaque_bytes(client_corpus, algorithm):
    loader = TitanLoader(client_corpus, algorithm=algorithm)
    steps = iter(loader)
    first = next(steps)
    inputs, labels, valid = first
    assert sorted(inputs) == ["input", "padding_mask", "positions"]
    for t in (*inputs.values(), labels):
        assert t.shape == (SEQ,) and t.dtype == (torch.bool if t is inputs["padding_mask"] else torch.long)
    assert valid == int((labels != -100).sum()) > 0
    # pad ids and ignored labels sit under padding_mask
    pad = inputs["padding_mask"]
    assert bool((inputs["input"][pad] == 2).all()) and bool((labels[pad] == -100).all())
    state = loader.state_dict()  # iterator left open, as the unit test does
    assert isinstance(state["zephon"], bytes)
    expected = [as_lists(next(steps)) for _ in range(6)]
    fresh = TitanLoader(client_corpus, algorithm=algorithm)
    fresh.load_state_dict(state)
    got = iter(fresh)
    assert [as_lists(next(got)) for _ in range(6)] == expected


def test_a_checkpoint_with_shuffle_after_pack_resumes_exactly(client_corpus):
    loader = TitanLoader(client_corpus, algorithm="best_fit_wrap", shuffle_after_pack=True)
    steps = iter(loader)
    for _ in range(5):
        next(steps)
    state = loader.state_dict()
    expected = [as_lists(next(steps)) for _ in range(8)]
    fresh = TitanLoader(client_corpus, algorithm="best_fit_wrap", shuffle_after_pack=True)
    fresh.load_state_dict(state)
    assert [as_lists(s) for _, s in zip(range(8), fresh)] == expected


def test_validation_loader_is_finite_and_needs_no_token_priming(client_corpus):
    loader = TitanLoader(client_corpus, training=False)
    assert loader._pipeline._ws.requires_token_priming is False  # noqa: SLF001 - what the client's test reads
    steps = list(loader)
    assert steps and all(s[0]["input"].shape == (SEQ,) for s in steps)


def test_a_single_short_document_gives_no_batch_under_uncapped_wrap_and_a_padded_one_otherwise(tmp_path, client_corpus):
    (tmp_path / "web").mkdir()
    (tmp_path / "web" / "one.jsonl").write_text(json.dumps({"text": "a short document"}) + "\n")
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "one.jsonl").write_text(json.dumps({"text": "also short"}) + "\n")
    (tmp_path / "tokenizer").symlink_to(client_corpus / "tokenizer")
    for algorithm in ALGORITHMS:
        loader = TitanLoader(tmp_path, training=False, algorithm=algorithm, canonical_replicas=1)
        steps = list(loader)
        if algorithm == "wrap":
            assert steps == []
        else:
            assert len(steps) == 1 and bool(steps[0][0]["padding_mask"].any())


# ---------------------------------------------------------------------------- elastic demo
STEPS, SAVE_AT = 6, 2


def _global_steps(loader: TitanLoader, world: int, n: int) -> list[list[Any]]:
    """n global steps: each rank takes canonical_replicas / world batches, then all-gathers."""
    per_rank = 2 // world
    steps, it = [], iter(loader)
    for _ in range(n):
        mine = [as_lists(next(it)) for _ in range(per_rank)]
        if world > 1:
            parts: list[Any] = [None] * world
            dist.all_gather_object(parts, mine)
            mine = [b for part in parts for b in part]
        steps.append(mine)
    return steps


def _elastic_rank(rank: int, world: int, store: str, root: str, out: str, mode: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        def loader(run_id: str) -> TitanLoader:
            return TitanLoader(Path(root), dp=world, rank=rank, aggregate_dir=str(Path(out) / "agg"), run_id=run_id)

        result: dict[str, Any] = {}
        if mode == "reference_and_save":
            result["reference"] = _global_steps(loader("ref"), world, STEPS)
            saving = loader("save")
            _global_steps(saving, world, SAVE_AT)
            state = saving.state_dict()  # collective, on every rank
            if rank == 0:
                Path(out, "ckpt-2ranks.pkl").write_bytes(pickle.dumps(state))
        else:  # resume on `world` ranks from the 1-rank checkpoint, every rank reading rank 0's file
            resumed = loader("resume")
            resumed.load_state_dict(pickle.loads(Path(out, "ckpt-1rank.pkl").read_bytes()))
            result["resumed"] = _global_steps(resumed, world, STEPS - SAVE_AT)
        if rank == 0:
            Path(out, f"{mode}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def test_elastic_resume_2_to_1_and_1_to_2_preserves_global_batch_order(tmp_path, client_corpus):
    mp.spawn(_elastic_rank, args=(2, str(tmp_path / "store1"), str(client_corpus), str(tmp_path), "reference_and_save"),
             nprocs=2, join=True)
    reference = json.loads((tmp_path / "reference_and_save.json").read_text())["reference"]
    # 2 -> 1: one process restores the 2-rank checkpoint and continues the global order
    one = TitanLoader(client_corpus)
    one.load_state_dict(pickle.loads((tmp_path / "ckpt-2ranks.pkl").read_bytes()))
    assert json.loads(json.dumps(_global_steps(one, 1, STEPS - SAVE_AT))) == reference[SAVE_AT:]
    # 1 -> 2: a 1-rank run saves; two gloo ranks resume from its file
    saving = TitanLoader(client_corpus)
    head = _global_steps(saving, 1, SAVE_AT)
    assert json.loads(json.dumps(head)) == reference[:SAVE_AT]
    (tmp_path / "ckpt-1rank.pkl").write_bytes(pickle.dumps(saving.state_dict()))
    mp.spawn(_elastic_rank, args=(2, str(tmp_path / "store2"), str(client_corpus), str(tmp_path), "resume"),
             nprocs=2, join=True)
    assert json.loads((tmp_path / "resume.json").read_text())["resumed"] == reference[SAVE_AT:]
