#!/usr/bin/env python3
"""Discovery once per job, at 100,000 objects: what a rank pays with and without the manifest.

One Parquet folder of N files (``scale.py``'s ``files-N`` layout: hard links to the pool's
one-row-group files), three fresh processes of ours (each imports torch and the library, then
starts the clock):

  alone     no job id: ``Dataset.from_path`` lists the folder and reads every footer
  writer    ``ZEPHON_COLUMNAR_JOB_ID`` set, ``ZEPHON_COLUMNAR_MANIFESTS`` a fresh folder,
            ``RANK=0``: discovers as ``alone`` and writes the manifest
  reader    the same job, ``RANK=1``: reads the manifest (what every other rank of the job does)

Each prints one JSON line: seconds in ``Dataset.from_path``, shards and rows found, peak RSS,
and (writer) the manifest's size. A local folder stands in for a bucket: there the listing is
~100 list requests of 1,000 keys for each rank that discovers, which the manifest saves too.

Usage (from the repository root; one benchmark at a time on this 2-vCPU machine)::

    PY=.venv/bin/python
    $PY benchmarks/scale.py generate --cells "files:100000" --distinct 20000
    $PY benchmarks/manifest_scale.py --files 100000 > benchmarks/results/manifest_scale.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def child(folder: str) -> dict:
    import torch  # noqa: F401  (a trainer has torch loaded before its loader starts)

    import zephon_columnar as Z

    t0 = time.perf_counter()
    ds = Z.Dataset.from_path("big", folder, fmt="parquet")
    seconds = time.perf_counter() - t0
    return {
        "from_path_s": seconds,
        "shards": len(ds.counts()),
        "rows": int(ds.counts().sum()),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def run(files: int) -> None:
    folder = HERE / "data" / "scale" / f"files-{files}"
    if not folder.is_dir():
        raise SystemExit(f"{folder} is missing: run `scale.py generate --cells files:{files} --distinct 20000`")
    base = {k: v for k, v in os.environ.items() if not k.startswith("ZEPHON_COLUMNAR_")}
    base["PYTHONPATH"] = str(REPO)
    job = f"bench-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as manifests:
        forms = {
            "alone": {},
            "writer": {"ZEPHON_COLUMNAR_JOB_ID": job, "ZEPHON_COLUMNAR_MANIFESTS": manifests, "RANK": "0"},
            "reader": {"ZEPHON_COLUMNAR_JOB_ID": job, "ZEPHON_COLUMNAR_MANIFESTS": manifests, "RANK": "1"},
        }
        for form, extra in forms.items():
            t0 = time.perf_counter()
            out = subprocess.run(
                [sys.executable, __file__, "child", str(folder)],
                env={**base, **extra},
                capture_output=True,
                text=True,
                check=True,
            )
            row = {"bench": "manifest_scale", "files": files, "form": form, **json.loads(out.stdout.splitlines()[-1])}
            row["wall_s"] = time.perf_counter() - t0
            if form == "writer":
                row["manifest_bytes"] = sum(p.stat().st_size for p in Path(manifests).rglob("*") if p.is_file())
            print(json.dumps(row), flush=True)
            print(f"[manifest_scale] {form}: from_path {row['from_path_s']:.2f} s", file=sys.stderr)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        print(json.dumps(child(sys.argv[2])))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=100_000)
    run(parser.parse_args().files)


if __name__ == "__main__":
    main()
