#!/usr/bin/env python3
"""What a checkpoint costs as the job grows: a real ``torch.distributed`` (gloo) world of N
rank processes on this host, each with a ``to_torch_loader(num_workers=W)`` stateful loader.

Per rank: the time of ``loader.state_dict()`` (the workers' parts merged, then every rank's
gathered over the process group: the collective), of ``Pipeline.checkpoint()`` without loader
workers (the same gather), of one worker snapshot (what torchdata asks of a worker after each
batch: `WorkerState` with its lanes' checkpoint, digest included), and the size of what each
rank keeps (the state as JSON, and as zstandard bytes). Medians over ``--repeat`` calls, after
``--steps`` batches. One JSON line per world size.

  .venv/bin/python benchmarks/loader_state.py --ranks 2 4 8 16 --lanes-per-rank 4 --workers 2 \\
      > benchmarks/results/loader_state.jsonl
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def build(lanes: int, world: int) -> Any:
    import pyarrow as pa

    from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource

    shards = [pa.table({"input_ids": [[i, i + 1, i + 2, i + 3]] * 1}) for i in range(64)]
    ds = Dataset.from_tables("a", [pa.concat_tables([t] * 512) for t in shards])
    ws = StaticMixtureWorkSource([ds], {"a": 1.0}, chunk_size=16, seed=1, stop_after_passes=None)
    return (
        Pipeline(ws)
        .pack_flat(32, algorithm="wrap")
        .batch(2)
        .options(canonical_replicas=lanes, dp_degree=world, runner="inline")
    )


def _rank(rank: int, world: int, port: int, lanes: int, workers: int, steps: int, repeat: int, out: str) -> None:
    import torch.distributed as dist

    from zephon_columnar.engine.checkpoint import checkpoint_bytes

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        result: dict[str, Any] = {}
        loader = build(lanes, world).to_torch_loader(
            num_workers=workers, loader="stateful", raw_batches=True, multiprocessing_context="fork"
        )
        it = iter(loader)
        for _ in range(steps):
            next(it)
        times = []
        for _ in range(repeat):
            dist.barrier()
            start = time.perf_counter()
            state = loader.state_dict()
            times.append(time.perf_counter() - start)
        result["loader_state_dict_s"] = statistics.median(times)
        text = json.dumps(state)
        result["loader_state_json_bytes"] = len(text)
        whole = state["zephon_columnar"]["checkpoint"]
        result["whole_checkpoint_zstd_bytes"] = len(checkpoint_bytes(whole))
        del it
        # One worker snapshot, as torchdata asks a worker after each batch (timed in this process:
        # the dataset's worker path, on a share of the rank's lanes).
        pipe = build(lanes, world)
        ds = pipe.to_torch_dataset()
        share = ds.session.for_lanes(ds.session.rank_lanes()[: max(1, len(ds.session.rank_lanes()) // workers)])
        run = iter(share)
        for _ in range(steps):
            next(run)
        snaps = []
        for _ in range(repeat):
            start = time.perf_counter()
            share.checkpoint(collective=False)
            snaps.append(time.perf_counter() - start)
        result["worker_snapshot_s"] = statistics.median(snaps)
        run.close()
        # Pipeline.checkpoint() with no loader workers: the rank's engine, gathered the same way.
        it2 = iter(pipe)
        for _ in range(steps):
            next(it2)
        plain = []
        for _ in range(repeat):
            dist.barrier()
            start = time.perf_counter()
            pipe.checkpoint()
            plain.append(time.perf_counter() - start)
        result["pipeline_checkpoint_s"] = statistics.median(plain)
        it2.close()
        Path(out, f"{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def merge_model(lane_counts: list[int], lanes_per_rank: int) -> None:
    """What one rank does with the gathered parts, in one process (no contention): merge
    ``lanes / lanes_per_rank`` rank parts of ``lanes`` lanes in all, and the size of the whole."""
    from zephon_columnar.engine.checkpoint import checkpoint_bytes, merge_checkpoints

    for lanes in lane_counts:
        world = lanes // lanes_per_rank
        pipe = build(lanes, 1)
        it = iter(pipe)
        for _ in range(lanes):  # every lane past its first item
            next(it)
        whole = pipe.checkpoint()
        it.close()
        parts = [
            dict(whole, lanes={k: v for k, v in whole["lanes"].items() if int(k) // lanes_per_rank == r})
            for r in range(world)
        ]
        start = time.perf_counter()
        merged = merge_checkpoints(parts)
        took = time.perf_counter() - start
        row = {
            "merge_model": True,
            "lanes": lanes,
            "ranks": world,
            "merge_s": took,
            "merge_us_per_lane": took / lanes * 1e6,
            "whole_json_bytes": len(json.dumps(merged)),
            "whole_zstd_bytes": len(checkpoint_bytes(merged)),
            "part_json_bytes": len(json.dumps(parts[0])),
        }
        print(json.dumps(row), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--lanes-per-rank", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--merge-model",
        type=int,
        nargs="*",
        metavar="LANES",
        help="instead: merge time and whole size for these lane counts, in one process",
    )
    args = parser.parse_args()
    if args.merge_model:
        merge_model(args.merge_model, args.lanes_per_rank)
        return
    ctx = mp.get_context("spawn")
    for world in args.ranks:
        lanes = world * args.lanes_per_rank
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with tempfile.TemporaryDirectory() as out:
            started = time.perf_counter()
            procs = [
                ctx.Process(target=_rank, args=(r, world, port, lanes, args.workers, args.steps, args.repeat, out))
                for r in range(world)
            ]
            for p in procs:
                p.start()
            for p in procs:
                p.join(timeout=600)
            if any(p.exitcode != 0 for p in procs):
                sys.exit(f"world {world}: exit codes {[p.exitcode for p in procs]}")
            ranks = [json.loads(Path(out, f"{r}.json").read_text()) for r in range(world)]
        row = {
            "ranks": world,
            "lanes": lanes,
            "workers_per_rank": args.workers,
            "wall_s": time.perf_counter() - started,
        }
        for key in ranks[0]:
            values = [r[key] for r in ranks]
            row[key] = {"median": statistics.median(values), "max": max(values)}
        print(json.dumps(row), flush=True)
        print(
            f"ranks {world}: loader.state_dict() {row['loader_state_dict_s']['median'] * 1e3:.1f} ms, "
            f"state {row['loader_state_json_bytes']['median'] / 1e3:.1f} KB",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main()
