"""`discover`: from a path or URL to the shards of a dataset (format detection and checks).

The formats themselves are asked (`zephon_columnar.io.registry.formats()`, in that order); this
module only decides which one and checks what they found.

Rules:
    - A missing path raises DatasetNotFoundError naming it; a directory or file the OS will not
      let this process read raises :class:`~zephon_columnar.io.fs.FilePermissionError` (a
      PermissionError; other OS read failures an OSError) naming it, not a format error.
    - A directory is scanned non-recursively; hidden and ``_``-prefixed files (``_SUCCESS``)
      are skipped, shards are the data files sorted by name. A Hive-partitioned directory (only
      ``key=value`` subfolders, at any depth) is read whole, its files sorted by path (the
      partition values are not added as columns). A directory whose data sits one level down
      in other folders (``train/``, ``test/``) is an error naming those folders.
    - A single file is a one-shard dataset (its format from its suffix, or ``fmt``); a list of
      files, or a glob pattern (``data/*.parquet``, ``**`` for any depth), is one shard per
      file in that order (a glob's sorted), all of one format.
    - Auto-detection: a folder a format claims as a whole is that format's (``state.json``:
      ``"hf"``, a ``datasets`` ``save_to_disk`` folder); otherwise by file names:
      ``*.parquet`` -> ``"parquet"``; ``*.jsonl[.gz|.zst]`` -> ``"jsonl"``;
      ``*.arrow`` / ``*.feather`` -> ``"arrow"``. Files named ``*.json`` count as JSON Lines only
      with ``fmt="jsonl"`` (or when passed as a single file): in a directory they are usually
      metadata such as ``manifest.json``, so auto-detection ignores them.
    - Several formats in one directory, or none, is a DatasetFormatError listing what was
      found; ``fmt=`` picks one format's files and ignores the rest.
    - A dataset with 0 rows in total is a DatasetFormatError: it cannot take part in a mixture.

Local paths, ``file://`` and any fsspec URL (``memory://``, ``s3://`` with s3fs, ...) work.

Example:
    >>> found = discover("web", "data/web")
    >>> found.format.name, [s.num_rows for s in found.shards]
    ('parquet', [16, 16])
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TypeAlias

from zephon_columnar.errors import DatasetFormatError, DatasetNotFoundError
from zephon_columnar.io import fs, manifest
from zephon_columnar.io.base import BadRecordPolicy
from zephon_columnar.io.format import Discovered, FileFormat
from zephon_columnar.io.registry import format_named, formats

_SHOWN = 5  # file names shown per format in error messages


def format_of(file_name: str, *, chosen: bool) -> FileFormat | None:
    """The format a file name belongs to, or None (``chosen``: see `FileFormat.recognises_file`).

    Example:
        >>> format_of("a.jsonl.zst", chosen=False).name, format_of("a.json", chosen=False)
        ('jsonl', None)
    """
    return next((f for f in formats() if f.recognises_file(file_name, chosen=chosen)), None)


DatasetPath: TypeAlias = "str | os.PathLike[str] | Sequence[str | os.PathLike[str]]"


def discover(
    name: str, path: DatasetPath, *, fmt: str | None = None, on_bad_record: BadRecordPolicy = "raise"
) -> Discovered:
    """Discover the dataset at ``path`` (see the module docstring for the rules), with its
    format reading under ``on_bad_record`` (`Format.with_bad_record_policy`).

    Example:
        >>> found = discover("chat", "memory://corpus/chat", fmt="jsonl")
        >>> found.format.name, len(found.shards), found.schema.names
        ('jsonl', 2, ['id', 'messages'])
        >>> len(discover("web", "data/web/*.parquet").shards)
        2
        >>> len(discover("web", ["data/web/part-001.parquet"]).shards)
        1
    """
    chosen = None if fmt is None else format_named(fmt, where=f"Dataset {name!r}")
    if not isinstance(path, (str, os.PathLike)):
        files = _listed_files(name, [os.fspath(p) for p in path])
        return _check_rows(name, f"{len(files)} files", _discover_files(name, files, chosen, on_bad_record))
    path = os.fspath(path)
    if fs.is_glob(path) and not fs.exists(path):
        pattern = path

        def matched() -> Discovered:
            files = fs.glob_files(pattern)
            if not files:
                raise DatasetNotFoundError(f"Dataset {name!r}: no file matches {pattern}. Check the pattern.")
            return _discover_files(name, files, chosen, on_bad_record)

        return _check_rows(name, path, manifest.discover_once(path, fmt, on_bad_record, matched))
    if not fs.exists(path):
        relative = fs.is_local(path) and not path.startswith("file://") and not os.path.isabs(path)
        where = f" (resolved to {fs.to_local(path)})" if relative else ""
        raise DatasetNotFoundError(f"Dataset {name!r}: {path}{where} does not exist. Check the path or URL.")
    if fs.isdir(path):
        where = path
        found = manifest.discover_once(
            path, fmt, on_bad_record, lambda: _discover_dir(name, where, chosen, on_bad_record)
        )
    else:
        found = _discover_files(name, [path], chosen, on_bad_record)
    return _check_rows(name, path, found)


def _check_rows(name: str, where: str, found: Discovered) -> Discovered:
    if sum(s.num_rows for s in found.shards) == 0:
        raise DatasetFormatError(
            f"Dataset {name!r} at {where} has 0 rows ({len(found.shards)} shard(s), all empty). An "
            "empty dataset cannot be mixed or read; add data or leave it out of the work source."
        )
    return found


def _listed_files(name: str, paths: list[str]) -> list[str]:
    """A user's list of files, each checked to be one (a glob's matches and a single path are
    checked where they are found)."""
    if not paths:
        raise DatasetNotFoundError(f"Dataset {name!r}: the list of files is empty; pass at least one file.")
    for path in paths:
        if not fs.exists(path):
            raise DatasetNotFoundError(f"Dataset {name!r}: {path} does not exist. Check the path or URL.")
        if fs.isdir(path):
            raise DatasetFormatError(
                f"Dataset {name!r}: {path} is a folder; a list or glob takes files. Pass the folder on its own, "
                "or its files."
            )
    return paths


def _discover_files(
    name: str, paths: list[str], chosen: FileFormat | None, on_bad_record: BadRecordPolicy
) -> Discovered:
    """Existing files (a list, a glob's matches, one path): one shard each, in order, all of one
    format."""
    urls: list[str] = []
    by_format: dict[str, tuple[FileFormat, list[str]]] = {}
    for path in paths:
        url = fs.to_local(path) if fs.is_local(path) else path
        fmt = chosen or format_of(fs.basename(url), chosen=True)
        if fmt is None:
            raise DatasetFormatError(
                f"Dataset {name!r}: cannot tell the format of {path} from its name; rename it to one of "
                f"{_expected()}, or pass fmt= one of {[f.name for f in formats()]}."
            )
        urls.append(url)
        by_format.setdefault(fmt.name, (fmt, []))[1].append(url)
    if len(by_format) > 1:
        found = "; ".join(f"{len(files)} {fmt_name} ({_names(files)})" for fmt_name, (_, files) in by_format.items())
        raise DatasetFormatError(
            f"Dataset {name!r}: the files mix formats: {found}. A dataset has one format: give each its own "
            "dataset, or pass fmt= to read them all as one."
        )
    fmt = next(iter(by_format.values()))[0]
    return fmt.with_bad_record_policy(on_bad_record, dataset=name).discover(name, urls)


def _discover_dir(name: str, path: str, chosen: FileFormat | None, on_bad_record: BadRecordPolicy) -> Discovered:
    known = formats()
    for candidate in known if chosen is None else (chosen,):
        if candidate.recognises_folder(path):
            return candidate.with_bad_record_policy(on_bad_record, dataset=name).discover_folder(name, path)
    try:
        files = fs.list_data_files(path)
    except OSError as err:
        if fs.is_read_failure(err):
            raise fs.unreadable_dir(name, path, err) from err
        raise
    groups: dict[str, list[str]] = {f.name: [] for f in known}
    for url in files:
        base = fs.basename(url)
        # The chosen format also claims names it takes only when asked for (*.json with fmt="jsonl").
        claimed = chosen is not None and chosen.recognises_file(base, chosen=True)
        fmt = chosen if claimed else format_of(base, chosen=False)
        if fmt is not None:
            groups[fmt.name].append(url)
    present = [f for f in known if groups[f.name]]
    if chosen is None:
        if len(present) > 1:
            found = "; ".join(f"{len(groups[f.name])} {f.name} ({_names(groups[f.name])})" for f in present)
            raise DatasetFormatError(
                f"Dataset {name!r}: {path} mixes formats: {found}. A dataset has one format: pass "
                f"fmt={present[0].name!r} (or another) to read only those files, or move the others to "
                "their own directory."
            )
        chosen = present[0] if present else None
    if not present and not files:
        partitioned = _partition_files(path)
        if partitioned:  # a Hive-partitioned folder (key=value subfolders): every data file below
            return _discover_files(name, partitioned, chosen, on_bad_record)
    found = f"found: {_names(files) or 'nothing'}"
    if chosen is not None and groups[chosen.name]:
        return chosen.with_bad_record_policy(on_bad_record, dataset=name).discover(name, groups[chosen.name])
    if chosen is not None:
        raise DatasetFormatError(
            f"Dataset {name!r}: {path} holds no {chosen.name} data ({found}); fmt={chosen.name!r} reads "
            f"{chosen.expected}. Pass another fmt=, or None to detect the format."
        )
    hint = (
        " Files named *.json are read as JSON Lines only with fmt='jsonl'."
        if any(fs.basename(f).endswith(".json") for f in files)
        else ""
    )
    below = _data_one_level_down(path)
    if below:
        raise DatasetFormatError(
            f"Dataset {name!r}: {path} holds no data files itself; its folders do: {below}. Pass one of those "
            "folders, a list of files, or a glob such as "
            f"{fs.join(path, '*')}/*.<suffix> (subfolders named key=value are read as one partitioned dataset)."
        )
    raise DatasetFormatError(f"Dataset {name!r}: {path} holds no data files ({found}). Expected {_expected()}.{hint}")


def _partition_files(path: str) -> list[str]:
    """Every data file of a Hive-partitioned folder (subfolders named ``key=value``, any
    depth), sorted by path; [] when ``path`` has other subfolders or none. Partition values are
    not added as columns."""
    folders = fs.list_dirs(path)
    if not folders or not all("=" in fs.basename(f) for f in folders):
        return []
    files = []
    for folder in folders:
        files += [f for f in fs.list_data_files(folder) if format_of(fs.basename(f), chosen=False)]
        files += _partition_files(folder)
    return files


def _data_one_level_down(path: str) -> str:
    """'train (8 parquet), test (2 parquet)': the subfolders of ``path`` that hold data files."""
    shown = []
    for folder in fs.list_dirs(path)[:20]:
        counts: dict[str, int] = {}
        for f in fs.list_data_files(folder):
            fmt = format_of(fs.basename(f), chosen=False)
            if fmt is not None:
                counts[fmt.name] = counts.get(fmt.name, 0) + 1
        if counts:
            what = ", ".join(f"{n} {fmt_name}" for fmt_name, n in counts.items())
            shown.append(f"{fs.basename(folder)} ({what})")
    return ", ".join(shown)


def _expected() -> str:
    return ", ".join(f.expected for f in formats())


def _names(files: list[str]) -> str:
    names = [fs.basename(f) for f in files]
    more = f", ... {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    return ", ".join(names[:_SHOWN]) + more
