"""Issue 10: the pre-tokenized job from a local S3 server with injected latency vs from local disk.

A real S3-compatible server (moto, ``tests/s3_server.py``) runs in its own process on loopback
and answers every request after ``--latency-ms`` (20 ms: an object store in the same region);
``<corpus>/pretok`` is uploaded to it once. Then, in fresh processes and interleaved rounds:

    local          Dataset.from_path("train", "<corpus>/pretok")
    s3             Dataset.from_path("train", "s3://bench/pretok")                  (a cold cache)
    s3_prefetch    the same with .prefetch(buffer_size=--prefetch-samples, parallelism=--prefetch-threads)
    s3_prefetch_limited   s3_prefetch with CacheOptions(limit_bytes=--limit-shards shards):
                   the cache evicts as the pass goes
    s3_download_only      discovery, then every shard downloaded on --prefetch-threads threads,
                   no pipeline: what the downloads cost on their own (wall, CPU)

    Z.Pipeline(ws)[.prefetch(...)].pack_flat(2048, algorithm="wrap").batch(8)
        .options(runner=--runner (threads)).enable_observability()
    for b in p: b.to_training(return_padding_mask=True)

``--copies N`` serves every shard N times (under other names; locally N copies of it): a job N
times longer, where the fixed costs (importing s3fs, botocore's session,
discovery) no longer decide the figure.

Each child imports torch first (a training script has), then times discovery + the pass: the
first batch, tokens/s over the whole pass, and the shard cache's counts from
``fetch_timing_snapshot().cache`` (downloads, hits, evictions, retries). Every S3 run starts with an
empty cache directory. One JSON line per run (stdout and ``--out``).

    PYTHONPATH=. .venv/bin/python benchmarks/object_storage.py --corpus benchmarks/data/large --rounds 3 \\
        --copies 4 --out benchmarks/results/object_storage_large_x4.jsonl
    .venv/bin/python benchmarks/object_storage.py --report benchmarks/results/object_storage_large_x4.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _child import interleaved_rounds, run_child

L, B = 2048, 8
BUCKET = "bench"
REPO = Path(__file__).resolve().parents[1]


def child(a: argparse.Namespace) -> dict:
    import torch  # noqa: F401  # a training script has torch loaded before its loader runs

    t0, c0 = time.perf_counter(), time.process_time()
    import zephon_columnar as Z

    path = local_dir(a.corpus, a.copies) if a.variant == "local" else f"s3://{BUCKET}/pretok"
    ds = Z.Dataset.from_path("train", path)
    discovered = time.perf_counter() - t0
    if a.variant == "s3_download_only":  # what the downloads alone cost: no pipeline
        from zephon_columnar.io import fs

        fs.prefetch([s.path for s in ds.shards], parallelism=a.prefetch_threads)
        wall = time.perf_counter() - t0
        return {"variant": a.variant, "seconds": wall, "discovery_s": discovered, "download_s": wall - discovered,
                "cpu_s": time.process_time() - c0, "bytes": sum(s.num_bytes for s in ds.shards)}
    ws = Z.StaticMixtureWorkSource(datasets=[ds], mixture=Z.MixtureSpec({"train": 1.0}), seed=42, chunk_size=1024)
    p = Z.Pipeline(ws)
    if a.variant.startswith("s3_prefetch"):
        p = p.prefetch(buffer_size=a.prefetch_samples, parallelism=a.prefetch_threads)
    p = p.pack_flat(L, algorithm="wrap").batch(B).options(runner=a.runner).enable_observability()
    if a.variant == "s3_prefetch_limited":
        largest = max(s.num_bytes for s in ds.shards)
        p = p.options(io_options={"cache": {"enabled": True, "limit_bytes": a.limit_shards * largest}})
    tokens, first = 0, None
    for b in p:
        tr = b.to_training(return_padding_mask=True)
        pad = tr.get("padding_mask")
        tokens += tr["input_ids"].numel() - (int(pad.sum()) if pad is not None else 0)
        if first is None:
            first = time.perf_counter() - t0
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    fetch = p.fetch_timing_snapshot()
    fetch_totals = fetch.stages[0].totals if fetch is not None and 0 in fetch.stages else None
    prefetch = p.prefetch_timing_snapshot()
    return {"variant": a.variant, "tokens": tokens, "seconds": wall, "tokens_per_s": tokens / wall,
            "first_batch_s": first, "discovery_s": discovered,
            "after_first_tokens_per_s": tokens / (wall - first) if first is not None else None,
            "cpu_s": cpu, "fetch_busy_s": fetch_totals.read_ns / 1e9 if fetch_totals is not None else None,
            "cache": fetch.cache if fetch is not None else None,
            "prefetch": dataclasses.asdict(prefetch.stages[0]) if prefetch is not None else None}


def start_server(latency_ms: float) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "tests.s3_server", "--latency-ms", str(latency_ms)],
                            cwd=REPO, stdout=subprocess.PIPE, text=True)
    endpoint = proc.stdout.readline().strip()
    if not endpoint.startswith("http://"):
        proc.kill()
        raise SystemExit(f"the S3 server did not start (printed {endpoint!r})")
    return proc, endpoint


def local_dir(corpus: str, copies: int) -> str:
    """``<corpus>/pretok``, or with ``copies`` > 1 a folder of that many copies of each of its
    shards (a longer job, so that fixed costs do not decide the figure). Real copies, not links:
    the local job reads as many distinct bytes as the S3 one downloads."""
    src = os.path.join(corpus, "pretok")
    if copies == 1:
        return src
    dst = os.path.join(corpus, f"pretok_x{copies}")
    if not os.path.isdir(dst):
        os.makedirs(dst)
        for name in sorted(os.listdir(src)):
            if name.endswith(".parquet"):
                for c in range(copies):
                    shutil.copyfile(os.path.join(src, name), os.path.join(dst, f"c{c}-{name}"))
    return dst


def upload(corpus: str, copies: int) -> int:
    import s3fs

    client = s3fs.S3FileSystem(skip_instance_cache=True)
    client.mkdir(BUCKET)
    from tests.s3_server import upload_dir

    return len(upload_dir(client, local_dir(corpus, copies), f"s3://{BUCKET}/pretok"))


def report(path: str) -> None:
    """Markdown table of a results file: medians per variant, ratios to ``local``."""
    import statistics

    runs: dict[str, list[dict]] = {}
    for line in open(path):
        row = json.loads(line)
        if "variant" in row and "error" not in row:
            runs.setdefault(row["variant"], []).append(row)

    def med(variant: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[variant])

    print("| variant | runs | tokens/s | / local | after first batch | / local | first batch | discovery | CPU-s | cache (last run) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for v, rows in runs.items():
        if v == "s3_download_only":
            print(f"| {v} | {len(rows)} | - | - | - | - | - | {med(v, 'discovery_s'):.2f} s | {med(v, 'cpu_s'):.2f} | "
                  f"downloads {med(v, 'download_s'):.2f} s for {rows[-1]['bytes'] / 1e6:.0f} MB |")
            continue
        tps, after = med(v, "tokens_per_s"), med(v, "after_first_tokens_per_s")
        print(f"| {v} | {len(rows)} | {tps / 1e6:.1f}M | {tps / med('local', 'tokens_per_s'):.2f} | {after / 1e6:.1f}M | "
              f"{after / med('local', 'after_first_tokens_per_s'):.2f} | {med(v, 'first_batch_s'):.2f} s | "
              f"{med(v, 'discovery_s'):.2f} s | {med(v, 'cpu_s'):.2f} | {rows[-1]['cache']} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default="", help="the corpus folder (required unless --report)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--variants", default="local,s3,s3_prefetch,s3_prefetch_limited,s3_download_only")
    ap.add_argument("--prefetch-samples", type=int, default=16384, help="prefetch(buffer_size=...)")
    ap.add_argument("--prefetch-threads", type=int, default=4, help="prefetch(parallelism=...)")
    ap.add_argument("--runner", default="threads")
    ap.add_argument("--limit-shards", type=int, default=6, help="s3_prefetch_limited: the cache holds this many shards")
    ap.add_argument("--copies", type=int, default=1, help="each shard this many times (under other names)")
    ap.add_argument("--out", default="")
    ap.add_argument("--report", default="", help="print the table of a results file and exit")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--variant", default="local")
    a = ap.parse_args()
    if a.report:
        report(a.report)
        return
    if a.child:
        print(json.dumps(child(a)))
        return
    if not a.corpus or not Path(a.corpus, "pretok").is_dir():
        raise SystemExit(f"{a.corpus}/pretok is missing: benchmarks/README.md, setup step 2, writes it")
    sys.path.insert(0, str(REPO))
    from tests.s3_server import TEST_CREDENTIALS

    os.environ.update(TEST_CREDENTIALS)
    server, endpoint = start_server(a.latency_ms)
    os.environ["FSSPEC_S3_ENDPOINT_URL"] = endpoint  # the children's fsspec reads it
    import fsspec.config

    fsspec.config.conf["s3"] = {"endpoint_url": endpoint}
    caches = tempfile.mkdtemp(prefix="zc-os-bench-")
    try:
        shards = upload(a.corpus, a.copies)
        print(json.dumps({"server": endpoint, "latency_ms": a.latency_ms, "shards": shards}), flush=True)
        me = str(Path(__file__).resolve())

        def run_one(variant: str) -> dict:
            cache = os.path.join(caches, "run")
            shutil.rmtree(cache, ignore_errors=True)
            os.environ["ZEPHON_COLUMNAR_CACHE"] = cache  # every run starts with an empty cache
            subprocess.run(["cat", *map(str, Path(local_dir(a.corpus, a.copies)).glob("*.parquet"))],
                           stdout=subprocess.DEVNULL, check=True)  # local files in the page cache, as the server's are in memory
            row = run_child(me, sys.executable, ["--corpus", a.corpus, "--variant", variant, "--copies", str(a.copies),
                                                 "--prefetch-samples", str(a.prefetch_samples),
                                                 "--prefetch-threads", str(a.prefetch_threads), "--runner", a.runner,
                                                 "--limit-shards", str(a.limit_shards)], timeout=1800)
            row.setdefault("variant", variant)
            row.update(latency_ms=a.latency_ms, copies=a.copies, runner=a.runner, prefetch_threads=a.prefetch_threads,
                       prefetch_samples=a.prefetch_samples)
            return row

        interleaved_rounds(a.variants.split(","), a.rounds, run_one, corpus=a.corpus, out=a.out)
    finally:
        server.kill()
        shutil.rmtree(caches, ignore_errors=True)


if __name__ == "__main__":
    main()
