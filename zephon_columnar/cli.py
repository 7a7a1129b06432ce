"""The command line: the questions users ask before they train.

``python -m zephon_columnar inspect PATH``: what a dataset folder holds (format, shards, rows,
bytes, schema, a sample row), read without loading it.

``python -m zephon_columnar bench PATH [PATH ...] --tokenizer tokenizer.json``: a recipe's speed
on this machine: read (several datasets mixed by ``--weights``) -> tokenize -> [shuffle] ->
pack_flat -> batch (or, with ``--tokens-field``, read already tokenized rows -> pack -> batch),
with a progress readout, then the first batch's latency, batches/s, real and padded tokens/s and
the peak RSS. ``--recipe recipe.json`` gives the same settings from a file (its keys are the
flags' names, ``"paths"`` the datasets; flags given too win). ``torch`` is imported before the
clock starts, as in a training script. When packing or batching dropped tokens (documents longer
than ``--max-length`` under a bin packer, a final partial row or batch), the summary says how many.

``python -m zephon_columnar cache info``: where the on-disk caches are (downloaded shards, JSONL
and tar indexes), with their size and file count; ``cache clear`` removes them
(`zephon_columnar.io.caches`). Installed, the command is also ``zephon-columnar``.

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
import os
import resource
import sys
import time
from collections.abc import Sequence
from typing import Any

from zephon_columnar.errors import ConfigError, ZephonError
from zephon_columnar.options import DEFAULT_RUNNER, RUNNER_OF_CHOICE


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (2 for bad arguments or input)."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.name == "bench" and args.recipe is not None:
            _apply_recipe(args, args.recipe)
        return int(args.command(args))
    except (ZephonError, OSError, ValueError, TypeError) as err:
        print(f"zephon_columnar {args.name}: {type(err).__name__}: {err}", file=sys.stderr)
        return 2


def entry() -> None:
    """The ``zephon-columnar`` console script."""
    sys.exit(main())


def _parser() -> argparse.ArgumentParser:
    from zephon_columnar import __version__

    parser = argparse.ArgumentParser(prog="python -m zephon_columnar", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"zephon_columnar {__version__}")
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    inspect = commands.add_parser("inspect", help="format, shards, rows, schema and a sample row of a dataset")
    inspect.add_argument("path", help="a folder, file, glob or fsspec URL of a dataset (any --format)")
    inspect.add_argument("--format", choices=_format_names(), help="skip format detection")
    inspect.add_argument("--shards", type=_count, default=5, help="shards to list (default 5)")
    inspect.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    inspect.set_defaults(command=inspect_command, name="inspect")

    bench = commands.add_parser("bench", help="a recipe's throughput, first batch and memory on this machine")
    _bench_arguments(bench)
    bench.set_defaults(command=bench_command, name="bench")

    cache = commands.add_parser("cache", help="where the on-disk caches are, and removing them")
    actions = cache.add_subparsers(required=True, metavar="ACTION")
    info = actions.add_parser("info", help="each cache folder with its size and file count")
    info.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    info.set_defaults(command=cache_info_command, name="cache info")
    clear = actions.add_parser("clear", help="remove the cache folders (they are rebuilt on demand)")
    clear.set_defaults(command=cache_clear_command, name="cache clear")
    return parser


def _format_names() -> list[str]:
    """Every format ``--format`` may name: the registry's (`zephon_columnar.io.registry`)."""
    from zephon_columnar.io.registry import formats

    return [f.name for f in formats()]


def _count(text: str) -> int:
    """An argparse type: a whole number >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; pass a count such as 5") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; pass a count >= 0, such as 5")
    return value


def _bench_arguments(bench: argparse.ArgumentParser) -> None:
    """The flags of ``bench`` (also the settings a ``--recipe`` file may hold)."""
    bench.add_argument("paths", nargs="*", metavar="PATH", help="datasets: folders, files, globs or fsspec URLs")
    bench.add_argument("--recipe", help="a JSON file of these settings (keys: the flags' names, 'paths')")
    bench.add_argument("--weights", type=_floats, help="mixture weights, one per PATH, comma-separated (default equal)")
    bench.add_argument("--format", choices=_format_names(), help="skip format detection")
    bench.add_argument("--tokenizer", help="a tokenizer.json file or a save_pretrained folder")
    bench.add_argument("--tokens-field", help="the rows are tokenized already: their token-id column")
    bench.add_argument("--eos-token-id", type=int, help="the EOS id to append, when the tokenizer names none")
    bench.add_argument("--field", default="text", help="the text field to tokenize (default text)")
    bench.add_argument("--shuffle", type=int, default=0, help="a shuffle buffer of this many rows before packing")
    bench.add_argument("--chunk-size", type=int, default=1024, help="the work source's chunk size (default 1024)")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--max-length", type=int, default=2048, help="packed row length (default 2048)")
    bench.add_argument("--algorithm", default="wrap", choices=["wrap", "first_fit", "best_fit", "best_fit_wrap"])
    bench.add_argument("--num-bins", type=int, default=16, help="open bins for first_fit / best_fit (default 16)")
    bench.add_argument("--batch", type=int, default=8, help="rows per batch (default 8)")
    bench.add_argument("--runner", default=DEFAULT_RUNNER, choices=list(RUNNER_OF_CHOICE))
    bench.add_argument("--max-batches", type=_count, default=None, help="stop after this many batches")
    bench.add_argument("--progress-every", type=float, default=5.0, help="seconds between progress lines")
    bench.add_argument("--json", action="store_true", help="print the figures as one JSON object")


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
def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: pass numbers separated by commas, e.g. 0.7,0.3") from None


def _apply_recipe(args: argparse.Namespace, path: str) -> None:
    """The settings of a recipe file, where the command line left a flag at its default."""
    with open(path, encoding="utf-8") as f:
        try:
            recipe = json.load(f)
        except json.JSONDecodeError as err:
            raise ConfigError(
                f"--recipe {path}: not valid JSON at line {err.lineno}, column {err.colno} ({err.msg}); fix the "
                'file: a JSON object of settings, e.g. {"paths": ["data/web"], "shuffle": 8192}.'
            ) from err
    if not isinstance(recipe, dict):
        raise TypeError(f'--recipe {path}: a JSON object of settings, e.g. {{"paths": [...], "shuffle": 8192}}.')
    flags = argparse.ArgumentParser()
    _bench_arguments(flags)
    defaults = {k: v for k, v in vars(flags.parse_args([])).items() if k != "recipe"}
    unknown = sorted(set(recipe) - set(defaults))
    if unknown:
        raise ValueError(f"--recipe {path}: unknown settings {unknown}; the settings are {sorted(defaults)}.")
    for key, value in recipe.items():
        if getattr(args, key) == defaults[key]:
            setattr(args, key, value)


def bench_command(args: argparse.Namespace) -> int:
    import torch  # noqa: F401  # a training script has torch loaded before its loader starts

    from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
    from zephon_columnar.progress import Tally

    paths = list(args.paths)
    if not paths:
        raise ValueError("bench: give at least one dataset PATH (or 'paths' in --recipe).")
    if (args.tokenizer is None) == (args.tokens_field is None):
        raise ValueError("bench: pass one of --tokenizer (text to tokenize) or --tokens-field (tokenized rows).")
    weights = args.weights or [1.0] * len(paths)
    if len(weights) != len(paths):
        raise ValueError(f"bench: --weights has {len(weights)} numbers for {len(paths)} dataset(s); give one each.")
    t0 = time.perf_counter()
    datasets = [Dataset.from_path(f"d{k}", path, fmt=args.format) for k, path in enumerate(paths)]
    for ds, path in zip(datasets, paths):
        if args.tokenizer is not None:
            _check_field(ds.schema, path, "--field", args.field, text=True)
        else:
            _check_field(ds.schema, path, "--tokens-field", args.tokens_field, text=False)
    mixture = {ds.name: w for ds, w in zip(datasets, weights)}
    pipe = Pipeline(StaticMixtureWorkSource(datasets, mixture, seed=args.seed, chunk_size=args.chunk_size))
    tokens_field = args.tokens_field or "input_ids"
    if args.tokenizer is not None:
        eos = {} if args.eos_token_id is None else {"eos_token_id": args.eos_token_id}
        pipe = pipe.tokenize(tokenizer_id=args.tokenizer, field=args.field, special_tokens="eos", **eos)
    if args.shuffle:
        pipe = pipe.shuffle(args.shuffle, seed=args.seed)
    bins = {"num_bins": args.num_bins} if args.algorithm in ("first_fit", "best_fit") else {}
    pipe = (
        pipe.pack_flat(args.max_length, algorithm=args.algorithm, tokens_field=tokens_field, **bins)
        .batch(args.batch)
        .options(runner=args.runner)
        .show_progress(args.progress_every)
    )
    tally = Tally(chunk_size=args.chunk_size)
    first = None
    for batch in pipe:
        counts = tally.add(batch)
        if first is None:
            first = time.perf_counter() - t0
        if args.max_batches is not None and counts.items >= args.max_batches:
            break
    seconds = time.perf_counter() - t0
    c = tally.counts
    dropped = _dropped(pipe.metrics_snapshot(), c.real_tokens)
    report = {
        "paths": paths,
        "weights": weights,
        "runner": args.runner,
        "algorithm": args.algorithm,
        "shuffle": args.shuffle,
        "batches": c.items,
        "tokens": c.padded_tokens,
        "real_tokens": c.real_tokens,
        "padding_share": round(1 - c.real_tokens / c.padded_tokens, 4) if c.padded_tokens else 0.0,
        "seconds": round(seconds, 3),
        "first_batch_s": None if first is None else round(first, 3),
        "batches_per_s": round(c.items / seconds, 2),
        "tokens_per_s": round(c.padded_tokens / seconds),
        "real_tokens_per_s": round(c.real_tokens / seconds),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        **dropped,
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"{c.items} batches of {args.batch} x {args.max_length} tokens in {seconds:.2f} s: "
            f"{report['real_tokens_per_s']:,} real tokens/s ({report['tokens_per_s']:,} padded, "
            f"{report['padding_share']:.1%} padding), {report['batches_per_s']} batches/s; first batch "
            f"{report['first_batch_s']} s; peak RSS {report['peak_rss_mb']} MB"
            f"{_dropped_text(dropped, args.max_length)}"
        )
    return 0


def _check_field(schema: Any, path: str, flag: str, field: str, *, text: bool) -> None:
    """A ValueError naming ``flag`` and the dataset's columns when ``field`` is not one of them
    (before the clock starts, rather than mid-stream); the columns of the right kind come first."""
    import pyarrow as pa

    names = list(schema.names)
    if not names or field in names:
        return
    fits = pa.types.is_string if text else pa.types.is_list
    likely = [f.name for f in schema if fits(f.type) or pa.types.is_large_string(f.type)] or names
    raise ValueError(
        f"bench: {flag} {field!r} is not a column of {path}; its columns: {names}. Pass e.g. {flag} {likely[0]}."
    )


def _dropped(metrics: Any, delivered: int) -> dict[str, Any]:
    """What packing and batching dropped, from ``Pipeline.metrics_snapshot()``: tokens of
    documents longer than max_length, of the final partial row, and final partial batches."""
    counters = {} if metrics is None else dict(metrics)
    oversized = int(counters.get("pack_oversized_tokens", 0))
    final = int(counters.get("pack_dropped_final_tokens", 0))
    seen = int(counters.get("pack_tokens_seen", 0)) or delivered + oversized + final
    tokens = oversized + final
    return {
        "dropped_tokens": tokens,
        "dropped_oversized_tokens": oversized,
        "dropped_final_tokens": final,
        "dropped_share": round(tokens / seen, 4) if seen else 0.0,
        "dropped_final_rows": int(counters.get("batch_dropped_final_rows", 0)),
    }


def _dropped_text(dropped: dict[str, Any], max_length: int) -> str:
    """The summary line's tail about drops ("" when nothing was dropped)."""
    parts = []
    if dropped["dropped_tokens"]:
        why = []
        if dropped["dropped_oversized_tokens"]:
            why.append(
                f"{dropped['dropped_oversized_tokens']:,} in documents longer than --max-length {max_length}: raise "
                "it, or pack with --algorithm wrap or best_fit_wrap"
            )
        if dropped["dropped_final_tokens"]:
            why.append(f"{dropped['dropped_final_tokens']:,} in the final partial row")
        share = dropped["dropped_share"]
        amount = f"{share:.1%} of tokens" if share >= 0.001 else f"{dropped['dropped_tokens']:,} tokens"
        parts.append(f"{amount} dropped ({'; '.join(why)})")
    if dropped["dropped_final_rows"]:
        parts.append(f"{dropped['dropped_final_rows']:,} final row(s) short of a batch dropped")
    return f"; {', '.join(parts)}" if parts else ""


# ---------------------------------------------------------------------- cache
def cache_info_command(args: argparse.Namespace) -> int:
    from zephon_columnar.io import caches, fs

    folders = caches.usage()
    if args.json:
        print(json.dumps({"root": fs.cache_root(), "folders": [vars(f) for f in folders]}))
        return 0
    print(f"cache root: {fs.cache_root()} (set ZEPHON_COLUMNAR_CACHE to move it)")
    for f in folders:
        state = f"{f.files:,} files, {_size(f.bytes)}" if os.path.isdir(f.path) else "absent"
        print(f"  {f.name} ({f.holds}): {state}, {f.path}")
    print(f"total: {sum(f.files for f in folders):,} files, {_size(sum(f.bytes for f in folders))}")
    return 0


def cache_clear_command(args: argparse.Namespace) -> int:
    from zephon_columnar.io import caches, fs

    removed = caches.clear()
    if not removed:
        print(f"nothing to remove: no cache under {fs.cache_root()}")
    for f in removed:
        print(f"removed {f.path} ({f.files:,} files, {_size(f.bytes)})")
    return 0


def _size(n: int) -> str:
    """``n`` bytes for people: 0 B, 512 B, 1.5 KiB, 3.2 GiB."""
    value, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
