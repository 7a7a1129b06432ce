"""Write a small real-text dataset from text every Python install has: the docstrings of the
standard library. Two datasets: "docs" as Parquet shards, "code_docs" as JSONL shards."""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SKIP = ("test", "idlelib", "tkinter", "turtle", "antigravity", "this", "__main__", "lib2to3", "ensurepip")


def stdlib_docstrings(limit: int) -> list[str]:
    """Docstrings of stdlib modules, classes and functions (deterministic order)."""
    texts: list[str] = []
    names = sorted(m.name for m in pkgutil.iter_modules() if m.module_finder.path.find("site-packages") < 0)
    for name in names:
        if name.startswith("_") or name.startswith(SKIP):
            continue
        try:
            mod = importlib.import_module(name)
        except Exception:  # some modules need a display or optional C libraries
            continue
        for obj in [mod] + [v for _, v in sorted(vars(mod).items()) if inspect.isclass(v) or inspect.isfunction(v)]:
            doc = inspect.getdoc(obj)
            if doc and len(doc) > 20:
                texts.append(doc)
                if len(texts) >= limit:
                    return texts
    return texts


def write_demo_data(root: Path, *, docs: int = 6000, shards: int = 4) -> tuple[Path, Path]:
    """Parquet shards of the first 2/3 of the texts, JSONL shards of the rest."""
    texts = stdlib_docstrings(docs)
    cut = len(texts) * 2 // 3
    parquet_dir, jsonl_dir = root / "docs_parquet", root / "docs_jsonl"
    parquet_dir.mkdir(parents=True, exist_ok=True)
    jsonl_dir.mkdir(parents=True, exist_ok=True)
    for s in range(shards):
        part = list(range(s, cut, shards))
        pq.write_table(pa.table({"id": part, "text": [texts[i] for i in part]}),
                       parquet_dir / f"part-{s:03d}.parquet", row_group_size=256)
        rest = list(range(cut + s, len(texts), shards))
        with open(jsonl_dir / f"part-{s:03d}.jsonl", "w") as f:
            for i in rest:
                f.write(json.dumps({"id": i, "text": texts[i]}) + "\n")
    return parquet_dir, jsonl_dir
