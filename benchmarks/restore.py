#!/usr/bin/env python3
"""Restore + first batch against a cold first batch, fresh processes, zephon_columnar and Zephon
0.2.0 side by side (issue 7, section 2), for the reordering jobs:

  text_wrap     text -> tokenize(special_tokens="eos") -> pack_flat(2048, wrap) -> batch(8)
  pretok_ff     pre-tokenized -> pack_flat(2048, first_fit, num_bins=16, pad_token_id=0) -> batch(8)
  pretok_bfw    pre-tokenized -> pack_flat(2048, best_fit_wrap, pad_token_id=0) -> batch(8)
  text_shuffle  text -> tokenize -> shuffle(8192, seed=7) -> pack_flat(2048, wrap) -> batch(8)

(StaticMixtureWorkSource(chunk_size=1024, seed=42), as ../shared/bench/compare.py.)
Per library and round, three fresh processes, the clock starting after `import torch` and the
library (a training script has both):

  cold     build the pipeline, first batch + to_training
  ckpt     build, take --ckpt-after batches, checkpoint() -> JSON file (size and time recorded),
           and the batch after it (its token hash)
  restore  build, restore(the JSON file), first batch + to_training; the batch must be the
           one the ckpt process saw next (checked)

Children cache bytecode under benchmarks/data/.pycache as a pip install has it (prepacked.py;
--keep-bytecode-env compiles every module in every process instead), and the job's files are read
once before each child (warm page cache). Prints progress to stderr and one JSON line: per round the figures, and the medians of
restore/cold per library. Usage (repo root):

  PYTHONPATH=. .venv/bin/python benchmarks/restore.py --corpus benchmarks/data/small --job text_wrap --rounds 3
  ... --job text_shuffle --corpus benchmarks/data/large --flush-every 32 --ckpt-after 1500   # a full buffer
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
JOBS = ("text_wrap", "pretok_ff", "pretok_bfw", "text_shuffle")


def build(Z, job: str, corpus: str, tokenizer: str, flush_every: int | None):
    text = job.startswith("text")
    ds = Z.Dataset.from_path("train", os.path.join(corpus, "parquet" if text else "pretok"))
    ws = Z.StaticMixtureWorkSource(datasets=[ds], mixture=Z.MixtureSpec({"train": 1.0}), seed=42, chunk_size=1024)
    p = Z.Pipeline(ws)
    if text:
        p = p.tokenize(tokenizer_id=tokenizer, field="text", special_tokens="eos", add_attention_mask=False)
    if job == "text_shuffle":
        p = p.shuffle(8192, seed=7)
    if job == "pretok_ff":
        p = p.pack_flat(max_length=2048, algorithm="first_fit", num_bins=16, pad_token_id=0)
    elif job == "pretok_bfw":
        p = p.pack_flat(max_length=2048, algorithm="best_fit_wrap", pad_token_id=0)
    else:
        p = p.pack_flat(max_length=2048, algorithm="wrap")
    p = p.batch(8)
    if flush_every:
        p = p.options(flush_every_k_chunks=flush_every)
    return p


def batch_hash(tr) -> str:
    return hashlib.sha1(tr["input_ids"].numpy().tobytes()).hexdigest()[:16]


def child(args) -> None:
    import torch  # noqa: F401  (a training script has it imported)

    Z = __import__(args.module)
    t0 = time.perf_counter()
    pipe = build(Z, args.job, args.corpus, args.tokenizer, args.flush_every)
    out: dict = {}
    if args.mode == "restore":
        with open(args.file) as f:
            pipe.restore(json.load(f))
    it = iter(pipe)
    if args.mode == "ckpt":
        for _ in range(args.ckpt_after):
            next(it)
        t1 = time.perf_counter()
        ckpt = json.dumps(pipe.checkpoint())
        out["ckpt_s"] = time.perf_counter() - t1
        out["ckpt_bytes"] = len(ckpt)
        with open(args.file, "w") as f:
            f.write(ckpt)
        out["next_hash"] = batch_hash(next(it).to_training(return_padding_mask=True))
    else:
        tr = next(it).to_training(return_padding_mask=True)
        out["first_batch_s"] = time.perf_counter() - t0
        out["hash"] = batch_hash(tr)
    close = getattr(it, "close", None)
    if close:
        close()
    print(json.dumps(out))
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown in the figures


def warm_page_cache(args) -> None:
    """Read the job's files once: this VM's proactive reclaim evicts cold page-cache pages within
    minutes, and a restore reads more shards than a cold start (it would pay the disk alone)."""
    data = Path(args.corpus) / ("parquet" if args.job.startswith("text") else "pretok")
    for f in sorted(data.glob("*.parquet")):
        f.read_bytes()


def run_child(py: str, module: str, mode: str, args, path: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), RAYON_NUM_THREADS="2", TOKENIZERS_PARALLELISM="true",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if not args.keep_bytecode_env:
        # As prepacked.py: this sandbox sets PYTHONDONTWRITEBYTECODE=1, so a source checkout would
        # compile every module in every process while a pip install (Zephon's) has .pyc files.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(REPO / "benchmarks" / "data" / ".pycache")
    warm_page_cache(args)
    cmd = [py, __file__, "--child", "--module", module, "--mode", mode, "--job", args.job, "--corpus", args.corpus,
           "--tokenizer", args.tokenizer, "--file", path, "--ckpt-after", str(args.ckpt_after)]
    if args.flush_every:
        cmd += ["--flush-every", str(args.flush_every)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if res.returncode != 0:
        return {"error": res.stderr[-1500:]}
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--job", choices=JOBS, required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--tokenizer", default=str(REPO / "benchmarks/data/tok32k"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ckpt-after", type=int, default=150)
    ap.add_argument("--flush-every", type=int, default=None)
    ap.add_argument("--z-python", default=str(REPO / "benchmarks/.venv-zephon/bin/python"))
    ap.add_argument("--zc-python", default=sys.executable)
    ap.add_argument("--keep-bytecode-env", action="store_true",
                    help="leave PYTHONDONTWRITEBYTECODE as is (default: children cache bytecode, as a pip install has it)")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--module", default="zephon_columnar")
    ap.add_argument("--mode", choices=("cold", "ckpt", "restore"))
    ap.add_argument("--file")
    args = ap.parse_args()
    if args.child:
        return child(args)
    libs = [("ours", args.zc_python, "zephon_columnar")]
    if os.path.exists(args.z_python):
        libs.append(("zephon", args.z_python, "zephon"))
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            row: dict = {}
            for name, py, module in (libs if r % 2 == 0 else libs[::-1]):
                path = os.path.join(tmp, f"{name}.json")
                cold = run_child(py, module, "cold", args, path)
                ck = run_child(py, module, "ckpt", args, path)
                rest = run_child(py, module, "restore", args, path)
                fig = {"cold": cold, "ckpt": ck, "restore": rest}
                if all("error" not in v for v in fig.values()):
                    fig["restore_over_cold"] = rest["first_batch_s"] / cold["first_batch_s"]
                    fig["same_batch"] = rest["hash"] == ck["next_hash"]
                row[name] = fig
                print(f"round {r} {name}: {json.dumps(fig)[:600]}", file=sys.stderr)
            rounds.append(row)
    summary = {"job": args.job, "corpus": args.corpus, "ckpt_after": args.ckpt_after,
               "flush_every": args.flush_every, "rounds": args.rounds}
    for name, _, _ in libs:
        ok = [r[name] for r in rounds if "restore_over_cold" in r[name]]
        if ok:
            summary[f"{name}_restore_over_cold"] = round(statistics.median(x["restore_over_cold"] for x in ok), 3)
            summary[f"{name}_cold_s"] = round(statistics.median(x["cold"]["first_batch_s"] for x in ok), 4)
            summary[f"{name}_restore_s"] = round(statistics.median(x["restore"]["first_batch_s"] for x in ok), 4)
            summary[f"{name}_ckpt_bytes"] = statistics.median(x["ckpt"]["ckpt_bytes"] for x in ok)
            summary[f"{name}_same_batch"] = all(x["same_batch"] for x in ok)
        errors = [r[name] for r in rounds if "restore_over_cold" not in r[name]]
        if errors:
            summary[f"{name}_errors"] = [json.dumps(e)[:800] for e in errors]
    print(json.dumps({"summary": summary, "rounds": rounds}))


if __name__ == "__main__":
    main()
