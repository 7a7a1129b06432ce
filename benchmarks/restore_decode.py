#!/usr/bin/env python3
"""What the first batch after a best_fit_wrap restore costs to read, in fresh processes (issue 7).

The pretok_bfw checkpoint of `restore.py` (small corpus, 150 batches) holds its next batch by
reference: 21 documents in shards 2, 3, 4 and 7, i.e. 5 Parquet row groups of ~535k int32 ids
(one data page each). A cold start's first batch needs one row group. This script decodes, in a
fresh process after ``import torch`` (the clock after one warm-up decode of another shard, as
the engine has decoded before it restores nothing), those groups:

  seq      ``read_row_groups`` one shard after another (what the reader does)
  par      the same on two threads (two cores; Arrow releases the GIL)
  prefix   ``iter_batches`` up to the last needed row of each group only
  mmap     ``seq`` with the files memory-mapped
  one      a single row group (what a cold start decodes)

Usage (repo root): ``.venv/bin/python benchmarks/restore_decode.py --rounds 8`` prints one JSON
line: per mode the milliseconds of each round and their median.
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

MODES = ("seq", "par", "prefix", "mmap", "one")
# (shard, row groups, last needed row) of the restored batch's documents
NEEDED = ((2, [0], 396), (3, [0, 1], 726), (4, [1], 758), (7, [0], 354))


def child(mode: str, corpus: str) -> float:
    import torch  # noqa: F401  (a training script has it imported)
    import pyarrow.parquet as pq
    from concurrent.futures import ThreadPoolExecutor

    files = sorted(glob.glob(str(Path(corpus) / "pretok" / "*.parquet")))

    def decode(job: tuple[int, list[int], int]) -> int:
        shard, groups, last = job
        f = pq.ParquetFile(files[shard], pre_buffer=False, memory_map=(mode == "mmap"))
        if mode == "prefix":
            first_row = sum(f.metadata.row_group(g).num_rows for g in range(groups[0]))
            return next(f.iter_batches(batch_size=last + 1 - first_row, row_groups=groups, use_threads=False)).num_rows
        return f.read_row_groups(groups, use_threads=False).num_rows

    decode((0, [0], 0))  # code paths warm, as in a restored process
    jobs = NEEDED[:1] if mode == "one" else NEEDED
    t0 = time.perf_counter()
    if mode == "par":
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(decode, [jobs[1], jobs[3], jobs[0], jobs[2]]))
    else:
        for job in jobs:
            decode(job)
    return (time.perf_counter() - t0) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default="benchmarks/data/small")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--child", choices=MODES)
    a = ap.parse_args()
    if a.child:
        print(child(a.child, a.corpus))
        return
    files = sorted(glob.glob(str(Path(a.corpus) / "pretok" / "*.parquet")))
    ms: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(a.rounds):
        for mode in MODES[r % len(MODES):] + MODES[:r % len(MODES)]:
            for f in files:  # warm page cache: the VM evicts cold pages within minutes
                Path(f).read_bytes()
            out = subprocess.run([sys.executable, __file__, "--child", mode, "--corpus", a.corpus],
                                 capture_output=True, text=True, check=True)
            ms[mode].append(round(float(out.stdout.strip()), 1))
    print(json.dumps({m: {"ms": v, "median": statistics.median(v)} for m, v in ms.items()}))


if __name__ == "__main__":
    main()
