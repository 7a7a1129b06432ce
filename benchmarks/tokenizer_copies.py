#!/usr/bin/env python3
"""Why two tokenize workers cost more CPU than one: encode_batch_fast over the corpus (calls of
1,024 docs, as limit.py) in four arrangements, one fresh process each, interleaved in rounds:

  serial        one thread, one Tokenizer (what limit.py does)
  alternating   one thread, two Tokenizer copies used for alternate calls (two BPE caches, no
                concurrency: isolates the cache effect)
  two_copies    two Python threads, each with its own Tokenizer, alternate calls, concurrently
                (what zephon_columnar's threads runner does with 2 workers: one copy per worker)
  shared        two Python threads sharing one Tokenizer, concurrently

Env RAYON_NUM_THREADS=2, TOKENIZERS_PARALLELISM=true. Prints one JSON line: per round wall and
CPU seconds, and medians of the ratios to `serial` within each round.

    .venv/bin/python benchmarks/tokenizer_copies.py --corpus benchmarks/data/small --rounds 5
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODES = ("serial", "alternating", "two_copies", "shared")
CHUNK = 1024


def child(a) -> dict:
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer

    texts: list[str] = []
    for f in sorted(glob.glob(os.path.join(a.corpus, "parquet", "*.parquet"))):
        texts.extend(pq.read_table(f, columns=["text"]).column("text").to_pylist())
    js = (Path(a.tokenizer) / "tokenizer.json").read_text()
    toks = [Tokenizer.from_str(js) for _ in range(2)]
    chunks = [texts[i:i + CHUNK] for i in range(0, len(texts), CHUNK)]
    n_tok = [0, 0]
    t0, c0 = time.perf_counter(), time.process_time()
    if a.mode in ("serial", "alternating"):
        for i, c in enumerate(chunks):
            tok = toks[i % 2] if a.mode == "alternating" else toks[0]
            n_tok[0] += sum(len(e.ids) for e in tok.encode_batch_fast(c, add_special_tokens=False))
    else:
        def work(w: int) -> None:
            tok = toks[w] if a.mode == "two_copies" else toks[0]
            for c in chunks[w::2]:
                n_tok[w] += sum(len(e.ids) for e in tok.encode_batch_fast(c, add_special_tokens=False))

        ths = [threading.Thread(target=work, args=(w,)) for w in range(2)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"mode": a.mode, "tokens": sum(n_tok), "wall_s": wall, "cpu_s": cpu}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=str(HERE / "data" / "small"))
    ap.add_argument("--tokenizer", default=str(HERE / "data" / "tok32k"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mode", choices=MODES)
    a = ap.parse_args()
    if a.mode:
        print(json.dumps(child(a)))
        return
    env = dict(os.environ, RAYON_NUM_THREADS="2", TOKENIZERS_PARALLELISM="true")
    rounds = []
    for r in range(a.rounds):
        res = {}
        order = MODES[r % 4:] + MODES[:r % 4]
        for m in order:
            out = subprocess.run([sys.executable, __file__, "--mode", m, "--corpus", a.corpus, "--tokenizer",
                                  a.tokenizer], env=env, capture_output=True, text=True, check=True)
            res[m] = json.loads(out.stdout.strip().splitlines()[-1])
        rounds.append(res)
        print(f"[round {r}] " + ", ".join(f"{m} wall {v['wall_s']:.2f} cpu {v['cpu_s']:.2f}" for m, v in res.items()),
              file=sys.stderr)
    summary = {}
    for m in MODES[1:]:
        for f in ("wall_s", "cpu_s"):
            vals = [r[m][f] / r["serial"][f] for r in rounds]
            summary[f"{m}_over_serial_{f}"] = {"per_round": [round(v, 3) for v in vals],
                                               "median": round(statistics.median(vals), 3)}
    print(json.dumps({"bench": "tokenizer_copies", "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                      "corpus": a.corpus, "rounds": rounds, "summary": summary}))


if __name__ == "__main__":
    main()
