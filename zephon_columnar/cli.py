"""The command line: the questions users ask before they train.

``python -m zephon_columnar inspect PATH``: what a dataset folder holds (format, shards, rows,
bytes, schema, a sample row), read without loading it.

``python -m zephon_columnar bench PATH --tokenizer tokenizer.json``: a recipe's speed on this
machine: read -> tokenize -> pack_flat -> batch (or, with ``--tokens-field``, read already
tokenized rows -> pack -> batch), with a progress readout, then the first batch's latency,
batches/s, tokens/s and the peak RSS. ``torch`` is imported before the clock starts, as in a
training script.

Example:
    >>> import io, contextlib, tempfile, pyarrow as pa, pyarrow.parquet as pq
    >>> folder = tempfile.mkdtemp()
    >>> pq.write_table(pa.table({"text": ["a b", "c"]}), f"{folder}/part-0.parquet")
    >>> out = io.StringIO()
    >>> with contextlib.redirect_stdout(out):
    ...     status = main(["inspect", folder])
    >>> status, [line for line in out.getvalue().splitlines() if line.startswith(("format", "rows"))]
    (0, ['format: parquet', 'rows: 2'])
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from collections.abc import Sequence
from typing import Any

from zephon_columnar.errors import ZephonError


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (2 for bad arguments or input)."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return args.command(args)
    except (ZephonError, FileNotFoundError, ValueError) as err:
        print(f"zephon_columnar {args.name}: {type(err).__name__}: {err}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m zephon_columnar", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    inspect = commands.add_parser("inspect", help="format, shards, rows, schema and a sample row of a dataset")
    inspect.add_argument("path", help="a folder (or fsspec URL) of Parquet, JSONL or Arrow files")
    inspect.add_argument("--format", choices=["parquet", "jsonl", "arrow"], help="skip format detection")
    inspect.add_argument("--shards", type=int, default=5, help="shards to list (default 5)")
    inspect.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    inspect.set_defaults(command=inspect_command, name="inspect")

    bench = commands.add_parser("bench", help="a recipe's throughput, first batch and memory on this machine")
    bench.add_argument("path", help="a folder (or fsspec URL) of Parquet, JSONL or Arrow files")
    bench.add_argument("--format", choices=["parquet", "jsonl", "arrow"], help="skip format detection")
    source = bench.add_mutually_exclusive_group(required=True)
    source.add_argument("--tokenizer", help="a tokenizer.json file or a save_pretrained folder")
    source.add_argument("--tokens-field", help="the rows are tokenized already: their token-id column")
    bench.add_argument("--field", default="text", help="the text field to tokenize (default text)")
    bench.add_argument("--max-length", type=int, default=2048, help="packed row length (default 2048)")
    bench.add_argument("--algorithm", default="wrap", choices=["wrap", "first_fit", "best_fit", "best_fit_wrap"])
    bench.add_argument("--num-bins", type=int, default=16, help="open bins for first_fit / best_fit (default 16)")
    bench.add_argument("--batch", type=int, default=8, help="rows per batch (default 8)")
    bench.add_argument("--runner", default="threads", choices=["inline", "threads", "process", "remote"])
    bench.add_argument("--max-batches", type=int, default=None, help="stop after this many batches")
    bench.add_argument("--progress-every", type=float, default=5.0, help="seconds between progress lines")
    bench.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    bench.set_defaults(command=bench_command, name="bench")
    return parser


# ---------------------------------------------------------------------- inspect
def inspect_command(args: argparse.Namespace) -> int:
    from zephon_columnar.io.dataset import Dataset

    ds = Dataset.from_path("data", args.path, fmt=args.format)
    sample = _first_row(ds)
    report = {
        "path": args.path,
        "format": ds.format_name,
        "shards": ds.shard_count(),
        "rows": ds.total(),
        "bytes": int(ds.raw_bytes().sum()),
        "shard_list": [
            {"id": s.shard_id, "rows": s.num_rows, "bytes": s.num_bytes, "path": s.path}
            for s in ds.shards[: max(0, args.shards)]
        ],
        "schema": {f.name: str(f.type) for f in sample.schema} if sample is not None else {},
        "sample_row": _shortened(sample.to_pylist()[0]) if sample is not None else None,
    }
    if args.json:
        print(json.dumps(report, default=str))
        return 0
    print(
        f"path: {report['path']}\nformat: {report['format']}\nshards: {report['shards']}\n"
        f"rows: {report['rows']}\nbytes: {report['bytes']:,}"
    )
    for s in report["shard_list"]:
        print(f"  shard {s['id']}: {s['rows']:,} rows, {s['bytes']:,} bytes, {s['path']}")
    if ds.shard_count() > len(report["shard_list"]):
        print(f"  ... {ds.shard_count() - len(report['shard_list'])} more")
    print("schema:")
    for name, kind in report["schema"].items():
        print(f"  {name}: {kind}")
    print(f"sample row: {json.dumps(report['sample_row'], default=str, ensure_ascii=False)}")
    return 0


def _first_row(ds: Any) -> Any:
    import numpy as np

    first = next((s for s in ds.shards if s.num_rows), None)
    if first is None:
        return None
    reader = ds.open_reader()
    try:
        return reader.take(first.shard_id, np.zeros(1, dtype=np.int64))
    finally:
        reader.close()


def _shortened(value: Any, limit: int = 200) -> Any:
    """A sample value small enough to print: long strings and lists cut, with their length."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]}... ({len(value):,} chars)"
    if isinstance(value, list) and len(value) > 16:
        return [_shortened(v) for v in value[:16]] + [f"... ({len(value):,} items)"]
    if isinstance(value, dict):
        return {k: _shortened(v) for k, v in value.items()}
    return value


# ---------------------------------------------------------------------- bench
def bench_command(args: argparse.Namespace) -> int:
    import torch  # noqa: F401  # a training script has torch loaded before its loader starts

    from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource

    t0 = time.perf_counter()
    ds = Dataset.from_path("data", args.path, fmt=args.format)
    pipe = Pipeline(StaticMixtureWorkSource([ds], {"data": 1.0}, seed=0))
    tokens_field = args.tokens_field or "input_ids"
    if args.tokenizer is not None:
        pipe = pipe.tokenize(tokenizer_id=args.tokenizer, field=args.field, special_tokens="eos")
    bins = {"num_bins": args.num_bins} if args.algorithm in ("first_fit", "best_fit") else {}
    pipe = (
        pipe.pack_flat(args.max_length, algorithm=args.algorithm, tokens_field=tokens_field, **bins)
        .batch(args.batch)
        .options(runner=args.runner)
        .show_progress(args.progress_every)
    )
    batches = 0
    first = None
    for _batch in pipe:
        batches += 1
        if first is None:
            first = time.perf_counter() - t0
        if args.max_batches is not None and batches >= args.max_batches:
            break
    seconds = time.perf_counter() - t0
    tokens = batches * args.batch * args.max_length
    report = {
        "path": args.path,
        "runner": args.runner,
        "algorithm": args.algorithm,
        "batches": batches,
        "tokens": tokens,
        "seconds": round(seconds, 3),
        "first_batch_s": None if first is None else round(first, 3),
        "batches_per_s": round(batches / seconds, 2),
        "tokens_per_s": round(tokens / seconds),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"{batches} batches of {args.batch} x {args.max_length} tokens in {seconds:.2f} s: "
            f"{report['tokens_per_s']:,} tokens/s, {report['batches_per_s']} batches/s; first batch "
            f"{report['first_batch_s']} s; peak RSS {report['peak_rss_mb']} MB"
        )
    return 0
