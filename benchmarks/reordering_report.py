#!/usr/bin/env python3
"""Markdown tables from the runs of `reordering.sh` and `restore.py` (what RESULTS.md quotes).

  python benchmarks/reordering_report.py benchmarks/results/issue7_s13_

reads every ``<prefix><corpus>_<job>_<algorithm>_s<shuffle>.jsonl`` (with its ``.rounds``) and
``<prefix>restore_<corpus>_<job>.jsonl`` and prints one throughput table and one restore table:
medians over rounds, and the per-round values where they say how noisy a figure is.
"""

from __future__ import annotations

import glob
import json
import statistics
import sys


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def num(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def ms(seconds: float | None) -> str:
    return num(None if seconds is None else seconds * 1000)


def throughput(prefix: str) -> None:
    print("| corpus | job | algorithm | shuffle | ours / limit | ours M tok/s (rounds) | ours / Zephon | "
          "Zephon / limit | pack efficiency ours / Zephon | CPU s per Mtok | peak RSS MB ours / Zephon | "
          "first batch ms ours / Zephon |")
    print("| --- " * 12 + "|")
    for path in sorted(glob.glob(prefix + "*_s*.jsonl")):
        text = open(path).read()
        if "_restore_" in path or not text.strip():  # a restore run, or a run still going
            continue
        s = json.loads(text)
        corpus = path[len(prefix):].split("_")[0]
        rounds = [json.loads(line) for line in open(path[:-len(".jsonl")] + ".rounds")]
        rss = {k: median([r[k]["peak_rss_mb"] for r in rounds if k in r and "peak_rss_mb" in r[k]])
               for k in ("ours", "zephon")}
        first = {k: median([r[k]["first_batch_s"] * 1000 for r in rounds if k in r and "first_batch_s" in r[k]])
                 for k in ("ours", "zephon")}
        eff = s["pack_efficiency"]
        tok_s = " / ".join(f"{x / 1e6:.2f}" for x in s["ours_tok_s"])
        print(f"| {corpus} | {s['job']} | {s['algorithm']} | {s['shuffle'] or '-'} | **{s['ours_over_limit']:.3f}** | "
              f"{tok_s} | {s.get('ours_over_zephon') or '-'} | {s.get('zephon_over_limit') or '-'} | "
              f"{eff.get('ours', '-')} / {eff.get('zephon', '-')} | {s['ours_cpu_s_per_mtok']} | "
              f"{num(rss['ours'])} / {num(rss['zephon'])} | {num(first['ours'])} / {num(first['zephon'])} |")


def restores(prefix: str) -> None:
    print("| corpus | job | checkpoint after | ours restore / cold (rounds) | ours cold / restore ms | ours checkpoint bytes | "
          "Zephon restore / cold | Zephon cold / restore ms | Zephon checkpoint bytes | same batch ours / Zephon |")
    print("| --- " * 10 + "|")
    for path in sorted(glob.glob(prefix + "restore_*.jsonl")):
        text = open(path).read()
        if not text.strip():
            continue
        d = json.loads(text)
        s = d["summary"]
        corpus = path[len(prefix + "restore_"):].split("_")[0]
        per_round = " / ".join(f"{r['ours']['restore_over_cold']:.2f}" for r in d["rounds"]
                               if "restore_over_cold" in r.get("ours", {}))
        print(f"| {corpus} | {s['job']} | {s['ckpt_after']} batches | **{s['ours_restore_over_cold']}** ({per_round}) | "
              f"{s['ours_cold_s'] * 1000:.0f} / {s['ours_restore_s'] * 1000:.0f} | {s['ours_ckpt_bytes']:.0f} | "
              f"{s.get('zephon_restore_over_cold', '-')} | "
              f"{ms(s.get('zephon_cold_s'))} / {ms(s.get('zephon_restore_s'))} | "
              f"{num(s.get('zephon_ckpt_bytes'))} | {s['ours_same_batch']} / {s.get('zephon_same_batch', '-')} |")


if __name__ == "__main__":
    prefix = sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/issue7_s13_"
    throughput(prefix)
    print()
    restores(prefix)
