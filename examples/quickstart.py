"""The README example, runnable: two datasets (Parquet + JSONL) -> filter -> batch -> tensors,
with a checkpoint taken mid-stream and restored into a fresh pipeline."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo_data import write_demo_data  # noqa: E402

import zephon_columnar as zephon  # noqa: E402


def build(web_dir: Path, code_dir: Path) -> zephon.Pipeline:
    web = zephon.Dataset.from_path("web", str(web_dir))
    code = zephon.Dataset.from_path("code", str(code_dir))
    ws = zephon.StaticMixtureWorkSource([web, code], {"web": 0.7, "code": 0.3}, chunk_size=256, seed=0)
    return (zephon.Pipeline(ws)
            .filter(pl.col("text").str.len_chars() > 200)
            .map_transform([pl.col("text").str.strip_chars(),
                            pl.col("text").str.len_bytes().alias("n_bytes")])
            .batch(8))


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        web_dir, code_dir = write_demo_data(Path(tmp), docs=1500)
        pipe = build(web_dir, code_dir)
        seen = []
        for step, batch in enumerate(pipe):
            seen.append(batch.to_pydict()["id"])
            if step == 10:
                saved = json.dumps(pipe.checkpoint())
        resumed = build(web_dir, code_dir)
        resumed.restore(json.loads(saved))
        rest = [b.to_pydict()["id"] for b in resumed]
        assert rest == seen[11:], "resume must continue exactly"
        print(f"{len(seen)} batches of 8; resumed after batch 11 and got the same {len(rest)} batches")


if __name__ == "__main__":
    main()
