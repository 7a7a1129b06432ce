"""``build_index``: write a dataset directory's shard index, ``index.json`` (Zephon's format).

The index lists each shard file with its size and row count (``{"format_version": 1, "shards":
[{"basename", "bytes", "num_rows", "hashes", "extra"}, ...]}``), what Zephon reads to skip
opening every file at discovery. Directory discovery never reads ``index.json`` as data.

CLI: ``python -m zephon_columnar.build_index <format> <dataset_dir>`` (`_cli` reads
``sys.argv`` and exits with status 1 on a usage error or a failure, as Zephon's entry does).

Example:
    >>> import json, os, tempfile
    >>> import pyarrow as pa, pyarrow.parquet as pq
    >>> root = tempfile.mkdtemp()
    >>> pq.write_table(pa.table({"text": ["a", "b", "c"]}), os.path.join(root, "part-0.parquet"))
    >>> path = build_index("parquet", root, progress=False)
    >>> [(s["basename"], s["num_rows"]) for s in json.load(open(path))["shards"]]
    [('part-0.parquet', 3)]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from zephon_columnar.errors import ConfigError
from zephon_columnar.io import fs
from zephon_columnar.io.discovery import discover

INDEXABLE_FORMATS = ("jsonl", "parquet", "vortex")
FORMAT_VERSION = 1


def build_index(
    format_name: str,
    dataset_dir: str | Path,
    *,
    output_path: str | Path | None = None,
    progress: bool = True,
    max_workers: int = 8,
) -> str:
    """Write ``index.json`` for the ``format_name`` files directly in ``dataset_dir`` (local or
    a URL) to ``output_path`` (default ``dataset_dir/index.json``); return where it went.
    ``max_workers`` is accepted for Zephon's signature (files are read one after another)."""
    if format_name not in INDEXABLE_FORMATS:
        raise ConfigError(
            f"build_index: format {format_name!r} cannot be indexed; use one of {list(INDEXABLE_FORMATS)}."
        )
    if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
        raise ConfigError(f"build_index: max_workers={max_workers!r}; pass an int >= 1.")
    root = os.fspath(dataset_dir)
    found = discover(fs.basename(root.rstrip("/")) or "dataset", root, fmt=format_name)
    shards: list[dict[str, Any]] = [
        {
            "basename": fs.basename(shard.path or ""),
            "bytes": int(shard.num_bytes),
            "num_rows": int(shard.num_rows),
            "hashes": {},
            "extra": {},
        }
        for shard in found.shards
    ]
    target = os.fspath(output_path) if output_path is not None else fs.join(root, fs.INDEX_FILE)
    fs.write_bytes(target, json.dumps({"format_version": FORMAT_VERSION, "shards": shards}, indent=2).encode())
    if progress:
        print(f"index.json: {len(shards)} shards, {sum(s['num_rows'] for s in shards):,} rows -> {target}")
    return target


def _cli(argv: list[str] | None = None) -> None:
    """The command line: ``<format> <dataset_dir>`` from ``argv`` (default ``sys.argv[1:]``);
    exits with status 1, after a usage note or an ``Error:`` line, when it cannot index."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("Usage: python -m zephon_columnar.build_index <format> <dataset_dir>")
        print()
        print("Creates index.json for fast dataset discovery.")
        print(f"Indexable formats: {', '.join(INDEXABLE_FORMATS)}")
        sys.exit(1)
    try:
        build_index(args[0], args[1])
    except Exception as exc:  # noqa: BLE001 - a CLI: report, do not trace back
        print(f"Error: {exc}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    _cli()


__all__ = ["build_index"]
