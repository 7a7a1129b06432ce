#!/usr/bin/env python3
"""Issue 29: the hand-off from the pipeline to the device, side by side in one run.

The job is the prepacked one (``<corpus>/prepacked``: Parquet rows of exactly 2048 int32 ids ->
``StaticMixtureWorkSource(chunk_size=1024, seed=42)`` -> ``batch(8)``), converted with
``to_training(return_labels=True)``. Three parts, each as ratios measured in the same run:

  convert   per batch, on batches already made: ``to_training()`` (int64 built on the host: a copy
            and a widening), ``to_training(device=D)`` (int32 views of the Arrow buffers, moved and
            widened on D), and the DeviceLoader's host stage alone (``on_host``: views, no copy);
            against the bus limit: torch's own ``copy_`` of the same bytes from pinned memory to
            D (on the CPU: a host-to-host ``copy_``, the memory bandwidth). GB/s of token bytes.
  stall     the trainer's wait per step in ``next(loader)`` with a device-bound step of --step-ms
            (CUDA: ``torch.cuda._sleep`` on the GPU; CPU: ``time.sleep``, the CPU free as while
            a GPU computes): the loader's host tensors moved by hand (``{k: v.to(D)}``, what a
            user writes) against ``to_torch_loader(device=D, prefetch=2)``; 0 and 2 workers.
  first     the first batch of each loader (from building it).

Usage (from the repository root):

    PYTHONPATH=. .venv/bin/python benchmarks/handoff.py --corpus benchmarks/data/large --out benchmarks/results/handoff.jsonl

D is ``cuda`` when torch sees one, else ``cpu``. Prints a table to stderr and one JSON line to
stdout (and --out).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.training import TrainingOptions

BATCH = 8


def pipeline(corpus: Path) -> Pipeline:
    ds = Dataset.from_path("train", str(corpus / "prepacked"))
    return Pipeline(StaticMixtureWorkSource([ds], {"train": 1.0}, seed=42, chunk_size=1024)).batch(BATCH)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, reps: int, device: torch.device) -> float:
    """Median seconds of ``fn()`` over ``reps`` calls (each synchronized with the device)."""
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def convert(corpus: Path, device: torch.device, batches: int, reps: int) -> dict:
    """Per-batch conversion cost of each way, and the bus limit for the same bytes."""
    made = []
    for batch in pipeline(corpus):
        made.append(batch)
        if len(made) == batches:
            break
    host = TrainingOptions(return_labels=True)
    moved = TrainingOptions(return_labels=True, device=device)
    ways = {
        "host_int64": lambda b: b.to_training_with(host),
        "device_int32_widened_there": lambda b: b.to_training_with(moved),
        "host_stage_views": lambda b: b.to_training_with(moved, on_host=True),
    }
    token_bytes = BATCH * 2048 * 4  # int32 ids of one batch
    source = torch.empty(BATCH * 2048, dtype=torch.int32, pin_memory=device.type == "cuda")
    target = torch.empty(BATCH * 2048, dtype=torch.int32, device=device)
    out = {"token_bytes_per_batch": token_bytes}
    for _ in range(2):  # warm every way first, then measure in turn
        for way in ways.values():
            for b in made[:3]:
                way(b)
    for name, way in ways.items():
        per = statistics.median(timed(lambda b=b: way(b), reps, device) for b in made)
        out[name] = {"us_per_batch": per * 1e6, "token_gb_s": token_bytes / per / 1e9}
    limit = timed(lambda: target.copy_(source, non_blocking=True), reps * len(made), device)
    out["bus_limit_copy"] = {"us_per_batch": limit * 1e6, "token_gb_s": token_bytes / limit / 1e9}
    for name in ways:
        out[name]["x_of_limit_time"] = out[name]["us_per_batch"] / out["bus_limit_copy"]["us_per_batch"]
    return out


def device_step(device: torch.device, seconds: float) -> None:
    """A step that keeps the device busy for ``seconds`` and leaves the host free."""
    if device.type == "cuda":
        torch.cuda._sleep(int(seconds * 1.4e9))  # about 1.4 GHz of GPU cycles; an approximate length
    else:
        time.sleep(seconds)


def stall(corpus: Path, device: torch.device, way: str, workers: int, steps: int, step_s: float) -> dict:
    """The trainer's wait in next() per step, and the first batch, for one way of handing over."""
    start = time.perf_counter()
    timeout = 300 if workers else 0
    if way == "by_hand":
        loader = pipeline(corpus).to_torch_loader(num_workers=workers, timeout=timeout, return_labels=True)
    else:
        loader = pipeline(corpus).to_torch_loader(
            num_workers=workers, timeout=timeout, return_labels=True, device=device, prefetch=2
        )
    batches = iter(loader)
    waits = []
    first = None
    for _ in range(steps):
        before = time.perf_counter()
        tensors = next(batches)
        if way == "by_hand":
            tensors = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in tensors.items()}
            tensors["input_ids"].sum()  # the first use of the batch, on the trainer's stream
        else:
            tensors["input_ids"].sum()
        waits.append(time.perf_counter() - before)
        if first is None:
            synchronize(device)
            first = time.perf_counter() - start
        device_step(device, step_s)
    synchronize(device)
    del batches
    waits = waits[3:]  # the first steps fill the workers and the ring
    return {
        "first_batch_s": first,
        "stall_ms_median": statistics.median(waits) * 1e3,
        "stall_ms_p90": sorted(waits)[int(0.9 * (len(waits) - 1))] * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--batches", type=int, default=24, help="batches the convert part measures")
    parser.add_argument("--reps", type=int, default=15, help="calls per batch in the convert part")
    parser.add_argument("--steps", type=int, default=60, help="steps per loader in the stall part")
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3, help="stall rounds (the ways interleaved)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    result: dict = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "corpus": str(args.corpus),
        "step_ms": args.step_ms,
        "convert": convert(args.corpus, device, args.batches, args.reps),
        "stall": [],
    }
    for round_ in range(args.rounds):
        for workers in (0, 2):
            ways = ("by_hand", "device_loader") if round_ % 2 == 0 else ("device_loader", "by_hand")
            for way in ways:
                figures = stall(args.corpus, device, way, workers, args.steps, args.step_ms / 1e3)
                result["stall"].append({"round": round_, "workers": workers, "way": way, **figures})
                print(f"round {round_} workers={workers} {way}: {figures}", file=sys.stderr)
    summary = {}
    for workers in (0, 2):
        for way in ("by_hand", "device_loader"):
            rows = [r for r in result["stall"] if r["workers"] == workers and r["way"] == way]
            summary[f"{way}_w{workers}"] = {
                key: statistics.median(r[key] for r in rows) for key in ("first_batch_s", "stall_ms_median", "stall_ms_p90")
            }
    result["stall_summary"] = summary
    for name, figures in result["convert"].items():
        print(f"{name}: {figures}", file=sys.stderr)
    for name, figures in summary.items():
        print(f"{name}: {figures}", file=sys.stderr)
    line = json.dumps(result)
    print(line)
    if args.out:
        with args.out.open("a") as out:
            out.write(line + "\n")


if __name__ == "__main__":
    main()
