#!/usr/bin/env python3
"""Where the CPU of zephon_columnar's text (or pretok) job goes: one pass, in this process, with

* per-OS-thread CPU (from /proc/self/task/*/stat, polled every 50 ms; Python threads named from
  `threading`, the rest are native threads: the tokenizers' rayon pool, Arrow's pool, ...);
* per-function thread-CPU and wall timers, installed by wrapping library functions from outside
  (nothing in zephon_columnar is edited): fetch, tokenize (texts -> Python list, encode_ids, the
  specials splice, Arrow assembly), pack_flat's push/flush, the batch cut, to_training.

A thread blocked in `encode_batch_fast` waits for the rayon pool, so the Python-side cost of a
tokenize call is its thread CPU and the tokenizer's own work shows up as the rayon threads' CPU.
The timers add ~1-2 us per call (a few hundred calls a pass): negligible.

    PYTHONPATH=. RAYON_NUM_THREADS=2 TOKENIZERS_PARALLELISM=true .venv/bin/python \\
        benchmarks/tokpack_probe.py --job text --corpus benchmarks/data/small [--tok-par 1] [--max-workers 1]

Prints one JSON line (and a readable table on stderr).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import prepacked as PP  # noqa: E402
import tokpack as TP  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _task_cpu() -> dict[int, float]:
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as fh:
                f = fh.read().rsplit(")", 1)[1].split()
            out[int(tid)] = (int(f[11]) + int(f[12])) / CLK_TCK
        except (OSError, ValueError, IndexError):
            pass
    return out


class ThreadCpu(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True, name="probe-sampler")
        self.last: dict[int, float] = {}
        self.start_cpu: dict[int, float] = {}
        self.names: dict[int, str] = {}
        self._halt = threading.Event()

    def poll(self) -> None:
        for t in threading.enumerate():
            if t.native_id is not None:
                self.names[t.native_id] = t.name
        for tid, c in _task_cpu().items():
            self.last[tid] = c

    def run(self) -> None:
        while not self._halt.is_set():
            self.poll()
            self._halt.wait(0.05)

    def stop(self) -> None:
        self._halt.set()
        self.join()
        self.poll()


TIMERS: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])  # calls, thread cpu, wall
_LOCK = threading.Lock()


def wrap(owner, attr: str, label: str) -> None:
    fn = getattr(owner, attr)

    def timed(*args, **kw):
        c0, t0 = time.thread_time(), time.perf_counter()
        try:
            return fn(*args, **kw)
        finally:
            dc, dt = time.thread_time() - c0, time.perf_counter() - t0
            with _LOCK:
                s = TIMERS[label]
                s[0] += 1
                s[1] += dc
                s[2] += dt

    timed.__wrapped__ = fn
    setattr(owner, attr, timed)


def install() -> None:
    from zephon_columnar import types
    from zephon_columnar.engine.lane import collector
    from zephon_columnar.engine.runners import inline, process, threads
    from zephon_columnar.ops import fetch
    from zephon_columnar.ops.tokenize import handle
    from zephon_columnar.ops.tokenize import op as tokenize  # splice_specials is read there

    for runner in (inline, threads, process):  # each runner module calls the run_stage it imported
        wrap(runner, "run_stage", "stage (fetch+tokenize), total")
    wrap(fetch.FetchOp, "process_frame", "fetch.process_frame")
    wrap(tokenize.TokenizeOp, "process_frame", "tokenize.process_frame, total")
    wrap(tokenize.TokenizeOp, "_texts", "tokenize._texts (Arrow -> list[str])")
    wrap(handle.TokenizerHandle, "encode_ids", "tokenize: encode_ids (encode_batch_fast + ids -> numpy)")
    wrap(tokenize, "splice_specials", "tokenize: splice_specials")
    wrap(tokenize.TokenizeOp, "_assemble", "tokenize._assemble (Arrow output)")
    from zephon_columnar.ops.pack import packer
    from zephon_columnar.ops.pack import wrap as wrap_packer

    for name in ("push", "flush"):  # the lane's packer (every algorithm), then wrap's own push
        wrap(packer.LanePacker, name, f"pack_flat: LanePacker.{name}")
    wrap(wrap_packer.WrapPacker, "push", "pack_flat: WrapPacker.push")
    wrap(collector, "take_batch", "batch: take_batch")
    from zephon_columnar.io import parquet

    if hasattr(parquet.ParquetReader, "_decode"):
        wrap(parquet.ParquetReader, "_decode", "fetch: ParquetReader._decode (Parquet -> Arrow)")
    wrap(types.SampleBatch, "to_training", "to_training")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--job", choices=["text", "pretok"], default="text")
    ap.add_argument("--corpus", default=str(HERE / "data" / "small"))
    ap.add_argument("--tokenizer", default=str(HERE / "data" / "tok32k"))
    ap.add_argument("--chunk-size", type=int, default=1024)
    ap.add_argument("--tok-par", default="")
    ap.add_argument("--max-workers", default="")
    ap.add_argument("--fetch-max-batch", default="")
    ap.add_argument("--fetch-par", default="")
    ap.add_argument("--runner", default="")
    ap.add_argument("--prefetch-batches", default="")
    ap.add_argument("--no-timers", action="store_true", help="per-thread CPU only")
    a = ap.parse_args()
    a.corpus, a.tokenizer = os.path.abspath(a.corpus), os.path.abspath(a.tokenizer)
    Z = PP._import_lib("zephon_columnar")
    if not a.no_timers:
        install()
    main_tid = threading.get_native_id()
    before = _task_cpu()
    sampler = ThreadCpu()
    sampler.start()
    t0, c0 = time.perf_counter(), time.process_time()
    tokens = batches = 0
    pipe = TP._build(Z, a)
    build_s = time.perf_counter() - t0
    first = None
    for b in pipe:
        tokens += PP._real_tokens(b.to_training(return_padding_mask=True))
        batches += 1
        if first is None:
            first = time.perf_counter() - t0
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    sampler.stop()
    threads = collections.Counter()
    for tid, c in sampler.last.items():
        d = c - before.get(tid, 0.0)
        if tid == main_tid:
            name = "MainThread (consumer: pack, batch, to_training)"
        elif tid in sampler.names:
            name = sampler.names[tid]
            name = "zephon-worker_*" if name.startswith("zephon-worker") else name
        else:
            name = "native threads (rayon pool of tokenizers, Arrow pool, ...)"
        threads[name] += d
    out = {"job": a.job, "tokens": tokens, "batches": batches, "seconds": wall, "tokens_per_s": tokens / wall,
           "cpu_s": cpu, "cpu_s_per_mtok": cpu / (tokens / 1e6), "build_s": build_s, "first_batch_s": first,
           "env": {k: os.environ.get(k) for k in TP.LIMIT_ENV},
           "knobs": {k: getattr(a, k) for k in ("tok_par", "max_workers", "fetch_max_batch", "fetch_par", "runner")},
           "thread_cpu_s": {k: round(v, 3) for k, v in threads.most_common()},
           "timers": {k: {"calls": int(v[0]), "thread_cpu_s": round(v[1], 3), "wall_s": round(v[2], 3)}
                      for k, v in sorted(TIMERS.items(), key=lambda kv: -kv[1][1])}}
    print(f"{a.job}: {tokens:,} tokens, {wall:.3f} s wall, {tokens / wall / 1e6:.3f} M tok/s, CPU {cpu:.3f} s "
          f"({cpu / (tokens / 1e6):.3f} s/Mtok); pipeline build {build_s * 1e3:.1f} ms, first batch at "
          f"{first * 1e3:.1f} ms", file=sys.stderr)
    print("per OS thread (CPU s, share of process CPU):", file=sys.stderr)
    for k, v in threads.most_common():
        print(f"  {v:7.3f}  {v / cpu:6.1%}  {k}", file=sys.stderr)
    print("per function (calls, thread CPU s, share of process CPU, wall s):", file=sys.stderr)
    for k, v in out["timers"].items():
        print(f"  {v['calls']:6d} {v['thread_cpu_s']:7.3f} {v['thread_cpu_s'] / cpu:6.1%} {v['wall_s']:7.3f}  {k}",
              file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
