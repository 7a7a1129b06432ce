"""How the driver's ordered stages scale with lanes (the Ray sizing model, docs/concepts.md).

The ordered stages (packing, batching; shuffle, ensure_mixture when present) run on the driver,
in the thread that iterates, whatever the runner: with the stateless stages on a Ray cluster
they are what is left on the training node. This measures that part alone: the pre-tokenized
job (``<corpus>/pretok``: token ids read, packed, batched; no tokenizer), with the consumer
thread's CPU time (``time.thread_time``: the ordered stages and the batch cut, not the fetch
worker) per million tokens, for 1..16 lanes (``canonical_replicas``) and two packers.

    Z.Pipeline(ws).pack_flat(2048, algorithm=A, num_bins=16 for best_fit).batch(8)
        .options(runner="threads", canonical_replicas=LANES)
    for b in p: b.to_training(return_padding_mask=True)

Fresh process per variant, interleaved rounds; one JSON line per run (stdout and --out).

    PYTHONPATH=. .venv/bin/python benchmarks/driver_lanes.py --corpus benchmarks/data/small --rounds 3 \\
        --out benchmarks/results/driver_lanes.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from _child import interleaved_rounds, run_child

L, B = 2048, 8


def child(a: argparse.Namespace) -> dict:
    import torch  # noqa: F401  # a training script has torch loaded before its loader runs

    import zephon_columnar as Z

    t0 = time.perf_counter()
    c0 = time.thread_time()
    ds = Z.Dataset.from_path("train", os.path.join(a.corpus, "pretok"))
    ws = Z.StaticMixtureWorkSource(datasets=[ds], mixture=Z.MixtureSpec({"train": 1.0}), seed=42, chunk_size=1024)
    bins = {"num_bins": 16} if a.algorithm == "best_fit" else {}
    p = (Z.Pipeline(ws).pack_flat(L, algorithm=a.algorithm, pad_token_id=0, **bins).batch(B)
         .options(runner="threads", canonical_replicas=a.lane_count))
    tokens = 0
    for b in p:
        tr = b.to_training(return_padding_mask=True)
        pad = tr.get("padding_mask")  # True where a position is padding
        tokens += tr["input_ids"].numel() - (int(pad.sum()) if pad is not None else 0)
    wall = time.perf_counter() - t0
    driver_cpu = time.thread_time() - c0
    return {"lanes": a.lane_count, "algorithm": a.algorithm, "tokens": tokens, "seconds": wall,
            "tokens_per_s": tokens / wall, "driver_cpu_s": driver_cpu,
            "driver_cpu_s_per_mtok": driver_cpu / (tokens / 1e6),
            "driver_tokens_per_cpu_s": tokens / driver_cpu}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lanes", default="1,2,4,8,16")
    ap.add_argument("--algorithms", default="wrap,best_fit")
    ap.add_argument("--out", default="")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--lane-count", type=int, default=1, help=argparse.SUPPRESS)  # a child's one lane count
    ap.add_argument("--algorithm", default="wrap")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a)))
        return
    if not Path(a.corpus, "pretok").is_dir():
        raise SystemExit(f"{a.corpus}/pretok is missing: benchmarks/README.md, setup step 2, writes it")
    variants = [(n, alg) for alg in a.algorithms.split(",") for n in map(int, a.lanes.split(","))]
    me = str(Path(__file__).resolve())
    interleaved_rounds(variants, a.rounds,
                       lambda v: run_child(me, sys.executable, ["--corpus", a.corpus, "--lane-count", str(v[0]),
                                                                "--algorithm", v[1]], timeout=1800),
                       corpus=a.corpus, out=a.out)


if __name__ == "__main__":
    main()
