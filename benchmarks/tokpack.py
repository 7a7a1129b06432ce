#!/usr/bin/env python3
"""Text and pre-tokenized jobs: zephon_columnar vs Zephon 0.2.0 vs the physical limit, interleaved,
as ratios (issue 3's two benchmarks). A sibling of prepacked.py; it shares its helpers.

The jobs (the same code for both libraries, as ../shared/bench/compare.py):

    ds = Dataset.from_path("train", "<corpus>/parquet")          # --job text  (id, text)
    ds = Dataset.from_path("train", "<corpus>/pretok")           # --job pretok (input_ids: ids + EOS per doc)
    ws = StaticMixtureWorkSource(datasets=[ds], mixture=MixtureSpec({"train": 1.0}), seed=42,
                                 chunk_size=1024)
    p = Pipeline(ws)
    p = p.tokenize(tokenizer_id=<tok dir>, field="text", special_tokens="eos",
                   add_attention_mask=False, parallelism=P)       # text job only
    for b in p.pack_flat(2048, algorithm="wrap").batch(8):
        tr = b.to_training(return_padding_mask=True)              # input_ids int64 [8, 2048]

Each round runs, back to back, one fresh process per variant (order rotated per round):

  ours, ours_*   zephon_columnar with the knobs of the variant (--ours NAME:KNOBS, below):
                 tokens/s (real = non-pad tokens received), CPU s per Mtok (all threads, and any
                 child processes), peak RSS, first-batch time. The clock starts after
                 `import torch` and `import zephon_columnar` (a training job has both).
  zephon         Zephon 0.2.0 (--z-python), same job; text: tokenize(parallelism=--zephon-tok-par,
                 default 2 = its best configuration, "tok2" in ../shared/bench/RESULTS.md).
                 The clock starts after `import torch, zephon, transformers` (Zephon imports
                 transformers lazily to load the tokenizer), as zephon_baseline.py does.
  limit          text job: raw `tokenizers.Tokenizer.encode_batch_fast(add_special_tokens=False)`
                 over all texts in calls of 1,024 docs, summing len(e.ids), exactly as
                 `limit.py --child encode` (texts read from Parquet and the tokenizer loaded
                 before the clock), plus CPU time (time.process_time: every thread). Env
                 RAYON_NUM_THREADS=2, TOKENIZERS_PARALLELISM=true.
                 pretok job: pyarrow.parquet.read_table(use_threads=True) of <corpus>/pretok +
                 pc.list_flatten into one contiguous int32 buffer (limit.py's pretok part), first
                 pass in a fresh process; its lazy `import pyarrow.dataset` is excluded (as in
                 prepacked.py); the median of --floor-reps passes is reported too.
  minimal        text job only, reference: limit.py's `e2e` child (pyarrow read -> encode_batch_fast
                 -> + EOS -> int32 buffer -> [8, 2048] int64 batches), env as the limit.

Environment of every child: RAYON_NUM_THREADS and TOKENIZERS_PARALLELISM as the variant says
(default for ours and zephon: RAYON_NUM_THREADS=2, TOKENIZERS_PARALLELISM=true, the limit's),
PYTHONPYCACHEPREFIX=benchmarks/data/.pycache (see prepacked.py), ours with PYTHONPATH=<repo>.

Variants of ours: --ours NAME:KNOBS (repeatable; default: DEFAULT_OURS; the knob sweep of RESULTS.md
is `--knob-sweep`, which replaces the defaults by KNOB_SWEEP and drops zephon and minimal), KNOBS a
comma list of
  p=N|none   tokenize(parallelism=N)                  w=N|none  options(max_workers=N)
  r=N|unset  RAYON_NUM_THREADS (unset: not in env)    tp=true|false|unset  TOKENIZERS_PARALLELISM
  mb=N       fetch(max_batch=N) (rows per frame)      fp=N      fetch(parallelism=N)
  runner=threads|inline|process|remote                chunk=N   chunk_size (changes the data order)
  pb=N       options(prefetch_batches=N) (a prefetch thread N items ahead)
e.g. --ours ours:  --ours p1r2:p=1,r=2  --ours p2r1:p=2,r=1,w=2
runner=remote starts a local Ray cluster of os.cpu_count() CPUs before the clock (ray_init_s, reported
apart: a training job connects to its cluster before its loader starts); its actors' CPU time is not in
cpu_s (they are the raylet's children, not the benchmark's).

Prints progress to stderr and ONE JSON line to stdout. Usage (from the repo root):

    PYTHONPATH=. .venv/bin/python benchmarks/tokpack.py --job text --corpus benchmarks/data/small --rounds 3
    PYTHONPATH=. .venv/bin/python benchmarks/tokpack.py --job pretok --corpus benchmarks/data/small --rounds 5
    .venv/bin/python benchmarks/tokpack_report.py benchmarks/data/tokpack_text_small.jsonl
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import resource
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import prepacked as PP  # noqa: E402  (helpers: RSS sampler, CPU clock, runner, machine, source id)

L, B = 2048, 8
ENCODE_CHUNK = 1024  # limit.py's default --encode-chunk
LIMIT_ENV = {"RAYON_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "true"}
DEFAULT_OURS = {
    "text": ["ours:", "ours_w1:w=1"],
    "pretok": ["ours:"],
}
KNOB_SWEEP = ["ours:", "ours_p1:p=1", "ours_w1:w=1", "ours_p1fp1:p=1,fp=1", "ours_r1:r=1", "ours_tpfalse:tp=false",
              "ours_w1mb256:w=1,mb=256", "ours_w1mb512:w=1,mb=512", "ours_envunset:r=unset,tp=unset"]


def _tok_file(tok: str) -> str:
    p = Path(tok)
    return str(p / "tokenizer.json") if p.is_dir() else str(p)


def parse_knobs(spec: str) -> tuple[str, dict]:
    name, _, rest = spec.partition(":")
    knobs: dict = {}
    for kv in filter(None, (x.strip() for x in rest.split(","))):
        k, _, v = kv.partition("=")
        if k not in ("p", "w", "r", "tp", "mb", "fp", "runner", "chunk", "pb"):
            raise SystemExit(f"--ours {spec!r}: unknown knob {k!r}")
        knobs[k] = v
    return name, knobs


# ------------------------------------------------------------------ children

def _int_or_none(v):
    return None if v in (None, "", "none") else int(v)


def _build(Z, a):
    src = {"pretok": "pretok", "text": "parquet"}[a.job]
    ds = Z.Dataset.from_path("train", os.path.join(a.corpus, src))
    ws = Z.StaticMixtureWorkSource(datasets=[ds], mixture=Z.MixtureSpec({"train": 1.0}), seed=42,
                                   chunk_size=a.chunk_size)
    p = Z.Pipeline(ws)
    if a.fetch_max_batch or a.fetch_par:
        p = p.fetch(parallelism=_int_or_none(a.fetch_par), max_batch=_int_or_none(a.fetch_max_batch))
    if a.job == "text":
        p = p.tokenize(tokenizer_id=a.tokenizer, field="text", special_tokens="eos",
                       add_attention_mask=False, parallelism=_int_or_none(a.tok_par))
    p = p.pack_flat(max_length=L, algorithm="wrap").batch(B)
    opts = {}
    if _int_or_none(a.max_workers):
        opts["max_workers"] = int(a.max_workers)
    if a.runner:
        opts["runner"] = a.runner
    if _int_or_none(a.prefetch_batches):
        opts["prefetch_batches"] = int(a.prefetch_batches)
    if opts:
        p = p.options(**opts)
    return p


def child_throughput(a) -> dict:
    import importlib

    Z = PP._import_lib(a.module)  # + torch
    for m in filter(None, a.preimport.split(",")):
        importlib.import_module(m)
    ray_init_s = None
    if a.runner in ("remote", "ray"):  # a training job connects to its Ray cluster before the loader starts
        import ray

        t = time.perf_counter()
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
        ray_init_s = time.perf_counter() - t
    rss_imports = PP._rss_kb() / 1024
    before = set(sys.modules)
    sampler = PP.ChildRssSampler()
    sampler.start()
    t0 = time.perf_counter()
    c0 = PP._cpu_s()
    pipe = _build(Z, a)
    tokens = batches = 0
    first = None
    h = hashlib.sha1()
    for b in pipe:
        tr = b.to_training(return_padding_mask=True)
        tokens += PP._real_tokens(tr)
        if batches < 4:
            h.update(tr["input_ids"].numpy().tobytes())
        batches += 1
        if first is None:
            first = time.perf_counter() - t0
    wall = time.perf_counter() - t0
    cpu = PP._cpu_s() - c0
    sampler.stop()
    self_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    lazy = sorted(m for m in set(sys.modules) - before if m.count(".") <= 1 and not m.startswith(a.module))
    out = {"module": a.module, "tokens": tokens, "batches": batches, "seconds": wall,
           "tokens_per_s": tokens / wall, "cpu_s": cpu, "cpu_s_per_mtok": cpu / (tokens / 1e6),
           "cores_busy": cpu / wall, "first_batch_s": first, "first4_hash": h.hexdigest()[:16],
           "rss_after_imports_mb": rss_imports, "peak_rss_mb": self_peak + sampler.peak_kb / 1024,
           "peak_rss_children_mb": sampler.peak_kb / 1024, "child_processes": sampler.n_children_max,
           "ray_init_s": ray_init_s, "lazy_imports": lazy[:40], "env": {k: os.environ.get(k) for k in LIMIT_ENV},
           "versions": PP._versions()}
    try:
        import tokenizers

        out["versions"]["tokenizers"] = tokenizers.__version__
    except ImportError:
        pass
    if a.explain and hasattr(pipe, "explain"):
        try:
            out["explain"] = pipe.explain()
        except Exception as err:  # noqa: BLE001
            out["explain"] = f"{type(err).__name__}: {err}"
    return out


def child_limit_encode(a) -> dict:
    """limit.py's `--child encode` (encode_batch_fast part), with CPU time."""
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(_tok_file(a.tokenizer))
    texts: list[str] = []
    for f in sorted(glob.glob(os.path.join(a.corpus, "parquet", "*.parquet"))):
        texts.extend(pq.read_table(f, columns=["text"]).column("text").to_pylist())
    rss_before = PP._rss_kb() / 1024
    t0 = time.perf_counter()
    c0 = time.process_time()
    n_tok = 0
    for i in range(0, len(texts), ENCODE_CHUNK):
        for e in tok.encode_batch_fast(texts[i:i + ENCODE_CHUNK], add_special_tokens=False):
            n_tok += len(e.ids)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    import tokenizers

    return {"docs": len(texts), "tokens": n_tok, "seconds": wall, "tokens_per_s": n_tok / wall,
            "cpu_s": cpu, "cpu_s_per_mtok": cpu / (n_tok / 1e6), "cores_busy": cpu / wall,
            "rss_before_clock_mb": rss_before,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "env": {k: os.environ.get(k) for k in LIMIT_ENV},
            "versions": dict(PP._versions(), tokenizers=tokenizers.__version__)}


def child_floor(a) -> dict:
    """pyarrow read + flatten of <corpus>/pretok (prepacked.py's floor on the pretok files)."""
    return PP.floor_of(sorted(glob.glob(os.path.join(a.corpus, "pretok", "*.parquet"))), a.floor_reps)


def child_minimal(a) -> dict:
    """limit.py's e2e child (minimal columnar text pipeline), run in this process."""
    sys.path.insert(0, a.shared_bench)
    import limit  # ../shared/bench/limit.py

    ns = argparse.Namespace(corpus=a.corpus, tokenizer=a.tokenizer, encode_chunk=ENCODE_CHUNK)
    r = limit.child_e2e(ns)
    r["tokens_per_s"] = r["tokens_delivered"] / r["seconds"]
    r["cpu_s_per_mtok"] = r["cpu_s"] / (r["tokens_delivered"] / 1e6)
    r["tokens"] = r["tokens_delivered"]
    r["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    r["cores_busy"] = r["cpu_s"] / r["seconds"]
    r["versions"] = PP._versions()
    return r


CHILDREN = {"throughput": child_throughput, "limit": child_limit_encode, "floor": child_floor,
            "minimal": child_minimal}


# ------------------------------------------------------------------ parent

def summarize(out: dict) -> None:
    """Per-round ratios, figures, medians and target checks from out["rounds"] (in place)."""
    R = out["rounds"]
    job = out["settings"]["job"]
    keys = list(out["settings"]["variants"])
    have_z = "zephon" in keys

    def get(r, k, f):
        v = r.get(k, {})
        return None if (not isinstance(v, dict) or "error" in v or v.get(f) is None) else v[f]

    def ratio(r, k1, f1, k2, f2):
        x, y = get(r, k1, f1), get(r, k2, f2)
        return None if (x is None or not y) else x / y

    ours_keys = [k for k in keys if k.startswith("ours")]
    per_round: dict[str, list] = {}
    for k in ours_keys:
        per_round[f"{k}_over_limit_tok_s"] = [ratio(r, k, "tokens_per_s", "limit", "tokens_per_s") for r in R]
        per_round[f"{k}_over_limit_cpu_per_tok"] = [ratio(r, k, "cpu_s_per_mtok", "limit", "cpu_s_per_mtok")
                                                    for r in R]
        if k != "ours":
            per_round[f"{k}_over_ours_tok_s"] = [ratio(r, k, "tokens_per_s", "ours", "tokens_per_s") for r in R]
    if job == "pretok":
        # The floor as ../shared/bench/compare.py measures it (limit.py --child pretok --reps 1):
        # one fresh-process pass that includes read_table's lazy `import pyarrow.dataset`.
        for k in ours_keys + (["zephon"] if have_z else []):
            per_round[f"{k}_over_limit_incl_lazy_import_tok_s"] = [
                ratio(r, k, "tokens_per_s", "limit", "tokens_per_s_incl_lazy_import") for r in R]
        per_round["ours_over_limit_warm_tok_s"] = [ratio(r, "ours", "tokens_per_s", "limit",
                                                         "tokens_per_s_warm_median") for r in R]
    if have_z:
        per_round["ours_over_zephon_tok_s"] = [ratio(r, "ours", "tokens_per_s", "zephon", "tokens_per_s") for r in R]
        per_round["ours_over_zephon_cpu_per_tok"] = [ratio(r, "ours", "cpu_s_per_mtok", "zephon", "cpu_s_per_mtok")
                                                     for r in R]
        per_round["ours_over_zephon_peak_rss"] = [ratio(r, "ours", "peak_rss_mb", "zephon", "peak_rss_mb") for r in R]
        per_round["zephon_over_limit_tok_s"] = [ratio(r, "zephon", "tokens_per_s", "limit", "tokens_per_s") for r in R]
        per_round["zephon_over_limit_cpu_per_tok"] = [ratio(r, "zephon", "cpu_s_per_mtok", "limit", "cpu_s_per_mtok")
                                                      for r in R]
    if "minimal" in keys:
        per_round["minimal_over_limit_tok_s"] = [ratio(r, "minimal", "tokens_per_s", "limit", "tokens_per_s")
                                                 for r in R]
        per_round["minimal_over_limit_cpu_per_tok"] = [ratio(r, "minimal", "cpu_s_per_mtok", "limit",
                                                             "cpu_s_per_mtok") for r in R]
    out["per_round_ratios"] = {k: [PP._r(x) for x in v] for k, v in per_round.items()}
    figs = {}
    for k in keys:
        for f in ("tokens_per_s", "cpu_s_per_mtok", "cores_busy", "peak_rss_mb", "rss_after_imports_mb",
                  "first_batch_s", "seconds", "tokens_per_s_warm_median", "tokens_per_s_incl_lazy_import",
                  "lazy_import_s"):
            vals = [get(r, k, f) for r in R]
            vals = [v if isinstance(v, (int, float)) else None for v in vals]
            if any(v is not None for v in vals):
                nd = 3 if f in ("first_batch_s", "cpu_s_per_mtok", "lazy_import_s", "cores_busy", "seconds") else 0
                figs[f"{k}_{f}"] = [PP._r(v, nd) for v in vals]
        for f in ("tokens", "batches", "first4_hash"):
            vals = [get(r, k, f) for r in R]
            if any(v is not None for v in vals):
                figs[f"{k}_{f}"] = sorted(set(v for v in vals if v is not None))
    out["per_round_figures"] = figs
    med = {k: PP._med(v) for k, v in per_round.items()}
    targets = {}
    for k in ours_keys:
        if job == "text":
            targets[f"{k}_over_limit_tok_s"] = (">=", 0.90)
            targets[f"{k}_over_limit_cpu_per_tok"] = ("<=", 1.15)
        else:
            targets[f"{k}_over_limit_tok_s"] = (">=", 0.50)
    out["summary"] = {
        "median_ratios": med,
        "targets": {k: {"target": f"{op} {t}", "median": med.get(k),
                        "met": None if med.get(k) is None else (med[k] >= t if op == ">=" else med[k] <= t)}
                    for k, (op, t) in targets.items()},
        "knobs_best_by_median_tok_s_over_limit": sorted(
            ((k, med.get(f"{k}_over_limit_tok_s")) for k in ours_keys if med.get(f"{k}_over_limit_tok_s")),
            key=lambda kv: -kv[1]),
        "median_tok_s": {k: PP._med([get(r, k, "tokens_per_s") for r in R]) for k in keys},
        "median_cpu_s_per_mtok": {k: PP._med([get(r, k, "cpu_s_per_mtok") for r in R]) for k in keys},
        "median_peak_rss_mb": {k: PP._med([get(r, k, "peak_rss_mb") for r in R]) for k in keys},
        "median_first_batch_s": {k: PP._med([get(r, k, "first_batch_s") for r in R]) for k in keys},
    }
    errs = {}
    for i, r in enumerate(R):
        for k, v in r.items():
            if isinstance(v, dict) and "error" in v:
                errs[f"r{i}.{k}"] = v["error"][-600:]
    if errs:
        out["errors"] = errs
    out["versions"] = {k: next((get(r, k, "versions") for r in R if get(r, k, "versions")), None) for k in keys}



def snapshot(rev: str) -> tuple[str, dict]:
    """(PYTHONPATH root holding zephon_columnar, source id) for the code ours runs."""
    import io
    import subprocess
    import tarfile

    if rev == "worktree":
        return str(REPO), dict(PP._source_id(), snapshot="worktree")
    sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", rev + "^{commit}"],
                         capture_output=True, text=True, check=True).stdout.strip()
    root = HERE / "data" / "_snap" / sha[:12]
    if not (root / "zephon_columnar" / "__init__.py").exists():
        blob = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", sha, "zephon_columnar"],
                              capture_output=True, check=True).stdout
        root.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(blob)) as tf:
            tf.extractall(root)
    h = hashlib.sha1()
    for f in sorted((root / "zephon_columnar").rglob("*.py")):
        h.update(str(f.relative_to(root)).encode())
        h.update(f.read_bytes())
    subject = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%h %ci %s", sha],
                             capture_output=True, text=True).stdout.strip()
    return str(root), {"snapshot": sha[:12], "commit": subject, "path": str(root), "sources_sha1": h.hexdigest()[:12]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--job", choices=["text", "pretok"], help="required (except with --resummarize)")
    ap.add_argument("--corpus", default=str(HERE / "data" / "small"))
    ap.add_argument("--tokenizer", default=str(HERE / "data" / "tok32k"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--chunk-size", type=int, default=1024)
    ap.add_argument("--ours", action="append", default=None, metavar="NAME:KNOBS",
                    help="a variant of ours (repeatable); default per job: DEFAULT_OURS")
    ap.add_argument("--knob-sweep", action="store_true",
                    help="text job: ours in every KNOB_SWEEP setting + the limit (no zephon, no minimal)")
    ap.add_argument("--no-zephon", action="store_true")
    ap.add_argument("--no-minimal", action="store_true", help="text job: skip limit.py's e2e reference")
    ap.add_argument("--zephon-tok-par", type=int, default=2)
    ap.add_argument("--z-python", default=str(HERE / ".venv-zephon" / "bin" / "python"))
    ap.add_argument("--zc-python", default=sys.executable)
    ap.add_argument("--ours-module", default="zephon_columnar")
    ap.add_argument("--snapshot", default="HEAD",
                    help="which zephon_columnar ours runs: a git rev (default HEAD: the committed package, "
                         "extracted to benchmarks/data/_snap/<sha>/ so edits made during the run do not "
                         "leak in) or 'worktree' (the checkout as it is, uncommitted edits included)")
    ap.add_argument("--floor-reps", type=int, default=3)
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--keep-bytecode-env", action="store_true")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="set in every child (ours, Zephon, the limit), e.g. ARROW_DEFAULT_MEMORY_POOL=jemalloc")
    ap.add_argument("--shared-bench", default=PP.SHARED_BENCH)
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--resummarize", metavar="FILE",
                    help="recompute the ratios/summary of a saved output line (after a change to this script) "
                         "and print the updated line")
    ap.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    ap.add_argument("--module", default="zephon_columnar", help=argparse.SUPPRESS)
    ap.add_argument("--tok-par", default="", help=argparse.SUPPRESS)
    ap.add_argument("--max-workers", default="", help=argparse.SUPPRESS)
    ap.add_argument("--fetch-max-batch", default="", help=argparse.SUPPRESS)
    ap.add_argument("--fetch-par", default="", help=argparse.SUPPRESS)
    ap.add_argument("--runner", default="", help=argparse.SUPPRESS)
    ap.add_argument("--prefetch-batches", default="", help=argparse.SUPPRESS)
    ap.add_argument("--preimport", default="", help=argparse.SUPPRESS)
    ap.add_argument("--explain", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.resummarize:
        out = json.loads(Path(a.resummarize).read_text().strip().splitlines()[-1])
        summarize(out)
        print(json.dumps(out))
        return
    if not a.job:
        ap.error("--job text|pretok is required")
    a.corpus = os.path.abspath(a.corpus)
    a.tokenizer = os.path.abspath(a.tokenizer)
    if a.knob_sweep and not a.child:
        a.ours = a.ours or KNOB_SWEEP
        a.no_zephon = a.no_minimal = True
    if a.child:
        print(json.dumps(CHILDREN[a.child](a)))
        return

    me = str(Path(__file__).resolve())
    src_root, src_id = snapshot(a.snapshot)
    base_env = dict(os.environ)
    if not a.keep_bytecode_env:
        base_env.pop("PYTHONDONTWRITEBYTECODE", None)
        base_env["PYTHONPYCACHEPREFIX"] = str(HERE / "data" / ".pycache")
    for k in LIMIT_ENV:
        base_env.pop(k, None)
    child_env = dict(kv.split("=", 1) for kv in a.env)
    base_env.update(child_env)
    env_limit = dict(base_env, **LIMIT_ENV)
    pp = [p for p in base_env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) != str(REPO)]
    env_ours_base = dict(base_env, PYTHONPATH=os.pathsep.join([src_root] + pp))
    env_z = dict({k: v for k, v in base_env.items() if k != "PYTHONPATH"}, **LIMIT_ENV)
    have_z = not a.no_zephon and bool(a.z_python) and os.path.exists(a.z_python)
    common = ["--job", a.job, "--corpus", a.corpus, "--tokenizer", a.tokenizer]
    notes = []

    # name -> (cmd, env, description)
    variants: dict[str, tuple[list[str], dict, dict]] = {}
    for spec in (a.ours or DEFAULT_OURS[a.job]):
        name, kn = parse_knobs(spec)
        env = dict(env_ours_base)
        for key, var in (("r", "RAYON_NUM_THREADS"), ("tp", "TOKENIZERS_PARALLELISM")):
            v = kn.get(key, LIMIT_ENV[var] if var == "RAYON_NUM_THREADS" else "true")
            if v == "unset":
                env.pop(var, None)
            else:
                env[var] = v
        chunk = kn.get("chunk", str(a.chunk_size))
        cmd = [a.zc_python, me, "--child", "throughput", "--module", a.ours_module, *common,
               "--chunk-size", chunk, "--tok-par", kn.get("p", ""), "--max-workers", kn.get("w", ""),
               "--fetch-max-batch", kn.get("mb", ""), "--fetch-par", kn.get("fp", ""),
               "--runner", kn.get("runner", ""), "--prefetch-batches", kn.get("pb", ""), "--explain"]
        desc = {"tokenize_parallelism": kn.get("p", "default") if a.job == "text" else None,
                "max_workers": kn.get("w", "default"), "fetch_max_batch": kn.get("mb", "default"),
                "fetch_parallelism": kn.get("fp", "default"), "runner": kn.get("runner", "default"),
                "prefetch_batches": kn.get("pb", "default"), "chunk_size": int(chunk),
                "RAYON_NUM_THREADS": env.get("RAYON_NUM_THREADS", "unset"),
                "TOKENIZERS_PARALLELISM": env.get("TOKENIZERS_PARALLELISM", "unset")}
        variants[name] = (cmd, env, desc)
    if "ours" not in variants:
        raise SystemExit("one --ours variant must be named 'ours' (the headline)")
    if have_z:
        zcmd = [a.z_python, me, "--child", "throughput", "--module", "zephon", *common,
                "--chunk-size", str(a.chunk_size), "--preimport", "transformers"]
        zdesc = {"RAYON_NUM_THREADS": env_z["RAYON_NUM_THREADS"],
                 "TOKENIZERS_PARALLELISM": env_z["TOKENIZERS_PARALLELISM"], "chunk_size": a.chunk_size}
        if a.job == "text":
            zcmd += ["--tok-par", str(a.zephon_tok_par)]
            zdesc["tokenize_parallelism"] = a.zephon_tok_par
        variants["zephon"] = (zcmd, env_z, zdesc)
    elif not a.no_zephon:
        notes.append(f"Zephon skipped: {a.z_python!r} does not exist (set up benchmarks/.venv-zephon, README.md)")
    if a.job == "text":
        variants["limit"] = ([a.zc_python, me, "--child", "limit", *common], env_limit,
                             {"what": "encode_batch_fast, calls of 1024 docs", **LIMIT_ENV})
        if not a.no_minimal:
            variants["minimal"] = ([a.zc_python, me, "--child", "minimal", *common, "--shared-bench",
                                    a.shared_bench], env_limit, {"what": "limit.py e2e", **LIMIT_ENV})
    else:
        variants["limit"] = ([a.zc_python, me, "--child", "floor", *common, "--floor-reps", str(a.floor_reps)],
                             base_env, {"what": "pyarrow read_table + list_flatten of <corpus>/pretok"})
    keys = list(variants)

    out = {"bench": f"tokpack-{a.job}", "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": PP._machine(),
           "settings": {"job": a.job, "corpus": a.corpus, "tokenizer": a.tokenizer, "rows_of": L, "batch": B,
                        "chunk_size": a.chunk_size, "seed": 42, "rounds": a.rounds,
                        "zephon_tok_par": a.zephon_tok_par if a.job == "text" else None,
                        "bytecode": ("inherited" if a.keep_bytecode_env else
                                     "PYTHONPYCACHEPREFIX=" + base_env["PYTHONPYCACHEPREFIX"]),
                        "zc_python": a.zc_python, "z_python": a.z_python if have_z else None,
                        "child_env": child_env,
                        "variants": {k: v[2] for k, v in variants.items()}},
           "ours_source": src_id, "notes": notes, "rounds": []}
    print(f"[tokpack {a.job}] {a.corpus}: variants={keys}, rounds={a.rounds}", file=sys.stderr)

    def run(k: str) -> dict:
        cmd, env, _ = variants[k]
        t = time.time()
        r = PP._run(cmd, env, a.timeout)
        r["wall_process_s"] = round(time.time() - t, 2)
        return r

    def brief(v: dict):
        if "error" in v:
            return "ERROR " + v["error"][-200:]
        return f"{v.get('tokens_per_s', 0) / 1e6:.3f}M/s cpu/Mtok {v.get('cpu_s_per_mtok', 0):.3f}"

    if not a.no_warmup:
        t = time.time()
        out["warmup"] = {}
        for k in keys:
            r = run(k)
            out["warmup"][k] = {"tokens_per_s": r.get("tokens_per_s"), "error": r.get("error", "")[-400:] or None}
            if k == "ours":
                out["ours_explain"] = r.get("explain")
                out["ours_lazy_imports"] = r.get("lazy_imports")
        print(f"[warm-up, discarded, {time.time() - t:.0f} s] "
              f"{json.dumps({k: v['tokens_per_s'] and round(v['tokens_per_s']) for k, v in out['warmup'].items()})}",
              file=sys.stderr)
    for rnd in range(a.rounds):
        t_round = time.time()
        res: dict = {"loadavg": open("/proc/loadavg").read().split()[:3]}
        order = keys[rnd % len(keys):] + keys[: rnd % len(keys)]
        res["order"] = order
        for k in order:
            res[k] = run(k)
            res[k].pop("explain", None)
            res[k].pop("lazy_imports", None)
            print(f"  [r{rnd}] {k}: {brief(res[k])}", file=sys.stderr)
        res["round_s"] = round(time.time() - t_round, 1)
        out["rounds"].append(res)
        print(f"[round {rnd}] {res['round_s']} s, load {res['loadavg']}", file=sys.stderr)

    summarize(out)
    out["machine"]["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
