"""Checkpoint aggregation across data-parallel ranks.

Each rank holds the state of its own lanes. ``checkpoint()`` on a multi-rank run merges them:
through ``torch.distributed`` (all_gather_object) when a process group is initialized, else
through a shared directory (``options(aggregate_dir=...)``): every rank writes its part, then
reads all parts once they are there. Iteration itself never needs either.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from zephon_columnar.engine.checkpoint.merge import merge_checkpoints
from zephon_columnar.errors import CheckpointError


def torch_distributed_ready() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return dist.is_available() and dist.is_initialized()


def gather_torch(local: Mapping[str, Any]) -> dict[str, Any]:
    import torch.distributed as dist

    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, dict(local))
    return merge_checkpoints(parts)


#: Clock skew tolerated between ranks writing to a shared directory.
CLOCK_SKEW_S = 2.0


def gather_directory(
    local: Mapping[str, Any],
    *,
    directory: str,
    run_id: str,
    round_id: int,
    part: str,
    parts_needed: int,
    lanes_needed: int,
    timeout_s: float,
    not_before: float,
) -> dict[str, Any]:
    """Write this rank's part as ``directory/run_id/round-N/<part>.json`` and merge every
    rank's once at least ``parts_needed`` parts are there and they hold all ``lanes_needed``
    lanes. Ranks name their part by ``global_rank`` when ``world_size`` is known, else by their
    data-parallel group (tensor-parallel peers then write the same part: either restores the
    same continuation).

    Parts written before ``not_before`` (this job's start, a wall-clock time) are left-overs of an
    earlier job that used the same ``run_id`` and are ignored; give each job its own run_id anyway.
    """
    round_dir = Path(directory) / run_id / f"round-{round_id:06d}"
    round_dir.mkdir(parents=True, exist_ok=True)
    tmp = round_dir / f".{part}.{os.getpid()}.json.tmp"
    tmp.write_text(json.dumps(local))
    os.replace(tmp, round_dir / f"{part}.json")
    deadline = time.monotonic() + timeout_s
    while True:
        paths = sorted(p for p in round_dir.glob("*.json") if _mtime(p) >= not_before - CLOCK_SKEW_S)
        if len(paths) >= parts_needed:
            parts = [json.loads(p.read_text()) for p in paths]
            if {int(lane) for part_ in parts for lane in part_.get("lanes", {})} >= set(range(lanes_needed)):
                return merge_checkpoints(parts)
        if time.monotonic() > deadline:
            have = sorted(p.stem for p in paths)
            raise CheckpointError(
                f"checkpoint aggregation in {round_dir}: waited {timeout_s:.0f}s for the parts of {parts_needed} "
                f"rank(s) holding all {lanes_needed} lanes, found {have}. Every rank must call checkpoint() at the "
                "same step (or raise aggregate_timeout_s)."
            )
        time.sleep(0.02)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:  # replaced by its writer between glob and stat
        return float("-inf")
