#!/usr/bin/env python3
"""Same input order, same packing? zephon_columnar and Zephon 0.2.0 pack the pre-tokenized
corpus with shard shuffling off (both then read shards in ascending order, rows in file order,
so the two libraries see the same document stream), and this compares their batches one by one.

  pretok -> StaticMixtureWorkSource(chunk_size=1024, seed=42, shuffle_shards=False)
         -> pack_flat(2048, ALGORITHM[, num_bins=16], pad_token_id=0) -> batch(8) -> to_training

Prints one JSON line per algorithm: batches and real tokens of each library, packing efficiency
(real / emitted tokens), how many leading batches are identical (token ids and padding mask),
and the first batch that differs. Zephon drops a pass's last partial chunk and we deliver it
(docs/guarantees.md), so only the tail may differ. Usage (repo root):

  PYTHONPATH=. .venv/bin/python benchmarks/pack_parity.py --corpus benchmarks/data/large
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ALGORITHMS = ("first_fit", "best_fit", "best_fit_wrap", "wrap")


def child(module: str, corpus: str, algorithm: str) -> None:
    import numpy as np
    import torch  # noqa: F401

    Z = __import__(module)
    ds = Z.Dataset.from_path("train", os.path.join(corpus, "pretok"))
    ws = Z.StaticMixtureWorkSource(datasets=[ds], mixture=Z.MixtureSpec({"train": 1.0}), seed=42,
                                   chunk_size=1024, shuffle_shards=False)
    bins = {"num_bins": 16} if algorithm in ("first_fit", "best_fit") else {}
    pad = {} if algorithm == "wrap" else {"pad_token_id": 0}
    pipe = Z.Pipeline(ws).pack_flat(max_length=2048, algorithm=algorithm, **bins, **pad).batch(8)
    hashes, tokens, batches = [], 0, 0
    for b in pipe:
        tr = b.to_training(return_padding_mask=True)
        ids = tr["input_ids"].numpy()
        mask = tr["padding_mask"].numpy() if tr.get("padding_mask") is not None else np.zeros(ids.shape, bool)
        hashes.append(hashlib.sha1(ids.tobytes() + mask.tobytes()).hexdigest()[:16])
        tokens += int(ids.size - mask.sum())
        batches += 1
    print(json.dumps({"batches": batches, "tokens": tokens, "efficiency": tokens / (batches * 8 * 2048),
                      "hashes": hashes}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--algorithms", default=",".join(ALGORITHMS))
    ap.add_argument("--z-python", default=str(REPO / "benchmarks/.venv-zephon/bin/python"))
    ap.add_argument("--zc-python", default=sys.executable)
    ap.add_argument("--child", choices=("zephon", "zephon_columnar"))
    ap.add_argument("--algorithm")
    a = ap.parse_args()
    if a.child:
        child(a.child, a.corpus, a.algorithm)
        return
    env = dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH", str(REPO)))
    for algorithm in a.algorithms.split(","):
        out = {}
        for module, py in (("zephon_columnar", a.zc_python), ("zephon", a.z_python)):
            res = subprocess.run([py, __file__, "--child", module, "--corpus", a.corpus, "--algorithm", algorithm],
                                 capture_output=True, text=True, env=env, timeout=1800)
            if res.returncode != 0:
                sys.exit(f"{module} {algorithm} failed:\n{res.stderr[-2000:]}")
            out[module] = json.loads(res.stdout.strip().splitlines()[-1])
        ours, theirs = out["zephon_columnar"]["hashes"], out["zephon"]["hashes"]
        same = next((i for i, (x, y) in enumerate(zip(ours, theirs)) if x != y), min(len(ours), len(theirs)))
        print(json.dumps({
            "algorithm": algorithm,
            **{f"{k}_{m}": out[m][k] for m in out for k in ("batches", "tokens")},
            "efficiency_ours": round(out["zephon_columnar"]["efficiency"], 5),
            "efficiency_zephon": round(out["zephon"]["efficiency"], 5),
            "identical_leading_batches": same,
            "first_difference": same if same < max(len(ours), len(theirs)) else None,
        }))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
