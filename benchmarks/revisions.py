#!/usr/bin/env python3
"""Two revisions of zephon_columnar side by side: the same jobs, in interleaved fresh processes,
per-round ratios after/before. The proof that a refactor (issue 28's architecture) costs nothing.

Jobs (``StaticMixtureWorkSource(chunk_size=1024, seed=42)`` over the small corpus, as
``../shared/bench/compare.py``; ``to_training(return_padding_mask=True)`` on every batch):

  prepacked   <corpus>/prepacked (rows of 2048 int32 ids) -> batch(8)
  pretok      <corpus>/pretok -> pack_flat(2048, wrap) -> batch(8)
  text        <corpus>/parquet -> tokenize(tok32k, field="text", special_tokens="eos",
              add_attention_mask=False) -> pack_flat(2048, wrap) -> batch(8)
  reorder     <corpus>/pretok -> shuffle(8192, seed=7) -> pack_flat(2048, best_fit_wrap,
              pad_token_id=0) -> batch(8)
  restore     the pretok job: a ``save`` process takes --ckpt-after batches and checkpoints
              (as_bytes), a ``restore`` process builds, restores and takes the first batch (it
              must be the batch the saving process saw next: checked)

Each revision is extracted with ``git archive`` to ``benchmarks/data/_snap/<sha>/`` and run with
PYTHONPATH pointing there (edits made during the run cannot leak in). The clock starts after
``import torch`` and ``import zephon_columnar`` and a ``gc.collect()`` (a full collection falls
near the end of the imports; whether inside the clock or not depends on the objects the imports
allocated, 0.14 s over torch's objects, not on the revision). Per process: the import itself (s), first batch (s),
import + first batch (what moves when a module is loaded at import instead of on first use),
tokens/s over the whole pass (non-pad tokens of the batches received), process CPU s, peak RSS. Ratios are taken
within a round (after/before), then the median over rounds. Prints progress to stderr and one
JSON line. Usage (repo root; data as benchmarks/README.md "Setup"):

  .venv/bin/python benchmarks/revisions.py --before 2d8f37e --after HEAD --rounds 3 \\
      > benchmarks/results/revisions.jsonl
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
JOBS = ("prepacked", "pretok", "text", "reorder", "restore")


# ---------------------------------------------------------------------- children
def build(Z, job: str, corpus: str, tokenizer: str):
    folder = {"prepacked": "prepacked", "text": "parquet"}.get(job, "pretok")
    ds = Z.Dataset.from_path("train", os.path.join(corpus, folder))
    ws = Z.StaticMixtureWorkSource([ds], {"train": 1.0}, seed=42, chunk_size=1024)
    p = Z.Pipeline(ws)
    if job == "text":
        p = p.tokenize(tokenizer_id=tokenizer, field="text", special_tokens="eos", add_attention_mask=False)
    if job == "reorder":
        p = p.shuffle(8192, seed=7).pack_flat(2048, algorithm="best_fit_wrap", pad_token_id=0)
    elif job != "prepacked":
        p = p.pack_flat(2048, algorithm="wrap")
    return p.batch(8)


def tokens_of(batch) -> tuple[int, str]:
    t = batch.to_training(return_padding_mask=True)
    ids = t["input_ids"]
    return int((~t["padding_mask"]).sum()), hashlib.sha1(ids.numpy().tobytes()).hexdigest()[:16]


def child(a: argparse.Namespace) -> dict:
    import torch  # noqa: F401 - a training script has it imported before the loader

    t_import = time.perf_counter()
    import zephon_columnar as Z

    # A full collection is due about when the imports end; over torch's objects it takes ~0.14 s
    # here, and whether it falls before or after the clock starts depends on how many objects the
    # imports allocated, not on the engine: run it now, on both sides, outside the timing.
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    import_s = t0 - t_import
    pipe = build(Z, "pretok" if a.job == "restore" else a.job, a.corpus, a.tokenizer)
    out: dict = {"source": os.path.dirname(os.path.dirname(Z.__file__)), "import_s": import_s}
    if a.phase == "restore":
        pipe.restore(Path(a.ckpt).read_bytes())
    it = iter(pipe)
    tokens, digest = tokens_of(next(it))
    out["first_batch_s"] = time.perf_counter() - t0
    out["import_and_first_batch_s"] = import_s + out["first_batch_s"]
    out["first_hash"] = digest
    if a.phase == "save":
        for _ in range(a.ckpt_after - 1):
            next(it)
        state = pipe.checkpoint(as_bytes=True)
        Path(a.ckpt).write_bytes(state)
        out["ckpt_bytes"] = len(state)
        out["next_hash"] = tokens_of(next(it))[1]
        it.close()
        return out
    if a.phase == "pass":
        batches = 1
        for batch in it:
            tokens += tokens_of(batch)[0]
            batches += 1
        wall = time.perf_counter() - t0
        out.update(batches=batches, tokens=tokens, wall_s=wall, tokens_per_s=tokens / wall)
    out["cpu_s"] = time.process_time() - c0
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


# ---------------------------------------------------------------------- parent
def snapshot(rev: str) -> tuple[str, str]:
    """(PYTHONPATH root holding zephon_columnar at ``rev``, "<sha> <date> <subject>"):
    `tokpack.snapshot`'s git-archive copy under benchmarks/data/_snap/."""
    import tokpack

    root, source = tokpack.snapshot(rev)
    return root, source["commit"][:100]


def run_child(a: argparse.Namespace, root: str, job: str, phase: str, ckpt: str) -> dict:
    # Bytecode cached under benchmarks/data/.pycache, as a pip install has it (with
    # PYTHONDONTWRITEBYTECODE left set, every import would compile pandas and the rest again).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPATH=root, PYTHONPYCACHEPREFIX=str(HERE / "data" / ".pycache"))
    cmd = [sys.executable, __file__, "--child", "--job", job, "--phase", phase, "--corpus", a.corpus,
           "--tokenizer", a.tokenizer, "--ckpt", ckpt, "--ckpt-after", str(a.ckpt_after)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout, cwd=tempfile.gettempdir())
    if done.returncode:
        raise SystemExit(f"{job}/{phase} at {root} failed:\n{done.stderr[-3000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if not out["source"].startswith(root):
        raise SystemExit(f"the child imported zephon_columnar from {out['source']}, not {root}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default="2d8f37e")
    ap.add_argument("--after", default="HEAD")
    ap.add_argument("--jobs", default=",".join(JOBS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--corpus", default=str(HERE / "data" / "small"))
    ap.add_argument("--tokenizer", default=str(HERE / "data" / "tok32k"))
    ap.add_argument("--ckpt-after", type=int, default=100)
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--job", help=argparse.SUPPRESS)
    ap.add_argument("--phase", default="pass", help=argparse.SUPPRESS)
    ap.add_argument("--ckpt", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.corpus, a.tokenizer = os.path.abspath(a.corpus), os.path.abspath(a.tokenizer)
    if a.child:
        print(json.dumps(child(a)))
        return
    revs = {"before": snapshot(a.before), "after": snapshot(a.after)}
    jobs = [j for j in a.jobs.split(",") if j]
    rounds: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
            row: dict = {}
            for job in jobs:
                for side in order:
                    root = revs[side][0]
                    print(f"round {r + 1}/{a.rounds}: {job} {side}", file=sys.stderr)
                    if job == "restore":
                        ckpt = os.path.join(tmp, f"{side}.ckpt")
                        saved = run_child(a, root, job, "save", ckpt)
                        got = run_child(a, root, job, "restore", ckpt)
                        if got["first_hash"] != saved["next_hash"]:
                            raise SystemExit(f"{side}: the restored batch is not the batch after the checkpoint")
                        row[f"{job}/{side}"] = {"restore_first_batch_s": got["first_batch_s"],
                                                "import_and_restore_first_batch_s": got["import_and_first_batch_s"],
                                                "ckpt_bytes": saved["ckpt_bytes"], "cpu_s": got["cpu_s"]}
                    else:
                        row[f"{job}/{side}"] = run_child(a, root, job, "pass", "")
            rounds.append(row)
    summary: dict = {}
    for job in jobs:
        keys = (["restore_first_batch_s", "import_and_restore_first_batch_s"] if job == "restore"
                else ["tokens_per_s", "first_batch_s", "import_and_first_batch_s", "import_s", "peak_rss_mb"])
        for key in keys:
            ratios = [rd[f"{job}/after"][key] / rd[f"{job}/before"][key] for rd in rounds]
            summary[f"{job}.{key}.after_over_before"] = round(statistics.median(ratios), 3)
            for side in ("before", "after"):
                summary[f"{job}.{key}.{side}"] = round(statistics.median(rd[f"{job}/{side}"][key] for rd in rounds), 4)
        if job != "restore":
            same = {rd[f"{job}/{s}"]["tokens"] for rd in rounds for s in ("before", "after")}
            summary[f"{job}.same_tokens_both_sides"] = len(same) == 1
    print(json.dumps({
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} CPUs, {os.uname().machine}",
        "revisions": {side: subject for side, (_, subject) in revs.items()},
        "corpus": a.corpus, "rounds": rounds, "summary": summary,
    }))


if __name__ == "__main__":
    main()
