#!/usr/bin/env python3
"""A 3-phase mixture schedule against the static mixture, side by side (issue 47).

Three datasets over the corpus (``web``, ``code``, ``quality``: the same files under three
names, so both sides read the same kind of rows), read ``--batches`` batches of 8 x 2048 tokens
(every dataset repeats; ``chunk_size=1024``):

  static     StaticMixtureWorkSource {web: 0.5, code: 0.3, quality: 0.2}
  schedule   ScheduledMixtureWorkSource: web only (warm-up), a linear ramp into the static
             side's weights, an anneal {quality: 0.7, web: 0.3}: its phases cut the run in thirds
  constant   ScheduledMixtureWorkSource with one point, the static side's weights: the same
             mixture, so the ratio to static is the scheduled machinery's own cost (per-chunk
             draws, target counters), apart from what the schedule's phases read

Jobs: ``pretok`` (<corpus>/pretok -> pack_flat(2048, wrap) -> batch(8)) and ``text``
(<corpus>/parquet -> tokenize(tok32k) -> pack_flat(2048, wrap) -> batch(8)). Each side runs in a
fresh process per round, the order alternating; the clock starts after ``import torch`` and
``import zephon_columnar``; first batch apart from throughput (non-pad tokens/s over the run);
the ratio schedule/static is taken within a round, then the median.

``--ckpt`` also measures checkpoints of the schedule side: their size after 50 and after 500
batches (a state does not grow with the steps), after 1, 5 and 20 ``set_mixture`` calls (one
entry each), and restore + first batch against the static side's (a scheduled mixture is
checkpointed by replay: a restore replays the lane's flush epoch). Prints one JSON line.

  PYTHONPATH=. .venv/bin/python benchmarks/mixture_schedule.py --rounds 5 --ckpt \\
      > benchmarks/results/mixture_schedule.jsonl
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
NAMES = ("web", "code", "quality")
STATIC = {"web": 0.5, "code": 0.3, "quality": 0.2}


def source(Z, side: str, corpus: str, job: str, batches: int):
    folder = os.path.join(corpus, "parquet" if job == "text" else "pretok")
    datasets = [Z.Dataset.from_path(n, folder) for n in NAMES]
    kw = dict(chunk_size=1024, seed=42, exhausted_policy="repeat", stop_after_passes=None)
    if side == "static":
        return Z.StaticMixtureWorkSource(datasets, STATIC, **kw)
    if side == "constant":
        return Z.ScheduledMixtureWorkSource(datasets, [Z.SchedulePoint(at=0, weights=STATIC)], **kw)
    # About 4 documents a packed row of 2048 tokens: the run reads ~batches * 8 * 4 rows.
    third = max(3, batches * 8 * 4 // 1024 // 3)
    schedule = [
        Z.SchedulePoint(at=0, weights={"web": 1.0}),
        Z.SchedulePoint(at=third // 2, weights={"web": 1.0}),
        Z.SchedulePoint(at=third, weights=STATIC, ramp="linear"),
        Z.SchedulePoint(at=2 * third, weights={"quality": 0.7, "web": 0.3}),
    ]
    return Z.ScheduledMixtureWorkSource(datasets, schedule, **kw)


def build(Z, side: str, a: argparse.Namespace):
    p = Z.Pipeline(source(Z, side, a.corpus, a.job, a.batches))
    if a.job == "text":
        p = p.tokenize(tokenizer_id=a.tokenizer, field="text", special_tokens="eos", add_attention_mask=False)
    return p.pack_flat(2048, algorithm="wrap").batch(8)


def tokens(batch) -> int:
    t = batch.to_training(return_padding_mask=True)
    return int((~t["padding_mask"]).sum())


def child(a: argparse.Namespace) -> dict:
    import torch  # noqa: F401 - a training script has it imported before the loader

    import zephon_columnar as Z

    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    pipe = build(Z, a.side, a)
    if a.phase == "restore":
        pipe.restore(Path(a.ckpt).read_bytes())
        tokens(next(iter(pipe)))
        return {"restore_first_batch_s": time.perf_counter() - t0}
    it = iter(pipe)
    n = tokens(next(it))
    out: dict = {"first_batch_s": time.perf_counter() - t0}
    if a.phase == "pass":
        for _ in range(a.batches - 1):
            n += tokens(next(it))
        wall = time.perf_counter() - t0
        out.update(tokens=n, wall_s=wall, tokens_per_s=n / wall, cpu_s=time.process_time() - c0)
    elif a.phase == "ckpt":  # sizes as the steps and the changes go on (the schedule side)
        def size() -> dict:
            # JSON (what grows with the changes: one entry each) and zstd (as_bytes: a lane replayed
            # inside a wrap-packed epoch also carries its partial row, a few KB, wherever it stands)
            ckpt = pipe.checkpoint()
            changes = sum(len(json.dumps(lane["source_state"].get("mixture_changes", []))) for lane in ckpt["lanes"].values())
            return {"json": len(json.dumps(ckpt)), "zstd": len(pipe.checkpoint(as_bytes=True)), "changes_json": changes}

        sizes: dict = {}
        for step in range(1, 501):
            next(it)
            if step in (50, 500):
                sizes[f"after_{step}_batches"] = size()
        for changes in range(1, 21):
            pipe.set_mixture({"web": 1.0 + changes % 3, "code": 1.0, "quality": 2.0})
            for _ in range(5):
                next(it)
            if changes in (1, 5, 20):
                sizes[f"after_{changes}_changes"] = size()
        out["ckpt_bytes"] = sizes
    elif a.phase == "save":
        for _ in range(a.ckpt_after - 1):
            next(it)
        Path(a.ckpt).write_bytes(pipe.checkpoint(as_bytes=True))
    it.close()
    return out


def run_child(a: argparse.Namespace, side: str, phase: str, ckpt: str = "") -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    cmd = [sys.executable, __file__, "--child", "--side", side, "--phase", phase, "--job", a.job, "--corpus",
           a.corpus, "--tokenizer", a.tokenizer, "--batches", str(a.batches), "--ckpt-path", ckpt]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout)
    if done.returncode:
        raise SystemExit(f"{side}/{phase} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", default="pretok,text")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", type=int, default=1500)
    ap.add_argument("--corpus", default=str(HERE / "data" / "small"))
    ap.add_argument("--tokenizer", default=str(HERE / "data" / "tok32k"))
    ap.add_argument("--ckpt", dest="measure_ckpt", action="store_true", help="also measure checkpoints and restores")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--side", help=argparse.SUPPRESS)
    ap.add_argument("--phase", default="pass", help=argparse.SUPPRESS)
    ap.add_argument("--job", default="pretok", help=argparse.SUPPRESS)
    ap.add_argument("--ckpt-path", dest="ckpt_path", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.corpus, a.tokenizer = os.path.abspath(a.corpus), os.path.abspath(a.tokenizer)
    a.ckpt, a.ckpt_after = a.ckpt_path, 200
    if a.child:
        print(json.dumps(child(a)))
        return
    summary: dict = {}
    rounds: dict = {}
    for job in [j for j in a.jobs.split(",") if j]:
        a.job = job
        rows = []
        for r in range(a.rounds):
            row = {}
            for side in (("static", "schedule", "constant") if r % 2 == 0 else ("constant", "schedule", "static")):
                print(f"{job} round {r + 1}/{a.rounds}: {side}", file=sys.stderr)
                row[side] = run_child(a, side, "pass")
            rows.append(row)
        rounds[job] = rows
        for side in ("schedule", "constant"):
            ratio = [row[side]["tokens_per_s"] / row["static"]["tokens_per_s"] for row in rows]
            summary[f"{job}.tokens_per_s.{side}_over_static"] = round(statistics.median(ratio), 3)
        for side in ("static", "schedule", "constant"):
            for key in ("tokens_per_s", "first_batch_s"):
                summary[f"{job}.{key}.{side}"] = round(statistics.median(row[side][key] for row in rows), 4)
        if a.measure_ckpt:
            summary[f"{job}.ckpt_bytes.schedule"] = run_child(a, "schedule", "ckpt")["ckpt_bytes"]
            with tempfile.TemporaryDirectory() as tmp:
                for side in ("static", "schedule"):
                    restores = []
                    for _ in range(3):
                        path = os.path.join(tmp, f"{side}.ckpt")
                        run_child(a, side, "save", path)
                        restores.append(run_child(a, side, "restore", path)["restore_first_batch_s"])
                        summary[f"{job}.ckpt_bytes_after_200.{side}"] = os.path.getsize(path)
                    summary[f"{job}.restore_first_batch_s.{side}"] = round(statistics.median(restores), 3)
    print(json.dumps({
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} CPUs, {os.uname().machine}",
        "corpus": a.corpus, "batches": a.batches, "summary": summary, "rounds": rounds,
    }))


if __name__ == "__main__":
    main()
