#!/usr/bin/env python3
"""Scale benchmark: zephon_columnar against Zephon 0.2.0 as shards, datasets and lanes grow.

The job, the same code for both libraries (``Z`` is ``zephon_columnar`` or ``zephon``)::

    datasets = [Z.Dataset.from_path(name, folder, fmt="parquet") for name, folder in layout]
    ws = Z.StaticMixtureWorkSource(datasets, {name: 1.0 for name in names}, chunk_size=1024, seed=1,
                                   stop_after_passes=None, exhausted_policy="repeat")    # endless
    pipe = Z.Pipeline(ws).pack_flat(2048, algorithm="wrap").batch(8).options(canonical_replicas=LANES)
    it = iter(pipe); next(it) x 101; pipe.checkpoint()

Three dimensions (a cell is one dimension and one size):

  files     one dataset of N Parquet files (``files-N``), 1 lane
  datasets  an equal-weight mixture of M datasets of 2 files each (``datasets-M``), 1 lane
  lanes     one dataset of 100 files (``files-100``), ``canonical_replicas=LANES``

The data (``generate``): pre-tokenized Parquet under ``benchmarks/data/scale/``, one column
``input_ids`` list<int32> (ids < 32,000), 64 documents of 50-1,500 tokens per file (seeded numpy),
one row group per file.  Files live once in ``_pool/part-<i>.parquet`` (file ``i`` always has the
same content, seed ``i``) and the layouts hard-link them: ``files-N`` holds pool files 0..N-1,
``datasets-M/d<j>/`` pool files 2j and 2j+1.  Generation is incremental: a pool file or link that
exists is kept.  ``--distinct K`` caps the pool at K files (file i links pool file i mod K) to save
disk; the default (every file distinct) needs 20,000 files (3.8 GB) for the full run.

Per cell and loader, one FRESH process (ours: this interpreter with the repository on
``PYTHONPATH``; Zephon: ``--z-python``, default ``benchmarks/.venv-zephon/bin/python``) imports
torch and the library, then starts the clock and records:

  discovery_s        building the ``Dataset`` s (``Dataset.from_path`` for every folder)
  build_s            the work source and the pipeline (``StaticMixtureWorkSource`` ... ``options``)
  first_batch_s      ``iter()`` + the first batch (after discovery and build)
  first_batch_total_s  discovery + build + first batch (what a user waits for)
  next100_s          the 100 batches after the first (in a wide mixture most datasets are first
                     read here: each one's first row group is opened and decoded)
  steady100_s        the 100 batches after those (every dataset's row group already decoded)
  import_rss_mb      RSS after ``import torch`` and the library (``/proc/self/statm``)
  pandas_loaded      whether pandas was imported by the end (pyarrow imports it on its first
                     ``pa.array`` where it is installed: ~41 MB RSS, so both venvs should agree)
  peak_rss_mb        ``ru_maxrss`` of the process (neither library starts processes in this job)
  ckpt_bytes         ``len(json.dumps(pipe.checkpoint()))`` after the 101 batches, both libraries
                     (``ckpt_format`` says "json"; a state json cannot encode is pickled instead,
                     and ``ckpt_format`` says "pickle"); ``ckpt_pickle_bytes``: the same state
                     pickled (protocol 5), for comparison
  cpu_s              CPU seconds of the process after the imports (all threads); ``cpu_total_s``
                     includes the imports
  batch_shape, first_hash  the shape of ``to_training()["input_ids"]`` (checked to be [8, 2048])
                     and a hash of the first batch

One JSON line per cell and loader on stdout (flushed as it comes), progress on stderr.  A process
that outlives ``--timeout`` (default 600 s) is killed and recorded as a ``"status": "timeout"`` row;
a failing one as ``"status": "error"`` with the end of its stderr.  A discarded warm-up (both
loaders on ``files:100``) fills the page and bytecode caches first (``--no-warmup`` skips it);
children cache bytecode under ``benchmarks/data/.pycache``, as in ``prepacked.py``.

Usage (from the repository root; one benchmark process at a time on this 2-vCPU machine)::

    PY=.venv/bin/python
    $PY benchmarks/scale.py generate --cells "files:100,1000,10000 datasets:10,100,1000,10000"
    $PY benchmarks/scale.py run --cells "files:100,1000,10000 datasets:10,100,1000,10000 \\
        lanes:1,16,256,1024" > benchmarks/data/scale.jsonl
    $PY benchmarks/scale.py report benchmarks/data/scale.jsonl

``--cells`` takes space-separated ``dimension:size,size,...`` groups (the default is the list
above); ``run --loaders ours`` or ``zephon`` runs one side only; ``--rounds N`` repeats every cell
(the report takes medians).

Notes.  Neither library finds an ``index.json`` in these folders, so both discover by opening
every file's footer (Zephon 0.2.0 prints its "SLOW DATASET DISCOVERY" banner to the child's
stderr, which is discarded).  The first batches of ours and Zephon differ (their seeded shard
orders differ); the report says where they are identical.  Zephon's default runner and ours' run
as they are; nothing else is set.

How long (the 2-vCPU shared machine, load ~4-6): a process takes 4-9 s for files:100 and 1000,
datasets:10 and 100, lanes:1 and 16 (either loader); datasets:1000 11 s (ours) / 32 s (Zephon);
lanes:256 6 s / 33 s (Zephon's first batch alone 26 s).  Extrapolated: files:10000 under a minute
each; datasets:10000 1-3 min (ours) and 5 min to the 600 s timeout (Zephon: its first batch grew
13x from 100 to 1,000 datasets); lanes:1024 ~20 s (ours) and 3-7 min (Zephon: 76x from 16 to 256
lanes).  The full default ``run`` (24 processes with the warm-up) takes ~25-35 min, up to ~45 min
when Zephon's two widest cells run into the timeout.  ``generate`` writes ~130 pool files/s
(190 KB each): the full default set is 20,000 files, 3.8 GB, ~3 min.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import pickle
import resource
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DATA = HERE / "data" / "scale"
L, B = 2048, 8
NEXT_BATCHES = 100
DOCS_PER_FILE = 64
DOC_MIN, DOC_MAX = 50, 1500
VOCAB = 32_000
LANES_FILES = 100  # the lanes dimension reads files-100
DEFAULT_CELLS = "files:100,1000,10000 datasets:10,100,1000,10000 lanes:1,16,256,1024"
DIMENSIONS = ("files", "datasets", "lanes")


# ------------------------------------------------------------------ cells and layouts


def parse_cells(text: str) -> list[tuple[str, int]]:
    """``"files:100,1000 lanes:1,16"`` -> ``[("files", 100), ("files", 1000), ("lanes", 1), ...]``."""
    cells = []
    for group in text.split():
        dim, _, sizes = group.partition(":")
        if dim not in DIMENSIONS or not sizes:
            raise SystemExit(f"--cells: {group!r} is not DIMENSION:SIZE[,SIZE...] with DIMENSION in {DIMENSIONS}")
        try:
            cells += [(dim, int(s)) for s in sizes.split(",") if s]
        except ValueError as err:
            raise SystemExit(f"--cells: {group!r}: sizes must be integers") from err
    return cells


def layout_of(dim: str, size: int) -> str:
    """The data folder (under ``DATA``) a cell reads."""
    if dim == "files":
        return f"files-{size}"
    if dim == "datasets":
        return f"datasets-{size}"
    return f"files-{LANES_FILES}"


def datasets_of(layout: str) -> list[tuple[str, str]]:
    """``(name, folder)`` of every dataset of a generated layout."""
    root = DATA / layout
    if layout.startswith("files-"):
        return [("train", str(root))]
    return [(d.name, str(d)) for d in sorted(root.iterdir()) if d.is_dir()]


# ------------------------------------------------------------------ generate


def _write_pool_file(path: Path, index: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(index)
    lengths = rng.integers(DOC_MIN, DOC_MAX + 1, size=DOCS_PER_FILE)
    offsets = np.zeros(DOCS_PER_FILE + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    ids = rng.integers(0, VOCAB, size=int(offsets[-1]), dtype=np.int32)
    table = pa.table({"input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids))})
    tmp = path.with_suffix(".tmp")
    pq.write_table(table, tmp, row_group_size=DOCS_PER_FILE)
    os.replace(tmp, path)  # a killed run never leaves a half-written pool file behind


def _link(pool_index: int, dest: Path, distinct: int | None) -> int:
    """Hard-link pool file ``pool_index`` (mod ``distinct``) to ``dest``; 1 if a pool file was written."""
    if dest.exists():
        return 0
    i = pool_index % distinct if distinct else pool_index
    src = DATA / "_pool" / f"part-{i:06d}.parquet"
    wrote = 0
    if not src.exists():
        _write_pool_file(src, i)
        wrote = 1
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dest)
    except OSError:  # a file system without hard links: a copy, same bytes
        import shutil

        shutil.copyfile(src, dest)
    return wrote


def generate(cells: list[tuple[str, int]], distinct: int | None) -> None:
    (DATA / "_pool").mkdir(parents=True, exist_ok=True)
    for layout in sorted({layout_of(d, s) for d, s in cells}):
        t0, wrote, n = time.perf_counter(), 0, 0
        kind, _, size_s = layout.partition("-")
        size = int(size_s)
        if kind == "files":
            for i in range(size):
                wrote += _link(i, DATA / layout / f"part-{i:06d}.parquet", distinct)
                n += 1
        else:
            for j in range(size):
                for k in range(2):
                    wrote += _link(2 * j + k, DATA / layout / f"d{j:05d}" / f"part-{k}.parquet", distinct)
                    n += 1
        print(
            f"[generate] {layout}: {n} files ({wrote} new pool files) in {time.perf_counter() - t0:.1f} s",
            file=sys.stderr,
        )


# ------------------------------------------------------------------ the child (one cell, one loader)


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def child(a: argparse.Namespace) -> dict:
    import importlib

    import torch  # noqa: F401  (a trainer has torch loaded before its loader starts)

    Z = importlib.import_module(a.module)
    with open("/proc/self/statm") as fh:
        import_rss_mb = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    extra = json.loads(a.options) if a.options else {}
    names_folders = datasets_of(a.layout)
    c0, t0 = _cpu_s(), time.perf_counter()
    datasets = [Z.Dataset.from_path(name, folder, fmt="parquet") for name, folder in names_folders]
    t1 = time.perf_counter()
    ws = Z.StaticMixtureWorkSource(
        datasets,
        {name: 1.0 for name, _ in names_folders},
        chunk_size=1024,
        seed=1,
        stop_after_passes=None,
        exhausted_policy="repeat",
    )
    pipe = Z.Pipeline(ws).pack_flat(L, algorithm="wrap").batch(B).options(canonical_replicas=a.lanes, **extra)
    t2 = time.perf_counter()
    it = iter(pipe)
    ids = next(it).to_training(return_padding_mask=True)["input_ids"]
    t3 = time.perf_counter()
    shape = list(ids.shape)
    first_hash = hashlib.sha1(ids.numpy().tobytes()).hexdigest()[:16]
    for _ in range(NEXT_BATCHES):
        b = next(it).to_training(return_padding_mask=True)["input_ids"]
        if list(b.shape) != shape:
            raise AssertionError(f"batch shape {list(b.shape)} after a first batch of {shape}")
    t4 = time.perf_counter()
    for _ in range(NEXT_BATCHES):
        next(it).to_training(return_padding_mask=True)
    t5 = time.perf_counter()
    state = pipe.checkpoint()
    try:
        ckpt_bytes, ckpt_format = len(json.dumps(state)), "json"
    except (TypeError, ValueError):
        ckpt_bytes, ckpt_format = len(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)), "pickle"
    ckpt_pickle_bytes = len(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))
    cpu = _cpu_s() - c0
    r = resource.getrusage(resource.RUSAGE_SELF)
    if shape != [B, L]:
        raise AssertionError(f"batches of shape {shape}, expected [{B}, {L}]")
    return {
        "discovery_s": t1 - t0,
        "build_s": t2 - t1,
        "first_batch_s": t3 - t2,
        "first_batch_total_s": t3 - t0,
        "next100_s": t4 - t3,
        "steady100_s": t5 - t4,
        "import_rss_mb": import_rss_mb,
        "pandas_loaded": "pandas" in sys.modules,
        "options": extra,
        "peak_rss_mb": r.ru_maxrss / 1024,
        "ckpt_bytes": ckpt_bytes,
        "ckpt_format": ckpt_format,
        "ckpt_pickle_bytes": ckpt_pickle_bytes,
        "cpu_s": cpu,
        "cpu_total_s": r.ru_utime + r.ru_stime,
        "batch_shape": shape,
        "first_hash": first_hash,
        "datasets": len(datasets),
        "version": getattr(Z, "__version__", "?"),
    }


# ------------------------------------------------------------------ run


def _run_child(cmd: list[str], env: dict, timeout: int) -> dict:
    """Run one child in its own process group; on timeout the whole group is killed (a loader's
    worker processes too) and a ``"status": "timeout"`` result comes back instead of a crash."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"status": "timeout", "timeout_s": timeout, "wall_s": time.perf_counter() - t0}
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"status": "error", "error": (err or out).strip()[-1500:], "wall_s": wall}
    try:
        return {"status": "ok", **json.loads(out.strip().splitlines()[-1]), "wall_s": wall}
    except (IndexError, ValueError):
        return {"status": "error", "error": "no JSON line: " + (out + err)[-800:], "wall_s": wall}


def _loadavg() -> list[str]:
    with open("/proc/loadavg") as fh:
        return fh.read().split()[:3]


def run(a: argparse.Namespace) -> None:
    cells = parse_cells(a.cells)
    missing = sorted({layout_of(d, s) for d, s in cells if not (DATA / layout_of(d, s)).is_dir()})
    if missing:
        raise SystemExit(f"missing data {missing} under {DATA}: run `scale.py generate --cells {a.cells!r}` first")
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as a pip install: bytecode cached, outside the tree
    env["PYTHONPYCACHEPREFIX"] = str(HERE / "data" / ".pycache")
    env_z = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    env_ours = dict(
        env, PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))])
    )
    loaders = {"ours": (a.zc_python, "zephon_columnar", env_ours), "zephon": (a.z_python, "zephon", env_z)}
    loaders = {k: v for k, v in loaders.items() if k in a.loaders.split(",")}
    if "zephon" in loaders and not os.path.exists(a.z_python):
        print(f"[scale] Zephon skipped: {a.z_python} does not exist (benchmarks/README.md, setup)", file=sys.stderr)
        del loaders["zephon"]
    me = str(Path(__file__).resolve())

    def one(loader: str, dim: str, size: int) -> dict:
        py, module, e = loaders[loader]
        lanes = size if dim == "lanes" else 1
        cmd = [py, me, "child", "--module", module, "--layout", layout_of(dim, size), "--lanes", str(lanes)]
        if loader == "ours" and a.ours_options:
            cmd += ["--options", a.ours_options]
        return _run_child(cmd, e, a.timeout)

    if not a.no_warmup:
        for loader in loaders:
            if (DATA / f"files-{LANES_FILES}").is_dir():
                r = one(loader, "lanes", 1)
                print(f"[warm-up] {loader}: {r['status']} ({r['wall_s']:.1f} s, discarded)", file=sys.stderr)
    n = 0
    for rnd in range(a.rounds):
        for dim, size in cells:
            order = list(loaders) if n % 2 == 0 else list(loaders)[::-1]  # alternate who goes first
            n += 1
            for loader in order:
                row = {
                    "bench": "scale",
                    "dimension": dim,
                    "size": size,
                    "layout": layout_of(dim, size),
                    "lanes": size if dim == "lanes" else 1,
                    "loader": loader,
                    "round": rnd,
                    "loadavg": _loadavg(),
                    **one(loader, dim, size),
                }
                print(json.dumps(row), flush=True)
                brief = (
                    f"first {row['first_batch_s']:.2f} s, next100 {row['next100_s']:.2f} s, "
                    f"rss {row['peak_rss_mb']:.0f} MB, ckpt {row['ckpt_bytes']} B"
                    if row["status"] == "ok"
                    else row.get("error", "")[-200:]
                )
                print(f"[{dim}:{size} {loader}] {row['status']} in {row['wall_s']:.1f} s: {brief}", file=sys.stderr)


# ------------------------------------------------------------------ report

METRICS = (  # field, label, format
    ("discovery_s", "discovery (s)", "{:.3f}"),
    ("first_batch_s", "first batch after build (s)", "{:.3f}"),
    ("first_batch_total_s", "first batch incl. discovery (s)", "{:.3f}"),
    ("next100_s", "next 100 batches (s)", "{:.2f}"),
    ("steady100_s", "100 batches after those (s)", "{:.2f}"),
    ("import_rss_mb", "RSS after imports (MB)", "{:.0f}"),
    ("peak_rss_mb", "peak RSS (MB)", "{:.0f}"),
    ("ckpt_bytes", "checkpoint, JSON (KB)", "{:.1f}"),
    ("ckpt_pickle_bytes", "checkpoint, pickled (KB)", "{:.1f}"),
    ("cpu_s", "process CPU after imports (s)", "{:.2f}"),
)


def _fmt(v: float | None, fmt: str) -> str:
    return "-" if v is None else fmt.format(v)


def report(paths: list[str]) -> None:
    rows = []
    for p in paths:
        with open(p) as fh:
            rows += [json.loads(line) for line in fh if line.startswith("{")]
    rows = [r for r in rows if r.get("bench") == "scale"]
    for dim in DIMENSIONS:
        sizes = sorted({r["size"] for r in rows if r["dimension"] == dim})
        if not sizes:
            continue

        def value(loader: str, size: int, field: str, dim: str = dim) -> float | None:
            vs = [
                r[field]
                for r in rows
                if r["dimension"] == dim
                and r["size"] == size
                and r["loader"] == loader
                and r["status"] == "ok"
                and r.get(field) is not None
            ]
            if not vs:
                return None
            v = statistics.median(vs)
            return v / 1024 if field.endswith("bytes") else v

        def status(loader: str, size: int, dim: str = dim) -> str:
            st = {r["status"] for r in rows if r["dimension"] == dim and r["size"] == size and r["loader"] == loader}
            return "/".join(sorted(st - {"ok"})) or "-"

        unit = {"files": "files", "datasets": "datasets", "lanes": f"lanes ({LANES_FILES} files)"}[dim]
        print(f"\n### {dim}: {unit}\n")
        print(f"| metric | {dim} | ours | Zephon | ours/Zephon | ours growth | Zephon growth |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for field, label, fmt in METRICS:
            base = {lo: next((v for s in sizes if (v := value(lo, s, field))), None) for lo in ("ours", "zephon")}
            for s in sizes:
                o, z = value("ours", s, field), value("zephon", s, field)
                cells = [
                    _fmt(o, fmt) if o is not None else status("ours", s),
                    _fmt(z, fmt) if z is not None else status("zephon", s),
                    f"{o / z:.2f}" if o is not None and z else "-",
                    f"{o / base['ours']:.1f}x" if o is not None and base["ours"] else "-",
                    f"{z / base['zephon']:.1f}x" if z is not None and base["zephon"] else "-",
                ]
                print(f"| {label} | {s:,} | " + " | ".join(cells) + " |")
        hashes = {
            (r["size"], r["loader"]): r.get("first_hash") for r in rows if r["dimension"] == dim and r["status"] == "ok"
        }
        same = [s for s in sizes if hashes.get((s, "ours")) and hashes.get((s, "ours")) == hashes.get((s, "zephon"))]
        shapes = sorted({tuple(r["batch_shape"]) for r in rows if r["dimension"] == dim and r["status"] == "ok"})
        print(
            f"\nbatch shapes: {[list(x) for x in shapes]}; identical first batch (ours = Zephon) at {dim} "
            f"{same or 'none'}; growth = the value over the loader's value at the smallest {dim} cell"
        )


# ------------------------------------------------------------------ main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="write the Parquet layouts the cells read")
    g.add_argument("--cells", default=DEFAULT_CELLS)
    g.add_argument("--distinct", type=int, default=None, help="at most this many distinct files (hard links)")
    r = sub.add_parser("run", help="one fresh process per cell and loader; JSON lines on stdout")
    r.add_argument("--cells", default=DEFAULT_CELLS)
    r.add_argument("--loaders", default="ours,zephon")
    r.add_argument("--rounds", type=int, default=1)
    r.add_argument("--timeout", type=int, default=600, help="seconds per process; expiry is a timeout row")
    r.add_argument("--no-warmup", action="store_true")
    r.add_argument(
        "--ours-options", default="", help="JSON of extra options() for ours, e.g. '{\"io_options\": {...}}'"
    )
    r.add_argument("--zc-python", default=sys.executable)
    r.add_argument("--z-python", default=str(HERE / ".venv-zephon" / "bin" / "python"))
    p = sub.add_parser("report", help="markdown tables from run's JSON lines")
    p.add_argument("files", nargs="+")
    c = sub.add_parser("child", help=argparse.SUPPRESS)
    c.add_argument("--module", required=True)
    c.add_argument("--layout", required=True)
    c.add_argument("--lanes", type=int, default=1)
    c.add_argument("--options", default="")
    a = ap.parse_args()
    if a.cmd == "generate":
        generate(parse_cells(a.cells), a.distinct)
    elif a.cmd == "run":
        run(a)
    elif a.cmd == "report":
        report(a.files)
    else:
        print(json.dumps(child(a)), flush=True)
        os._exit(0)  # no teardown of loader threads: it is not what is measured


if __name__ == "__main__":
    main()
