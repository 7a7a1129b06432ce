"""Issue 30: the pre-tokenized job read from every format, against each format's own loader and
against our Parquet path, side by side in interleaved rounds of fresh processes.

The job: documents of pre-tokenized ids -> wrap packing into rows of 2,048 tokens -> batches of 8
-> ``[8, 2048]`` int64 torch tensors. The same documents, shard for shard, in each format
(``prepare`` writes them from ``<corpus>/pretok``, one column ``input_ids`` list<int32>):

    <corpus>/pretok/*.parquet              the source (our Parquet path reads it)
    <corpus>/formats/webdataset/*.tar      webdataset.TarWriter, a sample per document, member input_ids.npy
    <corpus>/formats/mds/                  streaming.MDSWriter {"input_ids": "ndarray:int32"}, a writer per
    <corpus>/formats/mds_zstd/             shard (a partition), merged with merge_index; mds_zstd: compression="zstd"
    <corpus>/formats/lance/corpus.lance    lance.write_dataset, an append per shard (fragments = shards)
    <corpus>/formats/vortex/*.vortex       vortex.io.write, a file per shard
    <corpus>/formats/litdata/              litdata's BinaryWriter, {"input_ids": int32 array}, a chunk per shard

Variants (each run is a fresh process; every round runs each variant once, the order rotated):

    ours_<fmt>   Dataset.from_path("d", path) -> StaticMixtureWorkSource([ds], {"d": 1.0}, chunk_size=1024,
                 seed=42) -> Pipeline(ws).pack_flat(2048, algorithm="wrap", tokens_field=...).batch(8);
                 b.to_training()["input_ids"] for each batch. fmt: parquet, webdataset, mds, mds_zstd,
                 lance, vortex, litdata (a format Dataset.from_path cannot read is skipped, its error
                 recorded under "skipped")
    own_<fmt>    the format's own loader over the same files (webdataset.WebDataset(...).decode(),
                 streaming.StreamingDataset(local=..., remote=None, shuffle=False, batch_size=8),
                 lance.dataset(...).to_batches(columns=["input_ids"]) + pc.list_flatten,
                 vortex.open(file).to_arrow(["input_ids"]) + pc.list_flatten,
                 litdata.StreamingDataset(input_dir=...)), its ids packed by `wrap_batches` (one numpy
                 function for every own loader: the same rows and batches as ours' wrap)
    floor        pq.read_table(use_threads=True) of <corpus>/pretok + pc.list_flatten into one int32
                 buffer (limit.py's pretok part; read_table's lazy `import pyarrow.dataset` is done
                 before the clock, as prepacked.py's floor)

Measured in each child: tokens/s (the tokens of the batches received, over the seconds from after
the imports to the end of one full pass: discovery, opening and every lazy import inside the
libraries count), time to the first batch, CPU seconds, peak RSS (getrusage of the child: self,
plus its own children if any) and RSS after the imports. Each child imports torch first (a
training script has it loaded) and runs gc.collect() just before the clock: importing torch leaves
a full collection due, which the first few young collections set off (~0.09 s over torch's
objects here), so whichever variant makes a few in its pass would pay it and one that allocates
almost no GC-tracked objects would not, an accident of where the clock starts (a training script
has built its model long before its loader's first batch). Every batch variant must deliver the
same tokens: full rows in full batches (wrap drops the final partial row, batch(8) the last short
batch), i.e. the floor's tokens rounded down to a multiple of 8 x 2048; a mismatch is printed
loudly and recorded.

Cold caches: decompressed copies are never reused across runs. Each run gets a fresh scratch
folder: ours run with ZEPHON_COLUMNAR_CACHE pointing into it (our shard cache, where mds_zstd's
shards are decompressed, starts empty), and own_mds_zstd copies mds_zstd/ into it before the clock
starts (streaming writes the decompressed .mds next to the .zstd on first read, so it pays the
decompression every run too). Every other loader reads the files in place (litdata's chunks are
uncompressed, so it rewrites nothing); every run's data folder is checked unchanged afterwards (a
change is printed and recorded as "wrote_into_its_data"). The page cache is warm: every run's
files are read once before its child starts, and a discarded warm-up round runs first (page cache
and the children's bytecode cache, under <corpus>/formats/.pycache; --no-warmup skips it).

streaming is imported through tests/format_writers.py (torchvision stood in for its import), which
loads pytest too: own_mds* children carry that in their RSS after imports, not in their timing.

Run from the repository root (the project venv, PYTHONPATH = the checkout to measure):

    PYTHONPATH=. .venv/bin/python benchmarks/formats.py prepare --corpus benchmarks/data/small
    PYTHONPATH=. .venv/bin/python benchmarks/formats.py run --corpus benchmarks/data/small --rounds 5 \\
        > benchmarks/data/formats_small.json        # progress on stderr, one JSON line on stdout
    .venv/bin/python benchmarks/formats.py report benchmarks/data/formats_small.json   # Markdown tables

``run --variants ours_mds,own_mds`` runs some variants only (default: all those whose files exist);
``bare_<fmt>`` is ours packing without positions (``emit_positions=False``), token ids only, the
output the own loaders' packer makes (asked for by name only).
The JSON line has every run ("runs"), per-round ratios (ours_<fmt> / own_<fmt> and
ours_<fmt> / ours_parquet of tokens/s) and their medians ("summary"), with the issue's targets:
ours_<fmt> at least own_<fmt>'s tokens/s, and at least 1 / 1.5 of ours_parquet's.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from _child import run_child

L, B = 2048, 8
REPO = Path(__file__).resolve().parents[1]
FORMATS = ("parquet", "webdataset", "mds", "mds_zstd", "lance", "vortex", "litdata")
TOKENS_FIELD = {"webdataset": "input_ids.npy"}  # every other format: "input_ids"
PARQUET_TARGET = 1 / 1.5  # ours_<fmt> within 1.5x of ours_parquet
FIGURES = ("tokens_per_s", "first_batch_s", "seconds", "cpu_s", "peak_rss_mb", "rss_after_imports_mb")  # medians

DocStream = Callable[[], Iterator[np.ndarray]]  # one pass over a format's documents (int32 id arrays)


def data_path(corpus: Path, fmt: str) -> Path:
    """Where ``fmt``'s copy of the corpus lies (``parquet``: the source itself)."""
    if fmt == "parquet":
        return corpus / "pretok"
    if fmt == "lance":
        return corpus / "formats" / "lance" / "corpus.lance"
    return corpus / "formats" / fmt


def streaming_module() -> Any:
    """``import streaming`` (mosaicml-streaming) with tests/format_writers.py's torchvision stand-in."""
    sys.path.insert(0, str(REPO))
    from tests.format_writers import streaming

    return streaming()


# ------------------------------------------------------------------ prepare


def shard_documents(parquet: Path) -> list[np.ndarray]:
    """The documents of one Parquet shard, as int32 arrays (views into one buffer)."""
    import pyarrow.parquet as pq

    ids = pq.read_table(parquet, columns=["input_ids"]).column("input_ids").combine_chunks()
    offsets, values = ids.offsets.to_numpy(), ids.values.to_numpy()
    return [values[offsets[i]:offsets[i + 1]] for i in range(len(ids))]


def write_webdataset(shards: list[Path], out: Path) -> None:
    import webdataset as wds

    for shard in shards:
        with wds.TarWriter(str(out / f"{shard.stem}.tar")) as sink:
            for i, doc in enumerate(shard_documents(shard)):
                sink.write({"__key__": f"{shard.stem}-{i:06d}", "input_ids.npy": doc})


def write_mds(shards: list[Path], out: Path, compression: str | None = None) -> None:
    """A writer per Parquet shard (a partition, so MDS shards = Parquet shards), merged as MDS users do."""
    streaming = streaming_module()
    for shard in shards:
        with streaming.MDSWriter(out=str(out / shard.stem), columns={"input_ids": "ndarray:int32"},
                                 compression=compression, size_limit=1 << 30) as sink:
            for doc in shard_documents(shard):
                sink.write({"input_ids": doc})
    streaming.base.util.merge_index(str(out), keep_local=True)


def write_lance(shards: list[Path], out: Path) -> None:
    import lance
    import pyarrow.parquet as pq

    for i, shard in enumerate(shards):  # an append per shard: a fragment each
        lance.write_dataset(pq.read_table(shard, columns=["input_ids"]), str(out / "corpus.lance"),
                            mode="create" if i == 0 else "append")


def write_vortex(shards: list[Path], out: Path) -> None:
    import pyarrow.parquet as pq
    import vortex

    for shard in shards:
        vortex.io.write(pq.read_table(shard, columns=["input_ids"]), str(out / f"{shard.stem}.vortex"))


def write_litdata(shards: list[Path], out: Path) -> None:
    """litdata's own writer (what ``litdata.optimize`` runs in its workers), uncompressed, with a
    chunk written at the end of every Parquet shard (chunk_bytes never cuts one earlier)."""
    from litdata.streaming.writer import BinaryWriter

    writer = BinaryWriter(cache_dir=str(out), chunk_bytes="64GB")
    index = 0
    for shard in shards:
        for doc in shard_documents(shard):
            writer.add_item(index, {"input_ids": doc})
            index += 1
        writer.write_chunk(on_done=True)
    writer.done()
    writer.merge(num_workers=1)


WRITERS: dict[str, Callable[[list[Path], Path], None]] = {
    "webdataset": write_webdataset,
    "mds": write_mds,
    "mds_zstd": lambda shards, out: write_mds(shards, out, compression="zstd"),
    "lance": write_lance,
    "vortex": write_vortex,
    "litdata": write_litdata,
}


def folder_bytes(path: Path) -> tuple[int, int]:
    """(files, bytes) under ``path``."""
    files = [f for f in path.rglob("*") if f.is_file()]
    return len(files), sum(f.stat().st_size for f in files)


def prepare(corpus: Path) -> None:
    shards = sorted((corpus / "pretok").glob("*.parquet"))
    if not shards:
        raise SystemExit(f"{corpus}/pretok has no Parquet shards: benchmarks/README.md, setup step 2, writes them")
    root = corpus / "formats"
    root.mkdir(exist_ok=True)
    for fmt, write in WRITERS.items():
        out = root / fmt
        if out.exists():
            print(f"[prepare] {fmt}: {out} exists, kept", file=sys.stderr)
            continue
        tmp = root / f".tmp-{fmt}"  # renamed when complete: a failed write is not mistaken for data
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        t0 = time.perf_counter()
        write(shards, tmp)
        tmp.rename(out)
        print(f"[prepare] {fmt}: written in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    print("| format | files | MB |\n| --- | --- | --- |")
    for fmt in FORMATS:
        files, size = folder_bytes(data_path(corpus, fmt))
        print(f"| {fmt} | {files} | {size / 1e6:.1f} |")


# ------------------------------------------------------------------ the child (one run)


def wrap_batches(docs: Iterable[np.ndarray]) -> Iterator[Any]:
    """The own loaders' packer: the ids of ``docs`` (documents, or runs of them) concatenated into
    one stream, cut into rows of L tokens, B rows a batch, as int64 torch tensors; the final
    partial batch is dropped (as ours' wrap + batch(drop_last=True))."""
    import torch

    size = B * L
    parts: list[np.ndarray] = []
    pending = 0
    for ids in docs:
        parts.append(ids)
        pending += len(ids)
        if pending >= size:
            stream = np.concatenate(parts)
            cut = len(stream) - len(stream) % size
            for start in range(0, cut, size):
                yield torch.from_numpy(stream[start:start + size].reshape(B, L)).long()
            parts, pending = [stream[cut:]], len(stream) - cut


def own_webdataset(path: Path, scratch: Path) -> DocStream:
    import webdataset as wds

    tars = sorted(str(p) for p in path.glob("*.tar"))

    def docs() -> Iterator[np.ndarray]:
        for sample in wds.WebDataset(tars, shardshuffle=False).decode():  # .npy members -> numpy arrays
            yield sample["input_ids.npy"]

    return docs


def own_mds(path: Path, scratch: Path) -> DocStream:
    streaming = streaming_module()
    if any(path.rglob("*.zstd")):  # streaming decompresses next to the .zstd once: a fresh copy every run
        path = Path(shutil.copytree(path, scratch / path.name))

    def docs() -> Iterator[np.ndarray]:
        for sample in streaming.StreamingDataset(local=str(path), remote=None, shuffle=False, batch_size=B):
            yield sample["input_ids"]

    return docs


def own_lance(path: Path, scratch: Path) -> DocStream:
    import lance
    import pyarrow.compute as pc

    def docs() -> Iterator[np.ndarray]:
        for batch in lance.dataset(str(path)).to_batches(columns=["input_ids"]):
            yield pc.list_flatten(batch.column(0)).to_numpy()

    return docs


def own_vortex(path: Path, scratch: Path) -> DocStream:
    import pyarrow.compute as pc
    import vortex

    files = sorted(str(p) for p in path.glob("*.vortex"))

    def docs() -> Iterator[np.ndarray]:
        for file in files:
            for batch in vortex.open(file).to_arrow(["input_ids"]):
                yield pc.list_flatten(batch.column(0)).to_numpy()

    return docs


def own_litdata(path: Path, scratch: Path) -> DocStream:
    import litdata

    def docs() -> Iterator[np.ndarray]:
        for sample in litdata.StreamingDataset(input_dir=str(path)):
            yield np.asarray(sample["input_ids"])

    return docs


OWN: dict[str, Callable[[Path, Path], DocStream]] = {
    "webdataset": own_webdataset, "mds": own_mds, "mds_zstd": own_mds, "lance": own_lance,
    "vortex": own_vortex, "litdata": own_litdata,
}


def ours(path: Path, fmt: str, *, positions: bool = True) -> Callable[[], Iterator[Any]]:
    """Our pipeline; ``positions=False`` (the ``bare_<fmt>`` variants) packs without the
    per-document positions, the output the own loaders' packer makes (token ids only)."""
    import zephon_columnar as Z

    field = TOKENS_FIELD.get(fmt, "input_ids")

    def batches() -> Iterator[Any]:
        ds = Z.Dataset.from_path("d", str(path))
        ws = Z.StaticMixtureWorkSource([ds], {"d": 1.0}, chunk_size=1024, seed=42)
        packed = Z.Pipeline(ws).pack_flat(L, algorithm="wrap", tokens_field=field, emit_positions=positions)
        for b in packed.batch(B):
            yield b.to_training(tokens_field=field)["input_ids"]

    return batches


def floor(corpus: Path) -> Callable[[], int]:
    """One pass of pyarrow read + flatten of the Parquet source; returns the tokens."""
    import pyarrow.compute as pc
    import pyarrow.dataset  # noqa: F401  # read_table's lazy import, before the clock (as prepacked.py)
    import pyarrow.parquet as pq

    files = sorted(data_path(corpus, "parquet").glob("*.parquet"))

    def read() -> int:
        tables = [pq.read_table(f, columns=["input_ids"], use_threads=True) for f in files]
        parts = [pc.list_flatten(chunk).to_numpy(zero_copy_only=True)
                 for t in tables for chunk in t.column("input_ids").chunks]
        return int(np.concatenate(parts).size)

    return read


def rss_now_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    """ru_maxrss (KiB on Linux) of this process, plus that of its waited-for children."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return (own + children) / 1024


def child(corpus: Path, variant: str, scratch: Path) -> dict:
    import torch  # a training script has torch loaded before its loader runs

    kind, _, fmt = variant.partition("_")
    if kind == "floor":
        read = floor(corpus)
        rss_imports = rss_now_mb()
        gc.collect()
        t0, c0 = time.perf_counter(), time.process_time()
        tokens = read()
        wall = time.perf_counter() - t0
        return {"variant": variant, "tokens": tokens, "batches": None, "seconds": wall, "tokens_per_s": tokens / wall,
                "first_batch_s": None, "cpu_s": time.process_time() - c0, "peak_rss_mb": peak_rss_mb(),
                "rss_after_imports_mb": rss_imports}
    path = data_path(corpus, fmt)
    if kind in ("ours", "bare"):
        batches = ours(path, fmt, positions=kind == "ours")
    else:
        docs = OWN[fmt](path, scratch)

        def batches() -> Iterator[Any]:
            return wrap_batches(docs())

    rss_imports = rss_now_mb()
    gc.collect()  # the full collection torch's import left due, outside every variant's clock
    t0, c0 = time.perf_counter(), time.process_time()
    tokens, count, first = 0, 0, None
    for x in batches():
        assert x.shape == (B, L) and x.dtype == torch.int64, (x.shape, x.dtype)
        tokens += x.numel()
        count += 1
        if first is None:
            first = time.perf_counter() - t0
    wall = time.perf_counter() - t0
    return {"variant": variant, "tokens": tokens, "batches": count, "seconds": wall, "tokens_per_s": tokens / wall,
            "first_batch_s": first, "cpu_s": time.process_time() - c0, "peak_rss_mb": peak_rss_mb(),
            "rss_after_imports_mb": rss_imports}


# ------------------------------------------------------------------ the driver


def source_id() -> dict:
    """What code ours ran: git HEAD, dirty files under the package, sha1 of its sources."""
    git = ["git", "-C", str(REPO)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--short", "--", "zephon_columnar"], capture_output=True, text=True).stdout
    h = hashlib.sha1()
    for f in sorted((REPO / "zephon_columnar").rglob("*.py")):
        h.update(str(f.relative_to(REPO)).encode())
        h.update(f.read_bytes())
    return {"git_head": head, "dirty": [line.strip() for line in dirty.splitlines()],
            "sources_sha1": h.hexdigest()[:12]}


def runnable_variants(corpus: Path, asked: list[str]) -> tuple[list[str], dict[str, str]]:
    """The variants asked for whose files exist and (ours) that Dataset.from_path reads; the
    others with the reason they are skipped."""
    import zephon_columnar as Z

    run, skipped = [], {}
    for variant in asked:
        kind, _, fmt = variant.partition("_")
        if kind == "floor":
            run.append(variant)
            continue
        if kind not in ("ours", "bare", "own") or fmt not in FORMATS or (kind == "own" and fmt == "parquet"):
            raise SystemExit(f"unknown variant {variant!r}")
        path = data_path(corpus, fmt)
        if not path.exists():
            skipped[variant] = f"{path} is missing: run `prepare` first"
            continue
        if kind in ("ours", "bare"):
            try:
                Z.Dataset.from_path("d", str(path))
            except Exception as e:  # noqa: BLE001  # whatever discovery raises is recorded: ours cannot read it
                skipped[variant] = f"{type(e).__name__}: {e}"
                continue
        run.append(variant)
    return run, skipped


def snapshot(path: Path) -> list[tuple[str, int, int]]:
    return sorted((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in path.rglob("*") if f.is_file())


def run_once(corpus: Path, variant: str, timeout: float) -> dict:
    """One child with a fresh scratch folder (and our shard cache in it), page cache warm."""
    kind, _, fmt = variant.partition("_")
    path = data_path(corpus, "parquet" if kind == "floor" else fmt)
    before = snapshot(path)
    subprocess.run(["cat", *(name for name, _, _ in before)], stdout=subprocess.DEVNULL, check=True)
    scratch = Path(tempfile.mkdtemp(prefix="zc-formats-"))
    os.environ["ZEPHON_COLUMNAR_CACHE"] = str(scratch / "cache")
    try:
        row = run_child(str(Path(__file__).resolve()), sys.executable,
                        ["run", "--corpus", str(corpus), "--variant", variant, "--scratch", str(scratch)],
                        timeout=timeout)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    row.setdefault("variant", variant)
    if snapshot(path) != before:
        row["wrote_into_its_data"] = True
        print(f"[formats] WARNING: {variant} changed files under {path}", file=sys.stderr)
    return row


def ratio(runs: dict[str, dict], a: str, b: str) -> float | None:
    x, y = runs.get(a, {}).get("tokens_per_s"), runs.get(b, {}).get("tokens_per_s")
    return x / y if x and y else None


def round_ratios(runs: dict[str, dict]) -> dict[str, float | None]:
    """ours_<fmt> / own_<fmt> and ours_<fmt> / ours_parquet (tokens/s) within one round."""
    out = {}
    for fmt in FORMATS[1:]:
        if f"bare_{fmt}" in runs and f"own_{fmt}" in runs:  # the same output: token ids only
            out[f"bare_{fmt}/own_{fmt}"] = ratio(runs, f"bare_{fmt}", f"own_{fmt}")
        if f"ours_{fmt}" in runs:
            if f"own_{fmt}" in runs:
                out[f"ours_{fmt}/own_{fmt}"] = ratio(runs, f"ours_{fmt}", f"own_{fmt}")
            if "ours_parquet" in runs:
                out[f"ours_{fmt}/ours_parquet"] = ratio(runs, f"ours_{fmt}", "ours_parquet")
    return out


def median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def token_check(rounds: list[dict[str, dict]]) -> dict:
    """Every batch variant's tokens in every round, against the floor's rounded down to full batches."""
    floor_tokens = {r["floor"]["tokens"] for r in rounds if "tokens" in r.get("floor", {})}
    expected = (min(floor_tokens) // (B * L)) * (B * L) if floor_tokens else None
    delivered: dict[str, set[int]] = {}
    for runs in rounds:
        for variant, row in runs.items():
            if variant != "floor" and "tokens" in row:
                delivered.setdefault(variant, set()).add(row["tokens"])
    values = {t for ts in delivered.values() for t in ts} | ({expected} if expected is not None else set())
    return {"expected": expected, "delivered": {v: sorted(ts) for v, ts in delivered.items()},
            "ok": len(values) <= 1 and len(floor_tokens) <= 1}


def summarize(rounds: list[dict[str, dict]], variants: list[str]) -> dict:
    per_round_ratios = [round_ratios(runs) for runs in rounds]
    names = dict.fromkeys(k for r in per_round_ratios for k in r)  # format by format
    medians = {k: median(r.get(k) for r in per_round_ratios) for k in names}
    targets = {k: {"target": 1.0 if "/own_" in k else round(PARQUET_TARGET, 3),
                   "met": None if v is None else v >= (1.0 if "/own_" in k else PARQUET_TARGET)}
               for k, v in medians.items()}
    figures = {v: {key: median(r.get(v, {}).get(key) for r in rounds) for key in FIGURES} for v in variants}
    return {"per_round_ratios": per_round_ratios, "median_ratios": medians, "targets": targets,
            "median_figures": figures}


def run(a: argparse.Namespace) -> None:
    corpus = Path(a.corpus).resolve()
    asked = a.variants.split(",") if a.variants else [*(f"ours_{f}" for f in FORMATS),
                                                      *(f"own_{f}" for f in FORMATS[1:]), "floor"]
    variants, skipped = runnable_variants(corpus, asked)
    for variant, why in skipped.items():
        print(f"[formats] skipped {variant}: {why}", file=sys.stderr)
    os.environ["PYTHONPYCACHEPREFIX"] = str(corpus / "formats" / ".pycache")  # children cache bytecode here
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    load_start = os.getloadavg()
    warmup = {}
    if a.warmup:
        print(f"[formats] warm-up round: {', '.join(variants)}", file=sys.stderr)
        warmup = {v: run_once(corpus, v, a.timeout) for v in variants}
    rounds: list[dict[str, dict]] = []
    for rnd in range(a.rounds):
        order = variants[rnd % len(variants):] + variants[:rnd % len(variants)]
        runs: dict[str, dict] = {}
        for variant in order:
            row = run_once(corpus, variant, a.timeout)
            runs[variant] = {**row, "round": rnd, "position": len(runs)}
            shown = f"{row['tokens_per_s'] / 1e6:.1f} Mtok/s" if "tokens_per_s" in row else f"ERROR {row['error']}"
            print(f"[formats] round {rnd} {variant}: {shown}", file=sys.stderr)
        rounds.append(runs)
    check = token_check(rounds)
    if not check["ok"]:
        print(f"[formats] !!! TOKEN MISMATCH !!! expected {check['expected']} everywhere, got {check['delivered']}",
              file=sys.stderr)
    out = {"benchmark": "formats", "date": started, "corpus": str(corpus), "rounds_run": a.rounds,
           "variants": variants, "skipped": skipped, "ours_source": source_id(),
           "machine": {"cpus": os.cpu_count(), "loadavg_start": load_start, "loadavg_end": os.getloadavg()},
           "cold_caches": "ours: ZEPHON_COLUMNAR_CACHE a fresh folder per run; own_mds_zstd: mds_zstd/ copied "
                          "to a fresh folder per run before the clock; page cache warm",
           "warmup": {v: r.get("tokens_per_s", r.get("error", "")[-300:]) for v, r in warmup.items()},
           "runs": rounds, "token_check": check, "summary": summarize(rounds, variants)}
    print(json.dumps(out))


# ------------------------------------------------------------------ report


def report(path: str) -> None:
    d = json.loads(Path(path).read_text().strip().splitlines()[-1])
    s, rounds = d["summary"], d["runs"]
    print(f"{d['date']}, corpus {d['corpus']}, source {d['ours_source']}, {d['rounds_run']} rounds, "
          f"load {d['machine']['loadavg_start'][0]:.1f} -> {d['machine']['loadavg_end'][0]:.1f}\n")
    print("| variant | tokens/s (median) | per round (M) | first batch s | CPU s | peak RSS MB | "
          "RSS after imports MB | tokens |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for v in d["variants"]:
        m = s["median_figures"][v]
        per = " / ".join(f"{r[v]['tokens_per_s'] / 1e6:.1f}" if "tokens_per_s" in r.get(v, {}) else "err"
                         for r in rounds)
        first = "-" if m["first_batch_s"] is None else f"{m['first_batch_s']:.3f}"
        tokens = d["token_check"]["delivered"].get(v, [rounds[0].get(v, {}).get("tokens")])
        tps = "-" if m["tokens_per_s"] is None else f"{m['tokens_per_s'] / 1e6:.2f}M"
        cpu = "-" if m["cpu_s"] is None else f"{m['cpu_s']:.2f}"
        rss = "-" if m["peak_rss_mb"] is None else f"{m['peak_rss_mb']:.0f}"
        rss_imports = "-" if m["rss_after_imports_mb"] is None else f"{m['rss_after_imports_mb']:.0f}"
        print(f"| {v} | {tps} | {per} | {first} | {cpu} | {rss} | {rss_imports} | {tokens} |")
    print(f"\ntokens: {'same everywhere' if d['token_check']['ok'] else 'MISMATCH'} "
          f"(expected {d['token_check']['expected']})\n")
    print("| ratio of tokens/s | per round | median | target |")
    print("| --- | --- | --- | --- |")
    for k, med in s["median_ratios"].items():
        per = " / ".join("-" if r.get(k) is None else f"{r[k]:.2f}" for r in s["per_round_ratios"])
        t = s["targets"][k]
        met = "-" if t["met"] is None else "met" if t["met"] else "MISSED"
        print(f"| {k} | {per} | **{'-' if med is None else f'{med:.2f}'}** | >= {t['target']} ({met}) |")
    if d["skipped"]:
        print("\nskipped: " + "; ".join(f"{v}: {why[:200]}" for v, why in d["skipped"].items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="write <corpus>/formats/ from <corpus>/pretok")
    p.add_argument("--corpus", required=True)
    r = sub.add_parser("run", help="interleaved rounds of fresh processes; one JSON line on stdout")
    r.add_argument("--corpus", required=True)
    r.add_argument("--rounds", type=int, default=3)
    r.add_argument("--variants", default="", help="comma list (default: every variant whose files exist)")
    r.add_argument("--no-warmup", dest="warmup", action="store_false", help="skip the discarded warm-up round")
    r.add_argument("--timeout", type=float, default=1800, help="seconds per child")
    r.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    r.add_argument("--variant", help=argparse.SUPPRESS)
    r.add_argument("--scratch", help=argparse.SUPPRESS)
    q = sub.add_parser("report", help="Markdown tables from run's JSON line")
    q.add_argument("file")
    a = ap.parse_args()
    if a.command == "prepare":
        prepare(Path(a.corpus))
    elif a.command == "report":
        report(a.file)
    elif a.child:
        print(json.dumps(child(Path(a.corpus), a.variant, Path(a.scratch))))
    else:
        run(a)


if __name__ == "__main__":
    main()
