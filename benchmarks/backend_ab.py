"""The text job with tokenize(backend=...) "auto" and "tokenizers" in alternating fresh processes:
first batch and throughput of each, side by side (issue 27: the fastokens backend must not make
the first batch slower).

    PYTHONPATH=. .venv/bin/python benchmarks/backend_ab.py --corpus benchmarks/data/small \\
        --tokenizer benchmarks/data/tok32k --pairs 7 > benchmarks/results/backend_ab.jsonl

Job: Parquet text -> tokenize(special_tokens="eos", parallelism=2) -> pack_flat(2048, wrap) ->
batch(8) -> to_training, as in ../shared/bench/compare.py. Timed from after ``import torch``.
Prints one JSON line per run, then a summary line (medians).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import warnings

BACKENDS = ("auto", "tokenizers")


def child(corpus: str, tokenizer: str, backend: str) -> dict:
    import zephon_columnar as Z
    import torch  # noqa: F401  # a training script has torch loaded before its loader runs

    warnings.simplefilter("ignore")  # the end-of-pass drop notices
    t0, c0 = time.perf_counter(), time.process_time()
    ds = Z.Dataset.from_path("train", os.path.join(corpus, "parquet"))
    ws = Z.StaticMixtureWorkSource(datasets=[ds], mixture=Z.MixtureSpec({"train": 1.0}), seed=42, chunk_size=1024)
    pipe = (Z.Pipeline(ws).tokenize(tokenizer_id=tokenizer, field="text", special_tokens="eos",
                                     add_attention_mask=False, parallelism=2, backend=backend)
            .pack_flat(max_length=2048, algorithm="wrap").batch(8))
    tokens, first = 0, None
    for batch in pipe:
        tokens += int(batch.to_training()["input_ids"].numel())
        if first is None:
            first = time.perf_counter() - t0
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"backend": backend, "tokens": tokens, "tokens_per_s": tokens / wall, "first_batch_ms": first * 1e3,
            "cpu_s_per_mtok": cpu / (tokens / 1e6),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--child", choices=BACKENDS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.corpus, a.tokenizer, a.child)))
        return
    runs: dict[str, list[dict]] = {b: [] for b in BACKENDS}
    for _ in range(a.pairs):
        for backend in BACKENDS:
            out = subprocess.run([sys.executable, __file__, "--corpus", a.corpus, "--tokenizer", a.tokenizer,
                                  "--child", backend], capture_output=True, text=True, check=True)
            run = json.loads(out.stdout.strip().splitlines()[-1])
            runs[backend].append(run)
            print(json.dumps(run), flush=True)
    print(json.dumps({"summary": {b: {k: round(statistics.median(r[k] for r in rs), 3)
                                      for k in ("tokens_per_s", "first_batch_ms", "cpu_s_per_mtok", "peak_rss_mb")}
                                  for b, rs in runs.items()}, "pairs": a.pairs, "corpus": a.corpus}))


if __name__ == "__main__":
    main()
