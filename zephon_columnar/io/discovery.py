"""`discover`: from a path or URL to a :class:`Dataset` (format detection and checks).

Rules:
    - A missing path raises DatasetNotFoundError naming it; a directory or file the OS will not
      let this process read raises :class:`~zephon_columnar.io.fs.FilePermissionError` (a
      PermissionError; other OS read failures an OSError) naming it, not a format error.
    - A directory is scanned non-recursively; hidden and ``_``-prefixed files (``_SUCCESS``)
      are skipped, shards are the data files sorted by name.
    - A single file is a one-shard dataset (its format from its suffix, or ``fmt``).
    - Auto-detection: ``state.json`` -> ``"hf"`` (a ``datasets`` ``save_to_disk`` folder);
      ``*.parquet`` -> ``"parquet"``; ``*.jsonl[.gz|.zst]`` -> ``"jsonl"``;
      ``*.arrow`` / ``*.feather`` -> ``"arrow"``. Files named ``*.json`` count as JSON Lines only
      with ``fmt="jsonl"`` (or when passed as a single file): in a directory they are usually
      metadata such as ``manifest.json``, so auto-detection ignores them.
    - Several formats in one directory, or none, is a DatasetFormatError listing what was
      found; ``fmt=`` picks one format's files and ignores the rest.
    - A dataset with 0 rows in total is a DatasetFormatError: it cannot take part in a mixture.

Local paths, ``file://`` and any fsspec URL (``memory://``, ``s3://`` with s3fs, ...) work.

Example:
    >>> discover("web", "data/web")
    Dataset(name='web', kind='parquet', path='data/web', shards=2, rows=32)
"""

from __future__ import annotations

import os
from typing import get_args

from zephon_columnar.errors import ConfigError, DatasetFormatError, DatasetNotFoundError
from zephon_columnar.io import fs
from zephon_columnar.io.dataset import Dataset, DatasetFormat
from zephon_columnar.io.hf import (
    ARROW_SUFFIXES,
    discover_arrow,
    discover_hf_folder,
    refuse_dataset_dict,
)
from zephon_columnar.io.jsonl import discover_jsonl, is_jsonl_name
from zephon_columnar.io.parquet import discover_parquet

FORMATS: tuple[DatasetFormat, ...] = get_args(DatasetFormat)
_SHOWN = 5  # file names shown per format in error messages


def format_of(name: str, *, plain_json: bool) -> DatasetFormat | None:
    """The format a file name belongs to, or None (``.json`` counts only if ``plain_json``).

    Example:
        >>> format_of("a.jsonl.zst", plain_json=False), format_of("a.json", plain_json=False)
        ('jsonl', None)
    """
    if name.endswith(".parquet"):
        return "parquet"
    if is_jsonl_name(name, plain_json=plain_json):
        return "jsonl"
    if name.endswith(ARROW_SUFFIXES):
        return "arrow"
    return None


def discover(name: str, path: str | os.PathLike[str], *, fmt: DatasetFormat | None = None) -> Dataset:
    """Discover the dataset at ``path`` (see the module docstring for the rules).

    Example:
        >>> discover("chat", "memory://corpus/chat", fmt="jsonl")
        Dataset(name='chat', kind='jsonl', path='memory://corpus/chat', shards=2, rows=8)
    """
    if fmt is not None and fmt not in FORMATS:
        raise ConfigError(
            f"Dataset {name!r}: fmt={fmt!r} is not a format; pass one of {list(FORMATS)} "
            "or None to detect it from the file names."
        )
    path = os.fspath(path)
    if not fs.exists(path):
        relative = fs.is_local(path) and not path.startswith("file://") and not os.path.isabs(path)
        where = f" (resolved to {fs.to_local(path)})" if relative else ""
        raise DatasetNotFoundError(f"Dataset {name!r}: {path}{where} does not exist. Check the path or URL.")
    if fs.isdir(path):
        dataset = _discover_dir(name, path, fmt)
    else:
        dataset = _discover_file(name, path, fmt)
    if dataset.total() == 0:
        raise DatasetFormatError(
            f"Dataset {name!r} at {path} has 0 rows ({dataset.shard_count()} shard(s), all empty). An "
            "empty dataset cannot be mixed or read; add data or leave it out of the work source."
        )
    return dataset


def _discover_file(name: str, path: str, fmt: DatasetFormat | None) -> Dataset:
    url = fs.to_local(path) if fs.is_local(path) else path
    detected = format_of(fs.basename(url), plain_json=True)
    fmt = fmt or detected
    if fmt is None:
        raise DatasetFormatError(
            f"Dataset {name!r}: cannot tell the format of {path} from its name; rename it to "
            "*.parquet, *.jsonl[.gz|.zst] or *.arrow, or pass fmt= one of "
            f"{list(FORMATS)}."
        )
    if fmt == "hf":  # one file of a save_to_disk folder: an Arrow IPC stream
        return discover_arrow(name, path, [url], kind="hf_arrow")
    return _by_format(name, path, fmt, [url])


def _discover_dir(name: str, path: str, fmt: DatasetFormat | None) -> Dataset:
    refuse_dataset_dict(path)
    if fmt in (None, "hf") and fs.exists(fs.join(path, "state.json")):
        return discover_hf_folder(name, path)
    try:
        files = fs.list_data_files(path)
    except OSError as err:
        if fs.is_read_failure(err):
            raise fs.unreadable_dir(name, path, err) from err
        raise
    if fmt == "hf":
        raise DatasetFormatError(
            f"Dataset {name!r}: {path} is not a datasets save_to_disk folder (no state.json; found "
            f"{_names(files)}). Pass the folder save_to_disk wrote, or fmt='arrow' for plain .arrow files."
        )
    groups: dict[str, list[str]] = {f: [] for f in FORMATS}
    for url in files:
        kind = format_of(fs.basename(url), plain_json=fmt == "jsonl")
        if kind is not None:
            groups[kind].append(url)
    present = [f for f in FORMATS if groups[f]]
    if fmt is None:
        if len(present) > 1:
            found = "; ".join(f"{len(groups[f])} {f} ({_names(groups[f])})" for f in present)
            raise DatasetFormatError(
                f"Dataset {name!r}: {path} mixes formats: {found}. A dataset has one format: pass "
                f"fmt={present[0]!r} (or another) to read only those files, or move the others to "
                "their own directory."
            )
        fmt = present[0] if present else None
    if fmt is None or not groups[fmt]:
        hint = (
            " Files named *.json are read as JSON Lines only with fmt='jsonl'."
            if any(fs.basename(f).endswith(".json") for f in files)
            else ""
        )
        wanted = f"no {fmt} files" if fmt else "no data files"
        raise DatasetFormatError(
            f"Dataset {name!r}: {path} holds {wanted} (found: {_names(files) or 'nothing'}). Expected "
            "*.parquet, *.jsonl[.gz|.zst], *.arrow/*.feather, or a datasets save_to_disk folder "
            f"(state.json).{hint}"
        )
    return _by_format(name, path, fmt, groups[fmt])


def _by_format(name: str, root: str, fmt: str, files: list[str]) -> Dataset:
    if fmt == "parquet":
        return discover_parquet(name, root, files)
    if fmt == "jsonl":
        return discover_jsonl(name, root, files)
    return discover_arrow(name, root, files)


def _names(files: list[str]) -> str:
    names = [fs.basename(f) for f in files]
    more = f", ... {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    return ", ".join(names[:_SHOWN]) + more
