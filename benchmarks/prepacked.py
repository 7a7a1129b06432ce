#!/usr/bin/env python3
"""Prepacked job: zephon_columnar vs Zephon 0.2.0 vs the physical floor, interleaved, as ratios.

The job (same code for both libraries, as in ../shared/bench/compare.py --job prepacked):

    ds = Dataset.from_path("train", "<corpus>/prepacked")        # rows of exactly 2048 int32 ids
    ws = StaticMixtureWorkSource(datasets=[ds], mixture=MixtureSpec({"train": 1.0}),
                                 seed=42, chunk_size=1024)
    for b in Pipeline(ws).batch(8):
        tr = b.to_training(return_padding_mask=True)             # input_ids int64 [8, 2048]

Each round runs, back to back, one fresh process for each of (order rotated per round):

  ours / zephon  throughput: tokens/s (real = non-pad tokens received), CPU s per Mtok,
                 peak RSS (ru_maxrss of the process + peak of any child processes), RSS after
                 imports, first-batch time.  The clock starts after the imports.
  floor          pyarrow.parquet.read_table(use_threads=True) of the same prepacked files +
                 pc.list_flatten into one contiguous int32 numpy buffer (limit.py's pretok part),
                 first pass in a fresh process after imports (headline) and the median of
                 --floor-reps passes (warm, reported too).  read_table's lazy
                 `import pyarrow.dataset` (~0.2 s, pulls in pandas where installed) is timed
                 separately and excluded from the floor (reported as *_incl_lazy_import).
  diagnostics    ours_preimport: ours with the modules it imports lazily during its first pass
                 (recorded in the warm-up round) imported before the clock; ours_zenv: ours run
                 by the Zephon venv's Python (no pandas there); ours_warm / zephon_warm: passes
                 2..N in the same process (steady state).  --no-controls drops them.
  resume         per library: a "save" child iterates K batches, calls checkpoint(), writes it
                 to a file (JSON when the state is JSON-serializable, else pickle) and records
                 the hash of batch K+1; a "restore" child (fresh process) times build +
                 restore() + first batch and checks that batch == batch K+1; a "cold" child
                 (fresh process) times build + first batch.  Ratio = (build + load + restore +
                 first batch) / (build + first batch).

Zephon runs with the Python of --z-python (default benchmarks/.venv-zephon/bin/python); it is
skipped with a note when that interpreter does not exist.  zephon_columnar runs with --zc-python
(default: this interpreter) and PYTHONPATH=<repo root>.

Prints progress to stderr and ONE JSON line to stdout: per-round figures, per-round ratios and
their medians.  Usage (from the repo root):

    PYTHONPATH=. .venv/bin/python benchmarks/prepacked.py --corpus benchmarks/data/small --rounds 7

A discarded warm-up round runs first.  Children cache bytecode under benchmarks/data/.pycache
(PYTHONPYCACHEPREFIX; the sandbox sets PYTHONDONTWRITEBYTECODE=1) unless --keep-bytecode-env.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import pickle
import platform
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
L, B = 2048, 8
# The shared benchmark tools (corpus, tokenizer, limit.py, compare.py): ZC_SHARED_BENCH, else the
# `shared/bench` folder next to this checkout (where the workplace keeps it).
SHARED_BENCH = os.environ.get("ZC_SHARED_BENCH", str(REPO.parent / "shared" / "bench"))


# ------------------------------------------------------------------ helpers (children)

def _rss_kb(pid: int | str = "self") -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _descendants(root: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            kids.setdefault(ppid, []).append(int(d))
        except (OSError, ValueError, IndexError):
            continue
    out, stack = [], list(kids.get(root, []))
    while stack:
        p = stack.pop()
        out.append(p)
        stack.extend(kids.get(p, []))
    return out


class ChildRssSampler(threading.Thread):
    """Peak of the summed VmRSS of this process's descendants (0 when there are none).

    The process's own peak comes from ru_maxrss (exact, kernel-tracked); this sampler only
    matters for loaders that start worker processes.  Samples every 0.1 s.
    """

    def __init__(self, interval: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.interval, self.peak_kb, self.n_children_max = interval, 0, 0
        self._halt = threading.Event()

    def _sample(self) -> None:
        kids = _descendants(os.getpid())
        self.n_children_max = max(self.n_children_max, len(kids))
        self.peak_kb = max(self.peak_kb, sum(_rss_kb(p) for p in kids))

    def run(self) -> None:
        while not self._halt.is_set():
            self._sample()
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join()
        self._sample()


def _cpu_s() -> float:
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def _versions() -> dict:
    v = {"python": platform.python_version()}
    for m in ("torch", "pyarrow", "numpy", "polars", "zephon", "zephon_columnar"):
        mod = sys.modules.get(m)
        if mod is not None:
            v[m] = getattr(mod, "__version__", "?")
    return v


def _import_lib(module: str):
    import importlib

    import torch  # noqa: F401  (both libraries hand torch tensors over; import before the clock)

    return importlib.import_module(module)


def _build(Z, corpus: str, chunk_size: int):
    ds = Z.Dataset.from_path("train", os.path.join(corpus, "prepacked"))
    ws = Z.StaticMixtureWorkSource(datasets=[ds], mixture=Z.MixtureSpec({"train": 1.0}), seed=42,
                                   chunk_size=chunk_size)
    return Z.Pipeline(ws).batch(B)


def _real_tokens(tr) -> int:
    ids = tr["input_ids"]
    assert tuple(ids.shape) == (B, L), ids.shape
    pad = tr.get("padding_mask")
    return int(ids.numel() - (int(pad.sum()) if pad is not None else 0))


def _hash(tr) -> str:
    return hashlib.sha1(tr["input_ids"].numpy().tobytes()).hexdigest()[:16]


# ------------------------------------------------------------------ children

def child_throughput(a) -> dict:
    import importlib

    Z = _import_lib(a.module)
    t_pre = time.perf_counter()
    for m in filter(None, a.preimport.split(",")):
        try:
            importlib.import_module(m)
        except ImportError:
            pass
    preimport_s = time.perf_counter() - t_pre
    rss_imports = _rss_kb() / 1024
    before = set(sys.modules)
    sampler = ChildRssSampler()
    sampler.start()
    t0 = time.perf_counter()
    c0 = _cpu_s()
    pipe = _build(Z, a.corpus, a.chunk_size)
    tokens = batches = 0
    first = None
    for b in pipe:
        tr = b.to_training(return_padding_mask=True)
        tokens += _real_tokens(tr)
        batches += 1
        if first is None:
            first = time.perf_counter() - t0
    wall = time.perf_counter() - t0
    cpu = _cpu_s() - c0
    sampler.stop()
    self_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    lazy = sorted(m for m in set(sys.modules) - before)
    warm = []  # later passes in the same process (a fresh pipeline each): no one-time costs left
    for _ in range(a.passes - 1):
        t1, c1 = time.perf_counter(), _cpu_s()
        n = sum(_real_tokens(b.to_training(return_padding_mask=True)) for b in _build(Z, a.corpus, a.chunk_size))
        warm.append((n / (time.perf_counter() - t1), (_cpu_s() - c1) / (n / 1e6)))
    extra = {}
    if warm:
        extra = {"warm_tokens_per_s": statistics.median(w[0] for w in warm),
                 "warm_cpu_s_per_mtok": statistics.median(w[1] for w in warm),
                 "warm_passes_tokens_per_s": [w[0] for w in warm]}
    return {"module": a.module, "preimport_s": preimport_s, "lazy_imports_n": len(lazy),
            "lazy_imports": [m for m in lazy if m.count(".") <= 1 and not m.startswith(a.module)],
            "tokens": tokens, "batches": batches, "seconds": wall,
            "tokens_per_s": tokens / wall, "cpu_s": cpu, "cpu_s_per_mtok": cpu / (tokens / 1e6),
            "first_batch_s": first, "rss_after_imports_mb": rss_imports,
            "peak_rss_mb": self_peak + sampler.peak_kb / 1024, "peak_rss_self_mb": self_peak,
            "peak_rss_children_mb": sampler.peak_kb / 1024, "child_processes": sampler.n_children_max,
            "versions": _versions(), **extra}


def child_floor(a) -> dict:
    return floor_of(sorted(glob.glob(os.path.join(a.corpus, "prepacked", "*.parquet"))), a.floor_reps)


def floor_of(files: list[str], reps: int) -> dict:
    """The read + flatten floor of ``files`` (an ``input_ids`` list<int32> column): ``reps``
    passes of ``pq.read_table(use_threads=True)`` + ``list_flatten`` into one int32 buffer."""
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    # pq.read_table imports pyarrow.dataset (and pandas) on its first call: ~0.4 s here, which is
    # not physical work.  Time it separately; the floor is the first pass after it.
    c_imp = _cpu_s()
    t_imp = time.perf_counter()
    import pyarrow.dataset  # noqa: F401

    lazy_import_s = time.perf_counter() - t_imp
    lazy_import_cpu = _cpu_s() - c_imp
    times, n_tok = [], 0
    c0 = _cpu_s()
    cpu_first = None
    for _ in range(reps):
        t0 = time.perf_counter()
        tables = [pq.read_table(f, columns=["input_ids"], use_threads=True) for f in files]
        parts = [pc.list_flatten(ch).to_numpy(zero_copy_only=True)
                 for t in tables for ch in t.column("input_ids").chunks]
        buf = np.concatenate(parts)
        assert buf.dtype == np.int32
        times.append(time.perf_counter() - t0)
        if cpu_first is None:
            cpu_first = _cpu_s() - c0
        n_tok = int(buf.size)
        del tables, parts, buf
    return {"tokens": n_tok, "seconds": times, "lazy_import_s": lazy_import_s,
            "tokens_per_s": n_tok / times[0],
            "tokens_per_s_incl_lazy_import": n_tok / (times[0] + lazy_import_s),
            "tokens_per_s_warm_median": n_tok / statistics.median(times),
            "cpu_s_per_mtok": cpu_first / (n_tok / 1e6),
            "cpu_s_per_mtok_incl_lazy_import": (cpu_first + lazy_import_cpu) / (n_tok / 1e6),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "versions": _versions()}


def child_save(a) -> dict:
    Z = _import_lib(a.module)
    pipe = _build(Z, a.corpus, a.chunk_size)
    it = iter(pipe)
    for _ in range(a.ckpt_after):
        next(it).to_training(return_padding_mask=True)
    t0 = time.perf_counter()
    state = pipe.checkpoint()
    ckpt_s = time.perf_counter() - t0
    nxt = _hash(next(it).to_training(return_padding_mask=True))
    if hasattr(it, "close"):
        it.close()
    try:
        blob = json.dumps(state).encode()
        fmt = "json"
    except (TypeError, ValueError):
        blob = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
        fmt = "pickle"
    Path(a.ckpt_file).write_bytes(blob)
    return {"checkpoint_s": ckpt_s, "format": fmt, "bytes": len(blob), "after_batches": a.ckpt_after,
            "next_batch_hash": nxt}


def _load_ckpt(path: str):
    blob = Path(path).read_bytes()
    try:
        return json.loads(blob)
    except (UnicodeDecodeError, ValueError):
        return pickle.loads(blob)


def child_restore(a) -> dict:
    Z = _import_lib(a.module)
    t0 = time.perf_counter()
    pipe = _build(Z, a.corpus, a.chunk_size)
    t1 = time.perf_counter()
    state = _load_ckpt(a.ckpt_file)
    pipe.restore(state)
    t2 = time.perf_counter()
    it = iter(pipe)
    tr = next(it).to_training(return_padding_mask=True)
    t3 = time.perf_counter()
    h = _hash(tr)
    if hasattr(it, "close"):
        it.close()
    return {"build_s": t1 - t0, "load_restore_s": t2 - t1, "first_batch_after_restore_s": t3 - t2,
            "total_s": t3 - t0, "first_hash": h}


def child_cold(a) -> dict:
    Z = _import_lib(a.module)
    t0 = time.perf_counter()
    pipe = _build(Z, a.corpus, a.chunk_size)
    t1 = time.perf_counter()
    it = iter(pipe)
    tr = next(it).to_training(return_padding_mask=True)
    t2 = time.perf_counter()
    if hasattr(it, "close"):
        it.close()
    return {"build_s": t1 - t0, "first_batch_s": t2 - t1, "total_s": t2 - t0, "first_hash": _hash(tr)}


CHILDREN = {"throughput": child_throughput, "floor": child_floor, "save": child_save,
            "restore": child_restore, "cold": child_cold}


# ------------------------------------------------------------------ parent

def _run(cmd: list[str], env: dict, timeout: int) -> dict:
    t0 = time.time()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout}s"}
    if r.returncode != 0:
        return {"error": (r.stderr or r.stdout).strip()[-1500:], "wall_s": time.time() - t0}
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"error": "no JSON line: " + (r.stdout + r.stderr)[-800:]}


def _ensure_prepacked(corpus: str, shared_bench: str) -> None:
    if any(Path(corpus, "prepacked").glob("*.parquet")):
        return
    sys.path.insert(0, shared_bench)
    import compare  # ../shared/bench/compare.py: rows of exactly 2048 int32 ids from <corpus>/pretok

    compare.ensure_prepacked(corpus)


def _med(xs):
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 4) if xs else None


def _r(x, nd=3):
    return None if x is None else round(x, nd)


def _machine() -> dict:
    m = {"cpus": os.cpu_count(), "platform": platform.platform()}
    try:
        with open("/proc/meminfo") as fh:
            m["mem_gib"] = round(int(fh.readline().split()[1]) / 2**20, 1)
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    m["cpu_model"] = line.split(":", 1)[1].strip()
                    break
        m["loadavg_start"] = open("/proc/loadavg").read().split()[:3]
    except OSError:
        pass
    return m


def _source_id() -> dict:
    """What code "ours" ran: git HEAD, dirty files under the package, sha1 of its sources."""
    d: dict = {}
    try:
        d["git_head"] = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                       capture_output=True, text=True).stdout.strip()
        d["dirty"] = subprocess.run(["git", "-C", str(REPO), "status", "--short", "--", "zephon_columnar"],
                                    capture_output=True, text=True).stdout.split("\n")[:40]
        d["dirty"] = [x.strip() for x in d["dirty"] if x.strip()]
    except OSError:
        pass
    h = hashlib.sha1()
    for f in sorted((REPO / "zephon_columnar").rglob("*.py")):
        h.update(str(f.relative_to(REPO)).encode())
        h.update(f.read_bytes())
    d["sources_sha1"] = h.hexdigest()[:12]
    return d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=str(HERE / "data" / "small"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--chunk-size", type=int, default=1024)
    ap.add_argument("--ckpt-after", default="half",
                    help="batches consumed before checkpoint(): an int, or 'half' (half of what the "
                         "library delivered in its throughput run of the same round)")
    ap.add_argument("--floor-reps", type=int, default=3)
    ap.add_argument("--zc-python", default=sys.executable)
    ap.add_argument("--z-python", default=str(HERE / ".venv-zephon" / "bin" / "python"))
    ap.add_argument("--ours-module", default="zephon_columnar")
    ap.add_argument("--no-resume", action="store_true")
    ap.add_argument("--no-controls", action="store_true",
                    help="skip the diagnostic variants ours_preimport, ours_zenv, ours_warm, zephon_warm")
    ap.add_argument("--warm-passes", type=int, default=2,
                    help="passes after the first in the *_warm variants (their median is reported)")
    ap.add_argument("--keep-bytecode-env", action="store_true",
                    help="leave PYTHONDONTWRITEBYTECODE as is (default: children cache bytecode under "
                         "benchmarks/data/.pycache via PYTHONPYCACHEPREFIX, as a pip install would)")
    ap.add_argument("--shared-bench", default=SHARED_BENCH)
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    ap.add_argument("--module", default="zephon_columnar", help=argparse.SUPPRESS)
    ap.add_argument("--ckpt-file", default="", help=argparse.SUPPRESS)
    ap.add_argument("--preimport", default="", help=argparse.SUPPRESS)
    ap.add_argument("--passes", type=int, default=1, help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.corpus = os.path.abspath(a.corpus)
    if a.child:
        if a.child in ("save",):
            a.ckpt_after = int(a.ckpt_after)
        print(json.dumps(CHILDREN[a.child](a)))
        return

    _ensure_prepacked(a.corpus, a.shared_bench)
    files = sorted(glob.glob(os.path.join(a.corpus, "prepacked", "*.parquet")))
    me = str(Path(__file__).resolve())
    # Environment: as ../shared/bench/compare.py does for the prepacked job, the children inherit
    # the caller's environment (no tokenization in this job, so RAYON_NUM_THREADS does not matter;
    # it is recorded).  Ours gets the repo on PYTHONPATH; Zephon's venv gets no PYTHONPATH.
    # Bytecode: this sandbox sets PYTHONDONTWRITEBYTECODE=1, so a source checkout recompiles every
    # module it imports in every process while pip-installed Zephon has .pyc files.  Unless
    # --keep-bytecode-env, children cache bytecode in benchmarks/data/.pycache (nothing is written
    # into the source tree) and a discarded warm-up round fills that cache and the page cache.
    base_env = dict(os.environ)
    if not a.keep_bytecode_env:
        base_env.pop("PYTHONDONTWRITEBYTECODE", None)
        base_env["PYTHONPYCACHEPREFIX"] = str(HERE / "data" / ".pycache")
    env_ours = dict(base_env, PYTHONPATH=os.pathsep.join([str(REPO)] + [p for p in base_env.get(
        "PYTHONPATH", "").split(os.pathsep) if p]))
    env_z = {k: v for k, v in base_env.items() if k != "PYTHONPATH"}
    have_z = bool(a.z_python) and os.path.exists(a.z_python)
    notes = []
    # name -> (python, module, env, extra args): the throughput variants
    variants: dict[str, tuple] = {"ours": (a.zc_python, a.ours_module, env_ours, [])}
    if not a.no_controls:
        variants["ours_preimport"] = (a.zc_python, a.ours_module, env_ours, None)  # list filled after warm-up
        if have_z:
            variants["ours_zenv"] = (a.z_python, a.ours_module, env_ours, [])
    if have_z:
        variants["zephon"] = (a.z_python, "zephon", env_z, [])
    if not a.no_controls:
        variants["ours_warm"] = (a.zc_python, a.ours_module, env_ours, ["--passes", str(a.warm_passes + 1)])
        if have_z:
            variants["zephon_warm"] = (a.z_python, "zephon", env_z, ["--passes", str(a.warm_passes + 1)])
    if not have_z:
        notes.append(f"Zephon skipped: {a.z_python!r} does not exist (set up benchmarks/.venv-zephon, README.md)")
    resume_libs = [k for k in ("ours", "zephon") if k in variants]
    common = ["--corpus", a.corpus, "--chunk-size", str(a.chunk_size)]

    def lib_cmd(name: str, child: str, extra: list[str] | None = None):
        py, mod, env, _ = variants[name]
        return [py, me, "--child", child, "--module", mod] + common + (extra or []), env

    def run_variant(k: str) -> dict:
        if k == "floor":
            return _run([a.zc_python, me, "--child", "floor", "--floor-reps", str(a.floor_reps)] + common,
                        base_env, a.timeout)
        cmd, env = lib_cmd(k, "throughput", variants[k][3] or [])
        return _run(cmd, env, a.timeout)

    out = {"bench": "prepacked", "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": _machine(),
           "settings": {"corpus": a.corpus, "files": len(files), "rows_of": L, "batch": B,
                        "chunk_size": a.chunk_size, "seed": 42, "rounds": a.rounds,
                        "ckpt_after": a.ckpt_after, "floor_reps": a.floor_reps,
                        "RAYON_NUM_THREADS": os.environ.get("RAYON_NUM_THREADS"),
                        "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM"),
                        "bytecode": ("inherited" if a.keep_bytecode_env else
                                     "PYTHONPYCACHEPREFIX=" + base_env["PYTHONPYCACHEPREFIX"]),
                        "zc_python": a.zc_python, "z_python": a.z_python if have_z else None},
           "ours_source": _source_id(), "notes": notes, "rounds": []}
    tp_keys = list(variants) + ["floor"]
    print(f"[prepacked] {len(files)} files, variants={tp_keys}, rounds={a.rounds}", file=sys.stderr)

    # warm-up (discarded): page cache, bytecode cache; and the third-party modules ours imports
    # lazily during its first pass, which ours_preimport then imports before its clock starts.
    warm = {k: run_variant(k) for k in tp_keys if k != "ours_preimport" and not k.endswith("_warm")}
    lazy = warm.get("ours", {}).get("lazy_imports", [])
    if "ours_preimport" in variants:
        variants["ours_preimport"] = variants["ours_preimport"][:3] + (["--preimport", ",".join(lazy)],)
    out["warmup"] = {k: (_r(v.get("tokens_per_s"), 0) if "error" not in v else v["error"][-300:])
                     for k, v in warm.items()}
    out["ours_lazy_imports"] = lazy
    print(f"[warm-up] {json.dumps(out['warmup'])}; ours imports lazily: {lazy}", file=sys.stderr)

    ckpt_dir = HERE / "data" / "_bench_ckpt"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    for rnd in range(a.rounds):
        t_round = time.time()
        res: dict = {"loadavg": open("/proc/loadavg").read().split()[:3]}
        order = tp_keys[rnd % len(tp_keys):] + tp_keys[: rnd % len(tp_keys)]
        for k in order:
            res[k] = run_variant(k)
            res[k].pop("lazy_imports", None)  # listed once, from the warm-up, in "ours_lazy_imports"
        if not a.no_resume:
            for k in (resume_libs if rnd % 2 == 0 else resume_libs[::-1]):
                tp = res.get(k, {})
                if a.ckpt_after == "half":
                    if "batches" not in tp:
                        res[f"{k}_resume"] = {"error": "throughput run failed; no K"}
                        continue
                    K = tp["batches"] // 2
                else:
                    K = int(a.ckpt_after)
                f = str(ckpt_dir / f"{k}.ckpt")
                r: dict = {"K": K}
                cmd, env = lib_cmd(k, "save", ["--ckpt-after", str(K), "--ckpt-file", f])
                r["save"] = _run(cmd, env, a.timeout)
                if "error" not in r["save"]:
                    # cold and restore back to back, alternating which goes first
                    for c in (["cold", "restore"] if rnd % 2 == 0 else ["restore", "cold"]):
                        cmd, env = lib_cmd(k, c, ["--ckpt-file", f])
                        r[c] = _run(cmd, env, a.timeout)
                    if "error" not in r["restore"] and "error" not in r["cold"]:
                        r["restore_over_cold"] = r["restore"]["total_s"] / r["cold"]["total_s"]
                        r["resume_matches"] = r["restore"]["first_hash"] == r["save"]["next_batch_hash"]
                res[f"{k}_resume"] = r
        res["round_s"] = round(time.time() - t_round, 1)
        out["rounds"].append(res)
        brief = {k: (_r(v.get("tokens_per_s"), 0) if "error" not in v else "ERROR")
                 for k, v in res.items() if isinstance(v, dict) and k in tp_keys}
        brief.update({k: (_r(v.get("restore_over_cold")) if "error" not in v else "ERROR")
                      for k, v in res.items() if k.endswith("_resume")})
        print(f"[round {rnd}] {json.dumps(brief)} ({res['round_s']} s)", file=sys.stderr)

    # ---------------------------------------------------------------- ratios, per round
    def get(r, k, f):
        v = r.get(k, {})
        return None if (not isinstance(v, dict) or "error" in v or v.get(f) is None) else v[f]

    def ratio(r, k1, f1, k2, f2):
        x, y = get(r, k1, f1), get(r, k2, f2)
        return None if (x is None or not y) else x / y

    R = out["rounds"]
    per_round = {
        "ours_over_floor_tok_s": [ratio(r, "ours", "tokens_per_s", "floor", "tokens_per_s") for r in R],
        "ours_over_floor_cpu_per_tok": [ratio(r, "ours", "cpu_s_per_mtok", "floor", "cpu_s_per_mtok") for r in R],
        "ours_over_floor_incl_lazy_import_tok_s": [
            ratio(r, "ours", "tokens_per_s", "floor", "tokens_per_s_incl_lazy_import") for r in R],
        "ours_restore_over_cold": [get(r, "ours_resume", "restore_over_cold") for r in R],
    }
    if "ours_warm" in variants:
        per_round["ours_warm_over_floor_warm_tok_s"] = [
            ratio(r, "ours_warm", "warm_tokens_per_s", "floor", "tokens_per_s_warm_median") for r in R]
        per_round["ours_warm_over_floor_cpu_per_tok"] = [
            ratio(r, "ours_warm", "warm_cpu_s_per_mtok", "floor", "cpu_s_per_mtok") for r in R]
    if "zephon_warm" in variants:
        per_round["ours_warm_over_zephon_warm_tok_s"] = [
            ratio(r, "ours_warm", "warm_tokens_per_s", "zephon_warm", "warm_tokens_per_s") for r in R]
    if "ours_preimport" in variants:
        per_round["ours_preimport_over_floor_tok_s"] = [
            ratio(r, "ours_preimport", "tokens_per_s", "floor", "tokens_per_s") for r in R]
    if have_z:
        per_round.update({
            "ours_over_zephon_tok_s": [ratio(r, "ours", "tokens_per_s", "zephon", "tokens_per_s") for r in R],
            "ours_over_zephon_cpu_per_tok": [ratio(r, "ours", "cpu_s_per_mtok", "zephon", "cpu_s_per_mtok")
                                             for r in R],
            "ours_over_zephon_peak_rss": [ratio(r, "ours", "peak_rss_mb", "zephon", "peak_rss_mb") for r in R],
            "ours_over_zephon_first_batch": [ratio(r, "ours", "first_batch_s", "zephon", "first_batch_s")
                                             for r in R],
            "zephon_over_floor_tok_s": [ratio(r, "zephon", "tokens_per_s", "floor", "tokens_per_s") for r in R],
            "zephon_restore_over_cold": [get(r, "zephon_resume", "restore_over_cold") for r in R],
        })
        if "ours_zenv" in variants:
            per_round.update({
                "ours_zenv_over_zephon_tok_s": [ratio(r, "ours_zenv", "tokens_per_s", "zephon", "tokens_per_s")
                                                for r in R],
                "ours_zenv_over_zephon_peak_rss": [ratio(r, "ours_zenv", "peak_rss_mb", "zephon", "peak_rss_mb")
                                                   for r in R],
                "ours_zenv_over_floor_tok_s": [ratio(r, "ours_zenv", "tokens_per_s", "floor", "tokens_per_s")
                                               for r in R],
            })
    out["per_round_ratios"] = {k: [_r(x) for x in v] for k, v in per_round.items()}
    figs = {}
    for k in tp_keys:
        for f in ("tokens_per_s", "cpu_s_per_mtok", "peak_rss_mb", "rss_after_imports_mb", "first_batch_s",
                  "preimport_s", "lazy_imports_n", "warm_tokens_per_s", "warm_cpu_s_per_mtok",
                  "tokens_per_s_warm_median", "tokens_per_s_incl_lazy_import",
                  "lazy_import_s"):
            vals = [get(r, k, f) for r in R]
            if any(v is not None for v in vals):
                nd = 3 if f in ("first_batch_s", "cpu_s_per_mtok", "lazy_import_s", "preimport_s",
                                "warm_cpu_s_per_mtok") else 0
                figs[f"{k}_{f}"] = [_r(v, nd) for v in vals]
        for f in ("tokens", "batches"):
            vals = [get(r, k, f) for r in R]
            if any(v is not None for v in vals):
                figs[f"{k}_{f}"] = vals[0]
    for k in resume_libs:
        kr = f"{k}_resume"
        rs = [r.get(kr, {}) for r in R]
        figs[f"{k}_ckpt_after_batches"] = [x.get("K") for x in rs]
        figs[f"{k}_restore_total_s"] = [_r(get(x, "restore", "total_s")) for x in rs]
        figs[f"{k}_restore_build_s"] = [_r(get(x, "restore", "build_s")) for x in rs]
        figs[f"{k}_restore_load_restore_s"] = [_r(get(x, "restore", "load_restore_s"), 4) for x in rs]
        figs[f"{k}_restore_first_batch_s"] = [_r(get(x, "restore", "first_batch_after_restore_s")) for x in rs]
        figs[f"{k}_cold_total_s"] = [_r(get(x, "cold", "total_s")) for x in rs]
        figs[f"{k}_cold_build_s"] = [_r(get(x, "cold", "build_s")) for x in rs]
        figs[f"{k}_cold_first_batch_s"] = [_r(get(x, "cold", "first_batch_s")) for x in rs]
        figs[f"{k}_checkpoint_s"] = [_r(get(x, "save", "checkpoint_s"), 5) for x in rs]
        figs[f"{k}_ckpt_bytes"] = [get(x, "save", "bytes") for x in rs]
        figs[f"{k}_ckpt_format"] = next((get(x, "save", "format") for x in rs if get(x, "save", "format")), None)
        figs[f"{k}_resume_matches"] = [x.get("resume_matches") for x in rs]
    out["per_round_figures"] = figs
    med = {k: _med(v) for k, v in per_round.items()}
    targets = {"ours_over_floor_tok_s": (">=", 0.70), "ours_over_zephon_peak_rss": ("<", 1.0),
               "ours_restore_over_cold": ("<=", 1.5)}
    out["summary"] = {
        "median_ratios": med,
        "targets": {k: {"target": f"{op} {t}", "median": med.get(k),
                        "met": (None if med.get(k) is None else
                                (med[k] >= t if op == ">=" else med[k] < t if op == "<" else med[k] <= t))}
                    for k, (op, t) in targets.items()},
        "median_tok_s": {k: _med([get(r, k, "tokens_per_s") for r in R]) for k in tp_keys},
        "median_warm_tok_s": {k: _med([get(r, k, "warm_tokens_per_s") for r in R])
                              for k in tp_keys if k.endswith("_warm")},
        "median_cpu_s_per_mtok": {k: _med([get(r, k, "cpu_s_per_mtok") for r in R]) for k in tp_keys},
        "median_peak_rss_mb": {k: _med([get(r, k, "peak_rss_mb") for r in R]) for k in variants},
        "median_first_batch_s": {k: _med([get(r, k, "first_batch_s") for r in R]) for k in variants},
        "median_restore_total_s": {k: _med(figs[f"{k}_restore_total_s"]) for k in resume_libs},
        "median_cold_total_s": {k: _med(figs[f"{k}_cold_total_s"]) for k in resume_libs},
        "delivered": {k: {"tokens": figs.get(f"{k}_tokens"), "batches": figs.get(f"{k}_batches")}
                      for k in tp_keys},
    }
    errs = {}
    for i, r in enumerate(R):
        for k, v in r.items():
            if isinstance(v, dict):
                if "error" in v:
                    errs[f"r{i}.{k}"] = v["error"][-600:]
                for kk, vv in v.items():
                    if isinstance(vv, dict) and "error" in vv:
                        errs[f"r{i}.{k}.{kk}"] = vv["error"][-600:]
    if errs:
        out["errors"] = errs
    out["versions"] = {k: next((get(r, k, "versions") for r in R if get(r, k, "versions")), None)
                       for k in tp_keys}
    out["machine"]["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
