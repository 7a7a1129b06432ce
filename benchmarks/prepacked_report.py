#!/usr/bin/env python3
"""Markdown tables from the JSON line of prepacked.py (what RESULTS.md quotes).

    python benchmarks/prepacked_report.py benchmarks/data/prepacked.jsonl
"""

from __future__ import annotations

import json
import sys


def _fmt(v, nd=2):
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, (int, float)) and abs(v) >= 1000:
        return f"{v:,.0f}"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def _med(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def main(path: str) -> None:
    d = json.loads(open(path).read().strip().splitlines()[-1])
    f, rr, s = d["per_round_figures"], d["per_round_ratios"], d["summary"]
    n = len(d["rounds"])
    rounds = " | ".join(f"r{i}" for i in range(n))
    print(f"date {d['date']}, source {d.get('ours_source')}, load {d['machine'].get('loadavg_start')} -> "
          f"{d['machine'].get('loadavg_end')}\n")
    print(f"| ratio (per round) | {rounds} | median | target |")
    print("| --- |" + " --- |" * (n + 2))
    tg = s["targets"]
    for k, v in rr.items():
        t = tg.get(k)
        tt = (f"{t['target']} ({'-' if t['met'] is None else 'met' if t['met'] else 'MISSED'})" if t else "")
        print(f"| {k} | " + " | ".join(_fmt(x) for x in v) + f" | **{_fmt(s['median_ratios'][k])}** | {tt} |")
    print()
    keys = [k for k in ("ours", "ours_preimport", "ours_zenv", "zephon", "floor") if f"{k}_tokens_per_s" in f]
    print("| variant | tok/s median (per round) | CPU s/Mtok | peak RSS MB | RSS after imports MB | first batch s | tokens / batches |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for k in keys:
        tps = f[f"{k}_tokens_per_s"]
        per = " / ".join(f"{x / 1e6:.1f}" if x else "-" for x in tps)
        print(f"| {k} | {_fmt(_med(tps))} ({per} M) | {_fmt(_med(f.get(f'{k}_cpu_s_per_mtok', [])), 3)} | "
              f"{_fmt(_med(f.get(f'{k}_peak_rss_mb', [])), 0)} | {_fmt(_med(f.get(f'{k}_rss_after_imports_mb', [])), 0)} | "
              f"{_fmt(_med(f.get(f'{k}_first_batch_s', [])), 3)} | {_fmt(f.get(f'{k}_tokens'))} / "
              f"{_fmt(f.get(f'{k}_batches'))} |")
    for k in ("ours_warm", "zephon_warm"):
        if f"{k}_warm_tokens_per_s" in f:
            tps = f[f"{k}_warm_tokens_per_s"]
            print(f"\n{k} (median of the passes after the first, same process): "
                  f"{_fmt(_med(tps))} tok/s ({' / '.join(f'{x / 1e6:.1f}' if x else '-' for x in tps)} M), "
                  f"CPU s/Mtok {_fmt(_med(f.get(f'{k}_warm_cpu_s_per_mtok', [])), 3)}")
    if "floor_tokens_per_s_warm_median" in f:
        print(f"\nfloor: warm median of passes {_fmt(_med(f['floor_tokens_per_s_warm_median']))} tok/s; "
              f"incl. lazy import {_fmt(_med(f['floor_tokens_per_s_incl_lazy_import']))} tok/s; "
              f"lazy import s {f['floor_lazy_import_s']}")
    print()
    print("| resume | K | checkpoint() s | state | build+restore+first batch s (per round) | cold build+first batch s (per round) | restore/cold | batch K+1 matches |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for k in ("ours", "zephon"):
        if f"{k}_restore_total_s" not in f:
            continue
        print(f"| {k} | {f[f'{k}_ckpt_after_batches'][0]} | {_fmt(_med(f[f'{k}_checkpoint_s']), 5)} | "
              f"{f[f'{k}_ckpt_format']} {_fmt(f[f'{k}_ckpt_bytes'][0])} B | "
              f"{_fmt(_med(f[f'{k}_restore_total_s']), 3)} ({' / '.join(_fmt(x, 3) for x in f[f'{k}_restore_total_s'])}) | "
              f"{_fmt(_med(f[f'{k}_cold_total_s']), 3)} ({' / '.join(_fmt(x, 3) for x in f[f'{k}_cold_total_s'])}) | "
              f"{_fmt(s['median_ratios'].get(f'{k}_restore_over_cold'))} | "
              f"{sum(1 for x in f[f'{k}_resume_matches'] if x)}/{len(f[f'{k}_resume_matches'])} |")
    for k in ("ours", "zephon"):
        if f"{k}_restore_first_batch_s" in f:
            print(f"\n{k}: restore = build {_fmt(_med(f[f'{k}_restore_build_s']), 3)} + load/restore "
                  f"{_fmt(_med(f[f'{k}_restore_load_restore_s']), 4)} + first batch "
                  f"{_fmt(_med(f[f'{k}_restore_first_batch_s']), 3)} s; cold = build "
                  f"{_fmt(_med(f[f'{k}_cold_build_s']), 3)} + first batch {_fmt(_med(f[f'{k}_cold_first_batch_s']), 3)} s")
    if d.get("errors"):
        print("\nerrors:", json.dumps(d["errors"])[:2000])
    if d.get("notes"):
        print("\nnotes:", d["notes"])


if __name__ == "__main__":
    main(sys.argv[1])
