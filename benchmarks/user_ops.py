#!/usr/bin/env python3
"""Issue 8: a user scoring operator over 1M rows, records vs the columnar hook vs Zephon 0.2.0
vs a bare pyarrow loop, in interleaved rounds of fresh processes.

Data (``make-data``, once; ``run`` makes it when missing): ``benchmarks/data/score1m/``, 8
Parquet shards of 131,072 rows (2^20 = 1,048,576 rows in all; snappy, row groups of 65,536
rows), columns ``id`` (int64, 0..2^20-1) and ``text``: word-aligned slices of 100-500 bytes
(median 291) cut from the small benchmark corpus (``benchmarks/data/small/parquet``, real
English text), 306 MB of text in all.

The score (identical definition in every variant; `score_text` is the reference)::

    b = text.encode("utf-8")                       # all texts are >= 16 bytes
    h = first 8 bytes of b (little-endian u64) XOR (last 8 bytes * K1 mod 2^64)
    h ^= h >> 29; h = h * K2 mod 2^64; h ^= h >> 32  # a splitmix64-style finalizer
    score = len(b) * 31 + h % 1000

i.e. the byte length and a cheap hash. It is defined so that a per-record Python function
(`score_records`, ~1 us a record) and a vectorized numpy function on the Arrow string buffers
(`score_array`, used by the columnar hook and by the floor) compute exactly the same values
(crc32 or Polars' hash have no vectorized twin / no per-record twin): ``check`` (and every
``run``, into its output) compares them on 4,096 rows.

The job (same recipe for every loader variant; one lane, ``batch(1024)`` for all: 1,024
batches of 1,024 rows, none dropped)::

    ds = Dataset.from_path("score1m", "benchmarks/data/score1m")
    ws = StaticMixtureWorkSource([ds], MixtureSpec({"score1m": 1.0}), seed=42, chunk_size=1024)
    Pipeline(ws).add_op("score", ...).batch(1024)

Variants (each a fresh process; the clock starts after ``import torch`` and the library):

  ours_records     zephon_columnar, ``add_op("score", process_many=score_records,
                   preserves_cursor_order=True, accumulator=lambda: CountingAccumulator(max_batch=1024))``
  ours_columnar    zephon_columnar, ``add_op("score", process_columns=score_columns,
                   preserves_cursor_order=True)`` (a pyarrow.RecordBatch of payload columns in,
                   the same with a ``score`` column appended out)
  *_inline         the same with ``options(runner="inline")`` (default runner: threads)
  zephon_records   Zephon 0.2.0 (its own venv), the ours_records recipe, its default runner
  floor            no loader: ``pq.ParquetFile(f).read_row_group(i, use_threads=False)`` for
                   every shard and row group in order, ``score_array`` on its text column,
                   the scores kept in a list (pyarrow's first ``to_numpy`` imports pandas:
                   done before the clock, as zephon_columnar imports it at import)
  floor_mt         the same with ``use_threads=True`` (pyarrow's default; slower here)
  diagnostics      (``--diagnostics``) ``*_mb4096``: ``fetch(max_batch=4096)`` (frames of 4,096
                   rows instead of 512); ``*_freeze``: ``gc.freeze()`` after the imports
  NAME@b           (``--code-b REV``) ours from other sources, e.g. before a change

Each batch is consumed really but minimally: ours sums ``batch.table.column("score")`` (and an
id-keyed checksum ``sum(id * score)``) with pyarrow.compute; Zephon sums ``r.payload["score"]``
(and ``id * score``) over ``batch.records``. Every variant must see all 1,048,576 rows with the
same score total and checksum as the floor (checked: ``checks.totals``).

Per variant: rows/s, CPU s per million rows (getrusage self + children, user + sys), peak RSS
(ru_maxrss + children sampled every 0.5 s; no variant starts any), first-batch time, time in
the garbage collector. Ratios within a round, median over rounds: ours_columnar /
zephon_records (target >= 10), ours_columnar / floor (target >= 1/1.2 = 0.83), ours_records /
zephon_records (target >= 1).

Usage (from the repository root; ~10 s for the data; a round is ~1 min without Zephon, whose
pass takes 5-9 minutes on the 2-vCPU VM)::

    .venv/bin/python benchmarks/user_ops.py make-data
    .venv/bin/python benchmarks/user_ops.py check
    .venv/bin/python benchmarks/user_ops.py run --rounds 3 > benchmarks/data/issue8.jsonl
    .venv/bin/python benchmarks/user_ops.py report benchmarks/data/issue8.jsonl     # Markdown tables
    .venv/bin/python benchmarks/user_ops.py run --rounds 7 --variants ours_records,ours_columnar,floor \
        --diagnostics --code-b HEAD > benchmarks/data/issue8_ours.jsonl
    PYTHONPATH=. .venv/bin/python benchmarks/user_ops.py probe ours_columnar_inline --passes 2  # where the time goes

``run`` options: ``--variants`` (comma list, default all but diagnostics), ``--diagnostics``,
``--code copy|worktree|REV``: the zephon_columnar ours runs (default ``copy``: the working
tree's package copied once to ``benchmarks/data/_snap/wt-<sha1>/``, so edits others make during
a run cannot leak into it; ``worktree`` runs the checkout as it is; a git revision runs that
commit), ``--code-b REV`` and ``--b-variants``, ``--z-python``, ``--no-warmup`` (the warm-up
round runs every variant but Zephon once, discarded). Children cache bytecode under
``benchmarks/data/.pycache`` (as prepacked.py); before each child the parent reads the data
files once, so every child starts on a warm page cache (this VM's proactive reclaim evicts cold
pages within minutes). One child alone: ``user_ops.py child VARIANT``
prints its JSON line (``PYTHONPATH=.`` for ours). ``probe VARIANT``: one process, per-thread
CPU and per-function timers wrapped from outside (as tokpack_probe.py).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import prepacked as PP  # noqa: E402  (helpers: RSS sampler, CPU clock, runner, machine, source id)

DATA = HERE / "data" / "score1m"
SOURCE = HERE / "data" / "small" / "parquet"
SHARDS, ROWS_PER_SHARD, ROW_GROUP = 8, 131_072, 65_536
N_ROWS = SHARDS * ROWS_PER_SHARD
BATCH = 1024
CHUNK = 1024
SEED = 42
NAME = "score1m"

M64 = (1 << 64) - 1
K1 = 0x9E3779B97F4A7C15
K2 = 0xBF58476D1CE4E5B9
CHECK_MOD = 1 << 61  # the id-keyed checksum sum(id * score) is taken mod this

VARIANTS = ["ours_records", "ours_columnar", "ours_records_inline", "ours_columnar_inline", "zephon_records",
            "floor", "floor_mt"]
#: Extra variants for --diagnostics: the fetch knob (rows per frame), a gc.freeze() after imports.
DIAGNOSTICS = ["ours_columnar_mb4096", "ours_columnar_inline_mb4096", "ours_records_freeze",
               "ours_records_inline_freeze"]
TARGETS = {"columnar_over_zephon_rows_s": 10.0, "columnar_over_floor_rows_s": 1 / 1.2,
           "records_over_zephon_rows_s": 1.0}
SAMPLE_S = 0.5  # RSS sampler period (children processes; none of the variants starts any)


def parse_variant(name: str) -> dict:
    """``<base>[_inline][_mbN][_freeze][_mt][@b]``: base ours_records | ours_columnar |
    zephon_records | floor; _inline: options(runner="inline"); _mbN: fetch(max_batch=N);
    _freeze: gc.freeze() after the imports; _mt (floor): read_row_group(use_threads=True);
    @b: ours run from the --code-b sources."""
    v, _, code = name.partition("@")
    parts = v.split("_")
    base = "_".join(parts[:2]) if parts[0] in ("ours", "zephon") else parts[0]
    spec = {"name": name, "base": base, "code": code or "a", "runner": None, "max_batch": None,
            "freeze": False, "threads": False}
    for x in parts[2 if base != "floor" else 1:]:
        if x == "inline":
            spec["runner"] = "inline"
        elif x.startswith("mb") and x[2:].isdigit():
            spec["max_batch"] = int(x[2:])
        elif x == "freeze":
            spec["freeze"] = True
        elif x == "mt" and base == "floor":
            spec["threads"] = True
        else:
            raise ValueError(f"variant {name!r}: unknown part {x!r}")
    if base not in ("ours_records", "ours_columnar", "zephon_records", "floor"):
        raise ValueError(f"variant {name!r}: unknown base {base!r}")
    return spec


# ------------------------------------------------------------------ the score (one definition)

def score_text(text: str) -> int:
    """The reference score of one text (see the module docstring)."""
    b = text.encode("utf-8")
    h = int.from_bytes(b[:8], "little") ^ ((int.from_bytes(b[-8:], "little") * K1) & M64)
    h ^= h >> 29
    h = (h * K2) & M64
    h ^= h >> 32
    return len(b) * 31 + h % 1000


def score_records(records):
    """The record form: ``process_many`` for ours and Zephon alike."""
    for r in records:
        p = r.payload
        r.payload = {**p, "score": score_text(p["text"])}
    return records


def score_array(col):
    """The vectorized form: int64 numpy scores of a pyarrow string array (or chunked array),
    from its offsets and data buffers."""
    import numpy as np
    import pyarrow as pa

    if isinstance(col, pa.ChunkedArray):
        parts = [score_array(c) for c in col.chunks]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        col = col.cast(pa.large_string())
    n = len(col)
    if n == 0:
        return np.zeros(0, np.int64)
    bufs = col.buffers()
    otype = np.int32 if pa.types.is_string(col.type) else np.int64
    offsets = np.frombuffer(bufs[1], dtype=otype, count=col.offset + n + 1)[col.offset:].astype(np.int64)
    data = np.frombuffer(bufs[2], dtype=np.uint8)
    starts, ends = offsets[:-1], offsets[1:]
    eight = np.arange(8, dtype=np.int64)
    first = data[starts[:, None] + eight].view("<u8").ravel()
    last = data[(ends - 8)[:, None] + eight].view("<u8").ravel()
    h = first ^ (last * np.uint64(K1))
    h ^= h >> np.uint64(29)
    h *= np.uint64(K2)
    h ^= h >> np.uint64(32)
    return (ends - starts) * 31 + (h % np.uint64(1000)).astype(np.int64)


def score_columns(batch):
    """The columnar hook: payload columns in, the same with ``score`` appended out."""
    import pyarrow as pa

    return batch.append_column("score", pa.array(score_array(batch.column("text"))))


# ------------------------------------------------------------------ data

def make_data(out: Path = DATA, source: Path = SOURCE, seed: int = 8) -> dict:
    """8 shards x 131,072 rows of 100-500-character word-aligned slices of the small corpus."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted(source.glob("*.parquet"))
    if not files:
        raise SystemExit(f"no Parquet files under {source}: make the small corpus first (README.md, Setup)")
    docs = pa.concat_tables([pq.read_table(f, columns=["text"]) for f in files]).column("text").to_pylist()
    corpus = " ".join(" ".join(d.split()) for d in docs)  # one line of real text, single spaces
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.parquet"):
        old.unlink()
    total_bytes, lengths = 0, []
    for s in range(SHARDS):
        starts = rng.integers(0, len(corpus) - 600, ROWS_PER_SHARD)
        sizes = rng.integers(100, 501, ROWS_PER_SHARD)
        texts = []
        for a, n in zip(starts.tolist(), sizes.tolist()):
            a = corpus.find(" ", a) + 1  # start at a word
            piece = corpus[a:a + n]
            while len(piece.encode("utf-8")) > 500:  # 100-500 bytes (some of the corpus is not ASCII)
                piece = piece[:-16]
            cut = piece.rfind(" ")
            if cut >= 100:  # end at a word when that keeps it long enough
                piece = piece[:cut]
            texts.append(piece)
        lens = [len(t.encode("utf-8")) for t in texts]
        assert min(lens) >= 16, min(lens)
        lengths += lens
        total_bytes += sum(lens)
        ids = np.arange(s * ROWS_PER_SHARD, (s + 1) * ROWS_PER_SHARD, dtype=np.int64)
        table = pa.table({"id": ids, "text": pa.array(texts, pa.string())})
        pq.write_table(table, out / f"shard-{s:05d}.parquet", row_group_size=ROW_GROUP)
    info = {"rows": N_ROWS, "shards": SHARDS, "row_group": ROW_GROUP, "text_bytes": total_bytes,
            "text_bytes_min_median_max": [min(lengths), int(statistics.median(lengths)), max(lengths)],
            "source": str(source), "seed": seed}
    (out / "manifest.json").write_text(json.dumps(info, indent=1))
    return info


def data_files() -> list[str]:
    return [str(p) for p in sorted(DATA.glob("*.parquet"))]


def check_scores(n: int = 4096) -> dict:
    """The record and vectorized definitions on a sample of rows (every shard): equal?"""
    import pyarrow.parquet as pq

    mismatches, seen = 0, 0
    for f in data_files():
        t = pq.ParquetFile(f).read_row_group(1, columns=["text"]).slice(0, n // SHARDS)
        col = t.column("text")
        vec = score_array(col).tolist()
        ref = [score_text(x) for x in col.to_pylist()]
        mismatches += sum(a != b for a, b in zip(vec, ref))
        seen += len(ref)
    return {"rows_compared": seen, "mismatches": mismatches, "identical": mismatches == 0}


# ------------------------------------------------------------------ children

def _zc(Z):
    return Z.__name__ == "zephon_columnar"


def build(Z, variant: str):
    spec = parse_variant(variant)
    ds = Z.Dataset.from_path(NAME, str(DATA))
    ws = Z.StaticMixtureWorkSource(datasets=[ds], mixture=Z.MixtureSpec({NAME: 1.0}), seed=SEED, chunk_size=CHUNK)
    pipe = Z.Pipeline(ws)
    if spec["max_batch"]:
        pipe = pipe.fetch(max_batch=spec["max_batch"])
    if spec["base"] == "ours_columnar":
        pipe = pipe.add_op("score", process_columns=score_columns, preserves_cursor_order=True)
    else:
        counting = Z.ops.CountingAccumulator
        pipe = pipe.add_op("score", process_many=score_records, preserves_cursor_order=True,
                           accumulator=lambda: counting(max_batch=BATCH))
    if spec["runner"]:
        pipe = pipe.options(runner=spec["runner"])
    return pipe.batch(BATCH)


def consume_arrow(batch, pc) -> tuple[int, int, int]:
    t = batch.table
    score = t.column("score")
    return t.num_rows, pc.sum(score).as_py(), pc.sum(pc.multiply(t.column("id"), score)).as_py()


def consume_records(batch) -> tuple[int, int, int]:
    s = c = 0
    for r in batch.records:
        p = r.payload
        v = int(p["score"])  # Zephon hands numpy scalars for Arrow ints
        s += v
        c += int(p["id"]) * v
    return len(batch.records), s, c


def _result(rows, total, check, wall, cpu, first, sampler, extra) -> dict:
    peak_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"rows": rows, "score_sum": total, "checksum": check % CHECK_MOD, "seconds": wall,
            "rows_per_s": rows / wall, "cpu_s": cpu, "cpu_s_per_mrows": cpu / (rows / 1e6),
            "cores_busy": cpu / wall, "first_batch_s": first, "peak_rss_mb": peak_self + sampler.peak_kb / 1024,
            "peak_rss_children_mb": sampler.peak_kb / 1024, "versions": PP._versions(), **extra}


def child_loader(variant: str) -> dict:
    import importlib

    import torch  # noqa: F401  (a training script has it imported)

    module = "zephon" if parse_variant(variant)["base"].startswith("zephon") else "zephon_columnar"
    Z = importlib.import_module(module)
    importlib.import_module(module + ".ops")
    import pyarrow.compute as pc

    if parse_variant(variant)["freeze"]:
        gc.freeze()  # what a training script may do after its imports: torch's objects leave the GC's scans
    rss_imports = PP._rss_kb() / 1024
    gc_time = _gc_timer()
    sampler = PP.ChildRssSampler(SAMPLE_S)
    sampler.start()
    t0, c0 = time.perf_counter(), PP._cpu_s()
    pipe = build(Z, variant)
    rows = total = check = batches = 0
    first = None
    consume = (lambda b: consume_arrow(b, pc)) if _zc(Z) else consume_records
    for b in pipe:
        n, s, c = consume(b)
        rows, total, check, batches = rows + n, total + s, check + c, batches + 1
        if first is None:
            first = time.perf_counter() - t0
    wall, cpu = time.perf_counter() - t0, PP._cpu_s() - c0
    sampler.stop()
    return _result(rows, total, check, wall, cpu, first, sampler,
                   {"variant": variant, "module": module, "batches": batches, "rss_after_imports_mb": rss_imports,
                    "module_file": Z.__file__, "gc": gc_time()})


def child_floor(variant: str = "floor") -> dict:
    """The bare loop: each row group of each shard in order, score_array, scores kept. Default
    pool; ``use_threads=False`` (floor: the faster of the two here, and first read ~0.05 s
    instead of ~0.4 s) or True (floor_mt, pyarrow's default)."""
    import numpy as np
    import pyarrow.parquet as pq
    import torch  # noqa: F401  (same process state as the loaders)

    threads = parse_variant(variant)["threads"]
    import pyarrow as pa

    pa.array([0]).to_numpy()  # pyarrow's first to_numpy imports pandas (~0.3 s); zephon_columnar does at import
    rss_imports = PP._rss_kb() / 1024
    gc_time = _gc_timer()
    sampler = PP.ChildRssSampler(SAMPLE_S)
    sampler.start()
    files = data_files()
    t0, c0 = time.perf_counter(), PP._cpu_s()
    kept, first, rows, total, check = [], None, 0, 0, 0
    for f in files:
        pf = pq.ParquetFile(f)
        for g in range(pf.num_row_groups):
            t = pf.read_row_group(g, columns=["id", "text"], use_threads=threads)
            score = score_array(t.column("text"))
            ids = t.column("id").to_numpy()
            kept.append(score)
            rows += len(score)
            total += int(score.sum())
            check += int((ids * score).sum())  # < 2^17 rows * 2^20 * 2^14: no int64 overflow
            if first is None:
                first = time.perf_counter() - t0
    wall, cpu = time.perf_counter() - t0, PP._cpu_s() - c0
    sampler.stop()
    assert sum(len(k) for k in kept) == rows and isinstance(kept[0], np.ndarray)
    return _result(rows, total, check, wall, cpu, first, sampler,
                   {"variant": variant, "row_groups": len(kept), "rss_after_imports_mb": rss_imports,
                    "use_threads": threads, "gc": gc_time()})


def _gc_timer():
    """Start timing the interpreter's garbage collections; the returned function stops and
    gives {generation: [collections, seconds]}."""
    stats = {0: [0, 0.0], 1: [0, 0.0], 2: [0, 0.0]}
    start = [0.0]

    def callback(phase, info):
        if phase == "start":
            start[0] = time.perf_counter()
        else:
            s = stats[info["generation"]]
            s[0] += 1
            s[1] += time.perf_counter() - start[0]

    gc.callbacks.append(callback)

    def stop():
        gc.callbacks.remove(callback)
        return {str(g): [n, round(t, 4)] for g, (n, t) in stats.items()}

    return stop


# ------------------------------------------------------------------ parent

def code_root(code: str) -> tuple[str, dict]:
    """(PYTHONPATH root holding zephon_columnar, source id) for the code ours runs."""
    if code == "worktree":
        return str(REPO), dict(PP._source_id(), code="worktree")
    if code == "copy":
        sid = PP._source_id()
        root = HERE / "data" / "_snap" / f"wt-{sid['sources_sha1']}"
        if not (root / "zephon_columnar" / "__init__.py").exists():
            tmp = root.with_name(root.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(REPO / "zephon_columnar", tmp / "zephon_columnar",
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            tmp.rename(root)
        return str(root), dict(sid, code="copy", path=str(root))
    import tokpack  # noqa: PLC0415  (its git-archive snapshot of a revision)

    root, sid = tokpack.snapshot(code)
    return root, dict(sid, code=code)


def summarize(out: dict) -> None:
    R = out["rounds"]

    def get(r, k, f):
        v = r.get(k, {})
        return None if (not isinstance(v, dict) or "error" in v or v.get(f) is None) else v[f]

    def ratio(r, k1, k2, f="rows_per_s"):
        x, y = get(r, k1, f), get(r, k2, f)
        return None if (x is None or not y) else x / y

    pairs = {
        "columnar_over_zephon_rows_s": ("ours_columnar", "zephon_records"),
        "columnar_over_floor_rows_s": ("ours_columnar", "floor"),
        "records_over_zephon_rows_s": ("ours_records", "zephon_records"),
        "columnar_inline_over_zephon_rows_s": ("ours_columnar_inline", "zephon_records"),
        "columnar_inline_over_floor_rows_s": ("ours_columnar_inline", "floor"),
        "records_inline_over_zephon_rows_s": ("ours_records_inline", "zephon_records"),
        "columnar_over_floor_mt_rows_s": ("ours_columnar", "floor_mt"),
        "columnar_inline_over_floor_mt_rows_s": ("ours_columnar_inline", "floor_mt"),
        "columnar_over_records_rows_s": ("ours_columnar", "ours_records"),
        "inline_over_threads_records_rows_s": ("ours_records_inline", "ours_records"),
        "inline_over_threads_columnar_rows_s": ("ours_columnar_inline", "ours_columnar"),
    }
    for k in out["variants"]:  # diagnostics and the other code, against what they vary
        spec = parse_variant(k)
        if spec["base"] == "ours_columnar" and (spec["max_batch"] or spec["code"] != "a"):
            pairs[f"{k}_over_floor_rows_s"] = (k, "floor")
        if spec["code"] != "a":  # this code (a) against the other (b): the speed-up of a
            pairs[f"{k.partition('@')[0]}_over_{k}_rows_s"] = (k.partition("@")[0], k)
        elif spec["max_batch"] or spec["freeze"]:
            plain = k.replace(f"_mb{spec['max_batch']}", "").replace("_freeze", "")
            pairs[f"{k}_over_{plain}_rows_s"] = (k, plain)
    per_round = {k: [ratio(r, *p) for r in R] for k, p in pairs.items()}
    per_round = {k: v for k, v in per_round.items() if any(x is not None for x in v)}
    out["ratios_per_round"] = {k: [PP._r(x) for x in v] for k, v in per_round.items()}
    summary = {}
    for k, v in per_round.items():
        med = PP._med(v)
        summary[k] = {"median": med, "min": PP._r(min(x for x in v if x is not None)),
                      "max": PP._r(max(x for x in v if x is not None))}
        if k in TARGETS and med is not None:
            summary[k].update(target=round(TARGETS[k], 3), met=med >= TARGETS[k])
    fields = ["rows_per_s", "cpu_s_per_mrows", "cores_busy", "peak_rss_mb", "first_batch_s", "seconds"]
    keys = [k for k in out["variants"] if any(get(r, k, "rows") is not None for r in R)]
    out["variant_medians"] = {k: {f: PP._med([get(r, k, f) for r in R]) for f in fields} for k in keys}
    ref = next(((get(r, "floor", "rows"), get(r, "floor", "score_sum"), get(r, "floor", "checksum"))
                for r in R if get(r, "floor", "rows") is not None), None)
    agree = {}
    for k in keys:
        got = {(get(r, k, "rows"), get(r, k, "score_sum"), get(r, k, "checksum")) for r in R if get(r, k, "rows")}
        agree[k] = {"rows": sorted({g[0] for g in got}), "same_as_floor": ref is not None and got == {ref},
                    "all_rows": got and all(g[0] == N_ROWS for g in got)}
    out["checks"]["totals"] = agree
    out["checks"]["reference"] = {"rows": ref[0], "score_sum": ref[1], "checksum": ref[2]} if ref else None
    out["summary"] = summary
    errs = {f"r{i}.{k}": v["error"][-400:] for i, r in enumerate(R) for k, v in r.items()
            if isinstance(v, dict) and "error" in v}
    if errs:
        out["errors"] = errs


def run(a) -> dict:
    if not data_files():
        print("[user_ops] making the data (once)", file=sys.stderr)
        make_data()
    variants = [v for v in a.variants.split(",") if v]
    if a.diagnostics:
        variants += [v for v in DIAGNOSTICS if v not in variants]
    if a.code_b:
        variants += [f"{v}@b" for v in a.b_variants.split(",") if v]
    for v in variants:
        parse_variant(v)  # a ValueError names what is wrong
    root, source = code_root(a.code)
    root_b, source_b = code_root(a.code_b) if a.code_b else (None, None)
    me = str(Path(__file__).resolve())
    base_env = dict(os.environ)
    base_env.pop("PYTHONDONTWRITEBYTECODE", None)
    base_env["PYTHONPYCACHEPREFIX"] = str(HERE / "data" / ".pycache")
    env_ours = dict(base_env, PYTHONPATH=root)
    env_b = dict(base_env, PYTHONPATH=root_b or "")
    env_z = {k: v for k, v in base_env.items() if k != "PYTHONPATH"}
    if "zephon_records" in variants and not os.path.exists(a.z_python):
        variants.remove("zephon_records")
        print(f"[user_ops] Zephon skipped: no {a.z_python}", file=sys.stderr)

    def run_variant(k: str) -> dict:
        spec = parse_variant(k)
        # This VM's proactive reclaim (kdamond) evicts cold page-cache pages within minutes (a
        # floor pass once read from disk at 0.2 cores busy): every child starts on cached files.
        for f in data_files():
            with open(f, "rb") as fh:
                while fh.read(1 << 24):
                    pass
        if spec["base"] == "zephon_records":
            return PP._run([a.z_python, me, "child", k], env_z, a.timeout)
        return PP._run([a.python, me, "child", k], env_b if spec["code"] == "b" else env_ours, a.timeout)

    out = {"bench": "user_ops (issue 8)", "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": PP._machine(),
           "settings": {"data": str(DATA), "rows": N_ROWS, "shards": SHARDS, "row_group": ROW_GROUP,
                        "batch": BATCH, "chunk_size": CHUNK, "seed": SEED, "max_batch": BATCH,
                        "rounds": a.rounds, "z_python": a.z_python, "python": a.python,
                        "bytecode": "PYTHONPYCACHEPREFIX=" + base_env["PYTHONPYCACHEPREFIX"]},
           "data": json.loads((DATA / "manifest.json").read_text()) if (DATA / "manifest.json").exists() else None,
           "ours_source": source, "ours_source_b": source_b, "variants": variants, "checks": {"scores": check_scores()}, "rounds": []}
    print(f"[user_ops] variants={variants} rounds={a.rounds} code={source}", file=sys.stderr)
    print(f"[user_ops] score definitions agree: {out['checks']['scores']}", file=sys.stderr)
    if not a.no_warmup:  # page cache, bytecode cache (Zephon's pass is minutes and pip-installed: not warmed)
        warm = {k: run_variant(k) for k in variants if not k.startswith("zephon")}
        out["warmup"] = {k: (PP._r(v.get("rows_per_s"), 0) if "error" not in v else v["error"][-300:])
                         for k, v in warm.items()}
        print(f"[warm-up] {json.dumps(out['warmup'])}", file=sys.stderr)
    for rnd in range(a.rounds):
        t_round = time.time()
        res: dict = {"loadavg": open("/proc/loadavg").read().split()[:3]}
        order = variants[rnd % len(variants):] + variants[: rnd % len(variants)]
        for k in order:
            res[k] = run_variant(k)
        res["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
        res["round_s"] = round(time.time() - t_round, 1)
        out["rounds"].append(res)
        brief = {k: (PP._r(v.get("rows_per_s"), 0) if "error" not in v else "ERROR")
                 for k, v in res.items() if k in variants}
        print(f"[round {rnd}] {json.dumps(brief)} ({res['round_s']} s)", file=sys.stderr)
    summarize(out)
    return out


# ------------------------------------------------------------------ probe (where the time goes)

def probe(variant: str, passes: int = 1) -> dict:
    """One variant of ours in this process (``PYTHONPATH`` = the code to probe), with per-OS-thread
    CPU and per-function thread-CPU timers wrapped around library functions from outside
    (tokpack_probe's machinery; nothing in zephon_columnar is edited) and the GC's time."""
    import tokpack_probe as TPP

    import torch  # noqa: F401
    import zephon_columnar as Z
    import zephon_columnar.ops  # noqa: F401
    import pyarrow.compute as pc
    from zephon_columnar import frame as Fr
    from zephon_columnar.engine.runners import inline, process, threads
    from zephon_columnar.engine.lane import collector
    from zephon_columnar.io import parquet
    from zephon_columnar.ops import fetch, rows, user
    from zephon_columnar.work import static

    me = sys.modules[__name__]
    wrap = TPP.wrap
    for runner in (inline, threads, process):  # each runner module calls the run_stage it imported
        wrap(runner, "run_stage", "worker: a stage call (fetch + op), total")
    wrap(fetch.FetchOp, "process_frame", "fetch: FetchOp.process_frame, total")
    wrap(parquet.ParquetReader, "_decode", "fetch: ParquetReader._decode (Parquet -> Arrow)")
    wrap(user, "run_columns", "op: run_columns, total (columnar)")
    wrap(me, "score_columns", "op: the user's process_columns")
    wrap(rows, "run_rows", "op: run_rows, total (records)")
    wrap(rows, "records_of", "op: records_of (frame -> records)")
    wrap(me, "score_records", "op: the user's process_many")
    wrap(rows, "frame_of_records", "op: frame_of_records (records -> frame)")
    wrap(collector, "take_batch", "collector: take_batch (cut a batch)")
    wrap(Fr, "pointer_frame", "source: frame.pointer_frame")
    wrap(static.StaticMixtureWorkSource, "next_chunk", "source: work source next_chunk")
    wrap(static.StaticMixtureWorkSource, "state_dict", "source: work source state_dict")
    wrap(me, "consume_arrow", "consumer: sum score, checksum")
    results = []
    for _ in range(passes):
        TPP.TIMERS.clear()
        main_tid = threading.get_native_id()
        before = TPP._task_cpu()
        sampler = TPP.ThreadCpu()
        sampler.start()
        gc_time = _gc_timer()
        t0, c0 = time.perf_counter(), time.process_time()
        n = 0
        for b in build(Z, variant):
            n += me.consume_arrow(b, pc)[0]
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        sampler.stop()
        gcs = gc_time()
        threads: dict[str, float] = {}
        for tid, c in sampler.last.items():
            name = "MainThread" if tid == main_tid else sampler.names.get(tid, "native threads")
            threads[name] = threads.get(name, 0.0) + c - before.get(tid, 0.0)
        results.append({"variant": variant, "rows": n, "seconds": wall, "cpu_s": cpu,
                        "thread_cpu_s": {k: round(v, 3) for k, v in sorted(threads.items(), key=lambda kv: -kv[1])},
                        "gc_s": round(sum(v[1] for v in gcs.values()), 3), "gc": gcs,
                        "timers": {k: {"calls": int(v[0]), "thread_cpu_s": round(v[1], 3), "wall_s": round(v[2], 3)}
                                   for k, v in sorted(TPP.TIMERS.items(), key=lambda kv: kv[0])}})
        r = results[-1]
        print(f"{variant}: {n:,} rows, {wall:.3f} s wall, CPU {cpu:.3f} s, GC {r['gc_s']:.3f} s "
              f"(full: {gcs['2'][0]} in {gcs['2'][1]:.3f} s); threads {r['thread_cpu_s']}", file=sys.stderr)
        for k, v in r["timers"].items():
            print(f"  {v['calls']:6d} {v['thread_cpu_s']:7.3f} s {v['thread_cpu_s'] / cpu:6.1%} {v['wall_s']:7.3f}  {k}",
                  file=sys.stderr)
    return {"probe": variant, "passes": results, "versions": PP._versions(),
            "source": PP._source_id() if "zephon_columnar" in sys.modules else None}


# ------------------------------------------------------------------ report

def report(path: str) -> str:
    out = json.loads(Path(path).read_text().strip().splitlines()[-1])
    R, lines = out["rounds"], []
    src = out.get("ours_source", {})
    lines.append(f"date {out['date']}, code {src.get('git_head')} (sources sha1 {src.get('sources_sha1')}, "
                 f"{src.get('code')}), load {R[0].get('loadavg') if R else '-'} -> "
                 f"{R[-1].get('loadavg_end') if R else '-'}, {len(R)} rounds")
    lines.append("")
    names = [f"r{i}" for i in range(len(R))]
    lines.append("| ratio (rows/s, per round) | " + " | ".join(names) + " | median | target |")
    lines.append("| --- |" + " --- |" * (len(names) + 2))
    for k, v in out["ratios_per_round"].items():
        s = out["summary"][k]
        tgt = f">= {s['target']} ({'met' if s['met'] else 'missed'})" if "target" in s else ""
        lines.append(f"| {k} | " + " | ".join("-" if x is None else f"{x:.2f}" for x in v)
                     + f" | **{s['median']:.2f}** | {tgt} |")
    lines.append("")
    if out.get("ours_source_b"):
        b = out["ours_source_b"]
        lines.append(f"@b variants: code {b.get('snapshot') or b.get('git_head')} (sources sha1 {b.get('sources_sha1')})")
        lines.append("")
    lines.append("| variant | rows/s (median) | rows/s per round | CPU s per M rows | cores busy | peak RSS MB "
                 "| first batch ms | pass s | full GCs (s) | rows, score sum = floor's |")
    lines.append("| --- |" + " --- |" * 9)
    for k, m in out["variant_medians"].items():
        per = " / ".join("ERR" if "error" in r.get(k, {}) else f"{r[k]['rows_per_s'] / 1e3:.0f}k"
                         for r in R if k in r)
        chk = out["checks"]["totals"][k]
        full = [r[k]["gc"]["2"] for r in R if "gc" in r.get(k, {})]
        gcs = f"{statistics.median(g[0] for g in full):.0f} ({statistics.median(g[1] for g in full):.2f})" if full else "-"
        lines.append(f"| {k} | {m['rows_per_s']:,.0f} | {per} | {m['cpu_s_per_mrows']:.2f} | {m['cores_busy']:.2f} "
                     f"| {m['peak_rss_mb']:.0f} | {m['first_batch_s'] * 1e3:.0f} | {m['seconds']:.2f} | {gcs} "
                     f"| {chk['rows']}, {chk['same_as_floor']} |")
    sc = out["checks"]["scores"]
    lines.append("")
    lines.append(f"Score definitions (records vs vectorized) on {sc['rows_compared']} rows: "
                 f"{sc['mismatches']} mismatches.")
    if out.get("errors"):
        lines.append(f"Errors: {json.dumps(out['errors'])[:2000]}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("make-data")
    sub.add_parser("check")
    c = sub.add_parser("child")
    c.add_argument("variant", help=f"one of {VARIANTS + DIAGNOSTICS}, or see parse_variant")
    r = sub.add_parser("run")
    r.add_argument("--rounds", type=int, default=5)
    r.add_argument("--variants", default=",".join(VARIANTS))
    r.add_argument("--code", default="copy", help="copy (default) | worktree | a git revision")
    r.add_argument("--python", default=sys.executable)
    r.add_argument("--z-python", default=str(HERE / ".venv-zephon" / "bin" / "python"))
    r.add_argument("--diagnostics", action="store_true", help=f"add {DIAGNOSTICS}")
    r.add_argument("--code-b", default="", help="also run --b-variants from these sources (copy|worktree|REV), as NAME@b")
    r.add_argument("--b-variants", default="ours_records,ours_columnar,ours_records_inline,ours_columnar_inline")
    r.add_argument("--no-warmup", action="store_true")
    r.add_argument("--timeout", type=int, default=1800)
    q = sub.add_parser("probe")
    q.add_argument("variant")
    q.add_argument("--passes", type=int, default=1)
    p = sub.add_parser("report")
    p.add_argument("file")
    a = ap.parse_args()
    if a.cmd == "make-data":
        print(json.dumps(make_data()))
    elif a.cmd == "check":
        print(json.dumps(check_scores()))
    elif a.cmd == "child":
        spec = parse_variant(a.variant)
        print(json.dumps(child_floor(a.variant) if spec["base"] == "floor" else child_loader(a.variant)))
    elif a.cmd == "probe":
        print(json.dumps(probe(a.variant, a.passes)))
    elif a.cmd == "run":
        print(json.dumps(run(a)))
    else:
        print(report(a.file))


if __name__ == "__main__":
    main()
