"""The process runner on a GIL-bound job, tried as a new user would.

A pure-Python ``map_transform`` (character filtering: keep letters, digits and whitespace of
each document) over the text corpus -> ``batch(64)``, one pass; rows/s from after ``import
torch`` and the library import to the last batch, and the first batch. Variants, fresh
processes, interleaved rounds:

- ours: ``runner="inline"``, ``"threads"`` and ``"process"`` with ``map_transform(...,
  parallelism=2)``;
- Zephon 0.2.0 (``--z-python``): the same three.

    .venv/bin/python benchmarks/process_runner.py --corpus benchmarks/data/small \\
        --z-python benchmarks/.venv-zephon/bin/python --rounds 3 --out results/x.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

from _child import interleaved_rounds, run_child


def keep_words(payload: dict) -> dict:
    """The GIL-bound user function: a pure-Python pass over every character."""
    text = payload["text"]
    return {"id": payload["id"], "text": "".join(ch for ch in text if ch.isalnum() or ch.isspace())}


def child(a: argparse.Namespace) -> dict:
    import importlib

    import torch  # noqa: F401  # a training script has torch loaded before its loader runs

    Z = importlib.import_module(a.module)
    t0 = time.perf_counter()
    ds = Z.Dataset.from_path("train", os.path.join(a.corpus, "parquet"))
    ws = Z.StaticMixtureWorkSource(datasets=[ds], mixture=Z.MixtureSpec({"train": 1.0}), seed=42, chunk_size=1024)
    p = Z.Pipeline(ws).map_transform(keep_words, parallelism=2).batch(64, drop_last=False)
    p.options(runner=a.runner)
    rows = chars = 0
    first = None
    for b in p:
        for r in b.records:
            rows += 1
            chars += len(r.payload["text"])
        if first is None:
            first = time.perf_counter() - t0
    wall = time.perf_counter() - t0
    return {"module": a.module, "runner": a.runner, "rows": rows, "chars": chars, "seconds": wall,
            "rows_per_s": rows / wall, "first_batch_s": first,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def warm_page_cache(corpus: str) -> None:
    """Read the corpus files once, so no variant pays for disk reads the other did not (this VM's
    page cache is evicted between runs)."""
    folder = Path(corpus, "parquet")
    for path in sorted(folder.glob("*.parquet")):
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass


def run(python: str, args: list[str]) -> dict:
    warm_page_cache(args[args.index("--corpus") + 1])
    return run_child(str(Path(__file__).resolve()), python, args, timeout=3600)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--z-python", default="")
    ap.add_argument("--zc-python", default=sys.executable)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runners", default="inline,threads,process")
    ap.add_argument("--out", default="")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--module", default="zephon_columnar")
    ap.add_argument("--runner", default="inline")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a)))
        return
    variants = [(a.zc_python, "zephon_columnar", r) for r in a.runners.split(",")]
    if a.z_python:
        variants += [(a.z_python, "zephon", r) for r in a.runners.split(",")]
    interleaved_rounds(variants, a.rounds,
                       lambda v: run(v[0], ["--corpus", a.corpus, "--module", v[1], "--runner", v[2]]),
                       corpus=a.corpus, out=a.out)


if __name__ == "__main__":
    main()
