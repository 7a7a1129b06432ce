"""NeMo AutoModel's Zephon data module (``nemo_automodel.components.datasets.zephon``, as
``../shared/reference/clients.md`` section 3 records it from its docs), called as it calls
Zephon with ``import zephon_columnar as zephon``: a source pipeline with a token-unit mixture and
an adapter-owned ``measure``, ``finalize_pipeline`` mutating the pipeline in place, a loader that
keeps a Counter of component tokens and stores its state as opaque ``checkpoint(as_bytes=True)``
bytes, and the all-rank checkpoint in which tensor-parallel peers take part."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import zephon_columnar as zephon
from zephon_columnar.io import Dataset
from zephon_columnar.work import MixtureSpec, StaticMixtureWorkSource, TokenEstimation

SEQ = 24


def create_source_pipeline(root: Path, seed: int, dp_rank: int, dp_world_size: int,
                           measure: Callable[[dict], int] | None = None) -> zephon.Pipeline:
    datasets = [Dataset.from_path(name="web", path=str(root / "web")),
                Dataset.from_path(name="code", path=str(root / "code"))]
    estimation = TokenEstimation(primer="measure", measure=measure, calibration_samples=64, calibration_shards_min=2,
                                 calibration_shards_max=4, fallback_tokens_per_byte=0.25)
    ws = StaticMixtureWorkSource(datasets=datasets, mixture=MixtureSpec({"web": 0.7, "code": 0.3}), chunk_size=8,
                                 seed=seed, exhausted_policy="repeat", token_estimation=estimation)
    return zephon.Pipeline(ws).prefetch(buffer_size=8, parallelism=2)


def encode_and_pack(pipeline: zephon.Pipeline, root: Path) -> zephon.Pipeline:
    return (pipeline.tokenize(tokenizer_id=str(root / "tokenizer"), field="text", add_attention_mask=False,
                              max_length=SEQ + 1, split_long_samples=True)
            .pack_flat(max_length=SEQ + 1, algorithm="best_fit_wrap", emit_positions=True, pad_token_id=2))


def finalize_pipeline(pipeline: zephon.Pipeline, batch_size: int, seed: int, dp_rank: int, dp_world_size: int,
                      **runtime: Any) -> None:
    """Batches complete documents and configures the runtime, in place; neither iterates nor
    checkpoints."""
    pipeline.batch(batch_size, drop_last=True)
    pipeline.options(deterministic=True, dp_degree=dp_world_size, dp_group_id=dp_rank, canonical_replicas=2,
                     runner="threads", **runtime)


def convert_text_batch(batch) -> dict[str, torch.Tensor]:
    return batch.to_training(return_labels=True, return_padding_mask=True, dtype=torch.long)


class AutoModelLoader:
    """One stream per loader; trainer batches; a component-token Counter; opaque byte state."""

    def __init__(self, pipeline: zephon.Pipeline, convert_batch: Callable = convert_text_batch) -> None:
        self._pipeline = pipeline
        self._convert = convert_batch
        self._it = None
        self.component_tokens: collections.Counter = collections.Counter()
        self._restored_checkpoint = b""

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        if self._it is None:
            self._it = iter(self._pipeline)
        batch = next(self._it)
        for record in batch.records:
            self.component_tokens.update(record.meta.component_token_counts)
        return self._convert(batch)

    def state_dict(self) -> bytes:
        return self._pipeline.checkpoint(as_bytes=True)

    def load_state_dict(self, state: bytes) -> None:
        self._restored_checkpoint = state
        self._pipeline.restore(state)


def build_loader(root: Path, dp_rank: int = 0, dp_world_size: int = 1, **runtime: Any) -> AutoModelLoader:
    pipeline = encode_and_pack(create_source_pipeline(root, seed=7, dp_rank=dp_rank, dp_world_size=dp_world_size),
                               root)
    finalize_pipeline(pipeline, batch_size=2, seed=7, dp_rank=dp_rank, dp_world_size=dp_world_size, **runtime)
    return AutoModelLoader(pipeline)


def as_lists(out: dict[str, torch.Tensor]) -> dict[str, list]:
    return {k: v.tolist() for k, v in out.items() if isinstance(v, torch.Tensor)}


def test_opaque_byte_state_restores_a_fresh_loader_exactly(client_corpus):
    loader = build_loader(client_corpus)
    for _ in range(5):
        next(loader)
    state = loader.state_dict()
    assert isinstance(state, bytes)
    expected = [as_lists(next(loader)) for _ in range(6)]
    fresh = build_loader(client_corpus)
    fresh.load_state_dict(state)
    assert [as_lists(next(fresh)) for _ in range(6)] == expected


def test_the_component_token_counter_covers_every_document_token(client_corpus):
    def document_tokens(batch) -> int:  # what a packed row holds besides its pad tail
        return sum(len(r.payload["input_ids"]) - (r.meta.padding_length or 0) for r in batch.records)

    loader = build_loader(client_corpus)
    loader._convert = document_tokens  # noqa: SLF001 - the adapter's convert_batch hook
    total = sum(next(loader) for _ in range(20))
    assert sum(loader.component_tokens.values()) == total > 0
    assert set(loader.component_tokens) == {0, 1}


def test_an_adapter_owned_measure_primes_the_token_mixture(client_corpus):
    calls = []
    pipeline = create_source_pipeline(client_corpus, seed=7, dp_rank=0, dp_world_size=1,
                                      measure=lambda payload: calls.append(1) or len(payload["text"]) // 4)
    finalize_pipeline(encode_and_pack(pipeline, client_corpus), batch_size=2, seed=7, dp_rank=0, dp_world_size=1)
    next(AutoModelLoader(pipeline))
    assert calls and pipeline._ws.tokens_per_byte is not None  # noqa: SLF001


# ---------------------------------------------------------------------------- TP peers
def _peer_rank(rank: int, store: str, root: str, out: str) -> None:
    """Two ranks of one data-parallel group (tensor-parallel peers): same dp_group_id."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        loader = build_loader(Path(root), dp_rank=0, dp_world_size=1, world_size=2, global_rank=rank)
        head = [as_lists(next(loader)) for _ in range(3)]
        state = loader.state_dict()  # all-rank auxiliary state: both peers take part
        rest = [as_lists(next(loader)) for _ in range(4)]
        Path(out, f"peer{rank}.json").write_text(json.dumps({"head": head, "rest": rest, "state": state.hex()}))
    finally:
        dist.destroy_process_group()


def test_tensor_parallel_peers_get_identical_batches_and_the_same_merged_state(tmp_path, client_corpus):
    mp.spawn(_peer_rank, args=(str(tmp_path / "store"), str(client_corpus), str(tmp_path)), nprocs=2, join=True)
    peers = [json.loads((tmp_path / f"peer{r}.json").read_text()) for r in range(2)]
    assert peers[0]["head"] == peers[1]["head"] and peers[0]["rest"] == peers[1]["rest"]
    states = [bytes.fromhex(p["state"]) for p in peers]
    fresh = build_loader(client_corpus)
    fresh.load_state_dict(states[1])  # any rank's copy restores
    assert [as_lists(next(fresh)) for _ in range(4)] == peers[0]["rest"]
    from zephon_columnar.engine.checkpoint import parse_checkpoint

    assert sorted(parse_checkpoint(states[0]).lanes) == [0, 1] == sorted(parse_checkpoint(states[1]).lanes)
