#!/usr/bin/env python3
"""zephon_columnar's Parquet reader alone: a sequential scan of <corpus>/pretok in 512-row takes
(what fetch does for the pretok job), in the main thread, in a worker thread, and in a worker
thread next to a busy second thread (numpy-bound or pure-Python), one mode per fresh process.
Shows what the threads runner's fetch worker pays next to the Python-heavy consumer and the
packing thread (GIL convoy, cache contention).

    PYTHONPATH=. .venv/bin/python benchmarks/decode_contention.py --corpus benchmarks/data/small --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

MODES = ("main", "thread", "thread_busy_numpy", "thread_busy_python")


def child(corpus: str, mode: str) -> dict:
    import numpy as np

    import zephon_columnar as Z

    ds = Z.Dataset.from_path("train", os.path.join(corpus, "pretok"))
    out: list = []

    def scan() -> None:
        r = ds.open_reader()
        t0, c0 = time.perf_counter(), time.thread_time()
        for sh in ds.shards:
            for s in range(0, sh.num_rows, 512):
                r.take(sh.shard_id, np.arange(s, min(sh.num_rows, s + 512)))
        out.append((time.perf_counter() - t0, time.thread_time() - c0, dict(getattr(r, "stats", {}))))

    p0 = time.process_time()
    if mode == "main":
        scan()
    else:
        t = threading.Thread(target=scan)
        t.start()
        if mode == "thread_busy_numpy":
            x = np.ones(1 << 20)
            while t.is_alive():
                x += 1.0
        elif mode == "thread_busy_python":
            while t.is_alive():
                sum(range(1000))
        t.join()
    wall, cpu, stats = out[0]
    return {"mode": mode, "scan_wall_ms": wall * 1e3, "scan_thread_cpu_ms": cpu * 1e3,
            "process_cpu_ms": (time.process_time() - p0) * 1e3, "reader_stats": stats}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "small"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--mode", choices=MODES)
    a = ap.parse_args()
    if a.mode:
        print(json.dumps(child(a.corpus, a.mode)))
        return
    runs = []
    for _ in range(a.reps):
        for m in MODES:
            r = subprocess.run([sys.executable, __file__, "--corpus", a.corpus, "--mode", m],
                               capture_output=True, text=True, check=True)
            d = json.loads(r.stdout.strip().splitlines()[-1])
            runs.append(d)
            print(f"{m:20s} scan wall {d['scan_wall_ms']:6.1f} ms, scan-thread CPU {d['scan_thread_cpu_ms']:6.1f} ms, "
                  f"process CPU {d['process_cpu_ms']:6.1f} ms", file=sys.stderr)
    print(json.dumps({"bench": "decode_contention", "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                      "corpus": a.corpus, "runs": runs}))


if __name__ == "__main__":
    main()
