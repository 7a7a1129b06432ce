#!/usr/bin/env python3
"""Markdown tables from the JSON line of tokpack.py (what RESULTS.md quotes).

    python benchmarks/tokpack_report.py benchmarks/data/tokpack_text_small.jsonl
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prepacked_report import _fmt, _med  # noqa: E402  (the same table helpers)


def main(path: str) -> None:
    d = json.loads(open(path).read().strip().splitlines()[-1])
    f, rr, s = d["per_round_figures"], d["per_round_ratios"], d["summary"]
    n = len(d["rounds"])
    rounds = " | ".join(f"r{i}" for i in range(n))
    st = d["settings"]
    print(f"{d['bench']}: date {d['date']}, corpus {st['corpus']}, {n} rounds, child env {st.get('child_env') or {}}; "
          f"source {d.get('ours_source')}; "
          f"load {d['machine'].get('loadavg_start')} -> {d['machine'].get('loadavg_end')}; "
          f"round wall s {[r.get('round_s') for r in d['rounds']]}\n")
    print(f"| ratio (per round) | {rounds} | median | target |")
    print("| --- |" + " --- |" * (n + 2))
    tg = s["targets"]
    for k, v in rr.items():
        t = tg.get(k)
        tt = (f"{t['target']} ({'-' if t['met'] is None else 'met' if t['met'] else 'MISSED'})" if t else "")
        name = f"**{k}**" if t else k
        print(f"| {name} | " + " | ".join(_fmt(x) for x in v) + f" | **{_fmt(s['median_ratios'][k], 3)}** | {tt} |")
    print()
    keys = [k for k in st["variants"] if f"{k}_tokens_per_s" in f]
    print("| variant | settings | tok/s median (per round, M) | CPU s/Mtok median | cores busy | peak RSS MB | "
          "first batch s | tokens / batches |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for k in keys:
        tps = f[f"{k}_tokens_per_s"]
        per = " / ".join(f"{x / 1e6:.2f}" if x else "-" for x in tps)
        sett = ", ".join(f"{kk}={vv}" for kk, vv in st["variants"][k].items() if vv not in (None, "default"))
        print(f"| {k} | {sett} | {_fmt(_med(tps))} ({per}) | {_fmt(_med(f.get(f'{k}_cpu_s_per_mtok', [])), 3)} | "
              f"{_fmt(_med(f.get(f'{k}_cores_busy', [])), 2)} | {_fmt(_med(f.get(f'{k}_peak_rss_mb', [])), 0)} | "
              f"{_fmt(_med(f.get(f'{k}_first_batch_s', [])), 3)} | "
              f"{'/'.join(_fmt(x) for x in f.get(f'{k}_tokens', []))} / {'/'.join(_fmt(x) for x in f.get(f'{k}_batches', []))} |")
    if "limit_tokens_per_s_warm_median" in f:
        print(f"\nlimit (floor) warm median of passes: {_fmt(_med(f['limit_tokens_per_s_warm_median']))} tok/s; "
              f"incl. lazy import {_fmt(_med(f['limit_tokens_per_s_incl_lazy_import']))} tok/s; "
              f"lazy import s {f.get('limit_lazy_import_s')}")
    hashes = {k: f.get(f"{k}_first4_hash") for k in keys if f.get(f"{k}_first4_hash")}
    if hashes:
        print(f"\nsha1 of the first 4 batches' input_ids: {hashes}")
    if s.get("knobs_best_by_median_tok_s_over_limit"):
        print("\nknobs by median tok/s over the limit: " +
              ", ".join(f"{k} {_fmt(v)}" for k, v in s["knobs_best_by_median_tok_s_over_limit"]))
    if d.get("errors"):
        print(f"\nerrors: {json.dumps(d['errors'])[:2000]}")


if __name__ == "__main__":
    main(sys.argv[1])
