"""A training loop that holds the GIL: how long does the trainer wait in ``next()``?

The text job (``tokenize -> pack_flat(2049, wrap) -> batch(8)``) feeds a loop whose step is a
pure-Python busy loop of a fixed length (the GIL held throughout, as Python-side training code
holds it). The step is sized so the trainer needs about half the loader's throughput measured
alone, so a loader that kept its speed would never make the trainer wait. Per step we time the
``next()`` call (the stall) and the busy loop; variants run in fresh processes, torch imported
first, each variant once per round, rounds interleaved:

- ours: ``inline``, ``threads``, ``mtp`` (``options(mtp_mode=True)``, threads inside);
- Zephon 0.2.0 (``--z-python``): ``threads`` and ``mtp``.

Two step sizes: ``ours`` (half of our threads runner's solo rate) and ``zephon`` (half of
Zephon's threads runner's solo rate, so Zephon is measured where it could keep up too).

    .venv/bin/python benchmarks/gil_trainer.py --corpus benchmarks/data/small \\
        --tokenizer benchmarks/data/tok32k --z-python benchmarks/.venv-zephon/bin/python --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from _child import run_child

L, B = 2049, 8


def busy(seconds: float) -> None:
    """Hold the GIL for ``seconds``: pure-Python work, no call that releases it."""
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


def child(a: argparse.Namespace) -> dict:
    import importlib

    import torch  # noqa: F401  # a training script has torch loaded before its loader runs

    Z = importlib.import_module(a.module)
    t0 = time.perf_counter()
    ds = Z.Dataset.from_path("train", os.path.join(a.corpus, "parquet"))
    ws = Z.StaticMixtureWorkSource(datasets=[ds], mixture=Z.MixtureSpec({"train": 1.0}), seed=42, chunk_size=1024,
                                   exhausted_policy="repeat")
    p = (Z.Pipeline(ws).tokenize(tokenizer_id=a.tokenizer, field="text", special_tokens="eos",
                                 add_attention_mask=False, parallelism=2)
         .pack_flat(max_length=L, algorithm="wrap").batch(B))
    runner = "threads" if a.variant == "mtp" else a.variant
    p.options(runner=runner, mtp_mode=a.variant == "mtp")
    it = iter(p)
    next(it).to_training()
    first = time.perf_counter() - t0
    for _ in range(a.warmup):
        next(it).to_training()
        busy(a.step_s)
    stalls, convert = [], []
    w0 = time.perf_counter()
    for _ in range(a.steps):
        s = time.perf_counter()
        batch = next(it)
        m = time.perf_counter()
        batch.to_training(return_labels=True)
        e = time.perf_counter()
        stalls.append(m - s)
        convert.append(e - m)
        busy(a.step_s)
    wall = time.perf_counter() - w0
    close = getattr(it, "close", None)
    if close is not None:
        close()
    stalls.sort()
    return {"module": a.module, "variant": a.variant, "step_s": a.step_s, "steps": a.steps,
            "first_batch_s": first, "batches_per_s": a.steps / wall,
            "stall_median_s": statistics.median(stalls), "stall_p90_s": stalls[int(0.9 * (len(stalls) - 1))],
            "stall_mean_s": statistics.fmean(stalls), "to_training_median_s": statistics.median(convert),
            "stall_share_of_step": statistics.median(stalls) / a.step_s if a.step_s else None}


def run(python: str, args: list[str]) -> dict:
    return run_child(str(Path(__file__).resolve()), python, args)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--z-python", default="")
    ap.add_argument("--zc-python", default=sys.executable)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--out", default="")
    # child arguments
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--module", default="zephon_columnar")
    ap.add_argument("--variant", default="threads", choices=["inline", "threads", "mtp"])
    ap.add_argument("--step-s", type=float, default=0.0)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a)))
        return
    base = ["--corpus", a.corpus, "--tokenizer", a.tokenizer, "--warmup", str(a.warmup)]
    lines = []

    def record(row: dict, **tags) -> None:
        row.update(tags)
        lines.append(row)
        print(json.dumps(row), flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(row) + "\n")

    # Solo rates (step 0) size the two steps.
    solo = run(a.zc_python, base + ["--steps", "200", "--variant", "threads"])
    record(solo, size="solo")
    steps = {"ours": 2 / solo["batches_per_s"]}
    if a.z_python:
        zsolo = run(a.z_python, base + ["--steps", "60", "--variant", "threads", "--module", "zephon"])
        record(zsolo, size="solo")
        steps["zephon"] = 2 / zsolo["batches_per_s"]
    variants = [("ours", a.zc_python, "zephon_columnar", v) for v in ("inline", "threads", "mtp")]
    if a.z_python:
        variants += [("zephon", a.z_python, "zephon", v) for v in ("threads", "mtp")]
    for rnd in range(a.rounds):
        for size, step_s in steps.items():
            n = a.steps if size == "ours" else max(30, a.steps // 3)
            for who, python, module, variant in variants:
                row = run(python, base + ["--steps", str(n), "--variant", variant, "--module", module,
                                          "--step-s", f"{step_s:.6f}"])
                record(row, size=size, round=rnd, who=who)


if __name__ == "__main__":
    main()
