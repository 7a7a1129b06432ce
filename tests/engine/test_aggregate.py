"""Checkpoint merging across real ranks through torch.distributed (gloo, two processes)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import torch.distributed as dist
import torch.multiprocessing as mp

from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.testing import collect, signature


def build(world: int, rank: int) -> Pipeline:
    ds = Dataset.from_tables("a", [pa.table({"id": list(range(s * 40, s * 40 + 40))}) for s in range(2)])
    ws = StaticMixtureWorkSource([ds], {"a": 1.0}, chunk_size=8, seed=4)
    return Pipeline(ws).batch(2).options(runner="inline", canonical_replicas=2, world_size=world, global_rank=rank)


def _rank_main(rank: int, store: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        pipe = build(2, rank)
        it = iter(pipe)
        head = [signature(next(it)) for _ in range(3 + rank)]  # ranks at different depths
        ckpt = pipe.checkpoint()  # collective: every rank gets the merged checkpoint
        it.close()
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"ckpt": ckpt, "head": head}))
    finally:
        dist.destroy_process_group()


def test_checkpoint_is_merged_through_torch_distributed(tmp_path):
    mp.spawn(_rank_main, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2, join=True)
    r0 = json.loads((tmp_path / "rank0.json").read_text())
    r1 = json.loads((tmp_path / "rank1.json").read_text())
    assert r0["ckpt"] == r1["ckpt"]
    assert sorted(r0["ckpt"]["lanes"]) == ["0", "1"]
    # Resume everything on one rank: nothing skipped or repeated.
    resumed = build(1, 0)
    resumed.restore(r0["ckpt"])
    delivered = [tuple(json.loads(json.dumps(x))) for x in r0["head"] + r1["head"]]
    rest = [tuple(json.loads(json.dumps(x))) for x in collect(resumed)]
    everything = [tuple(json.loads(json.dumps(x))) for x in collect(build(1, 0))]
    assert sorted(delivered + rest) == sorted(everything)
