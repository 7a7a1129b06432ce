"""What zephon_columnar keeps on disk between runs, and removing it (``python -m zephon_columnar
cache info`` / ``cache clear``).

Every cache lives under `~zephon_columnar.io.fs.cache_root` (``$ZEPHON_COLUMNAR_CACHE``, else
``~/.cache/zephon_columnar``), one folder each (`KNOWN`): ``shards/`` (remote shards downloaded
once), ``jsonl_index/`` (JSONL line indexes), ``tar_index/`` (WebDataset tar indexes) and
``manifests/`` (discovery manifests). Each is
rebuilt on demand, so removing it costs only the time to rebuild it.

`clear` removes only those folders, and refuses a root that holds anything else: a
``$ZEPHON_COLUMNAR_CACHE`` pointed by mistake at a folder of one's own is never emptied.

Example:
    >>> import os, tempfile
    >>> root = tempfile.mkdtemp()  # the default: fs.cache_root()
    >>> os.makedirs(f"{root}/jsonl_index")
    >>> with open(f"{root}/jsonl_index/a.npz", "wb") as f:
    ...     _ = f.write(b"12345")
    >>> [(c.name, c.files, c.bytes) for c in usage(root)]
    [('shards', 0, 0), ('jsonl_index', 1, 5), ('tar_index', 0, 0), ('manifests', 0, 0)]
    >>> [(c.name, c.files) for c in clear(root)], os.path.exists(root)
    ([('jsonl_index', 1)], False)
    >>> with open(f"{tempfile.mkdtemp()}/notes.txt", "w") as f:
    ...     _ = f.write("mine")
    >>> clear(os.path.dirname(f.name))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    zephon_columnar.errors.ConfigError: cache clear: ... holds ['notes.txt'], which zephon_columnar did not write, ...
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from zephon_columnar.errors import ConfigError
from zephon_columnar.io import fs

#: The cache folders under `fs.cache_root`, and what each holds.
KNOWN: dict[str, str] = {
    "shards": "remote shards downloaded once (the default shard cache)",
    "jsonl_index": "JSONL line indexes and schemas",
    "tar_index": "WebDataset tar indexes",
    "manifests": "discovery manifests, one per job and dataset (zephon_columnar.io.manifest)",
}


@dataclass(frozen=True)
class CacheFolder:
    """One cache folder: its ``name`` (a key of `KNOWN`), ``path``, what it holds, its file count
    and size in bytes (0 and 0 when it does not exist)."""

    name: str
    path: str
    holds: str
    files: int
    bytes: int


def usage(root: str | None = None) -> list[CacheFolder]:
    """Each cache folder under ``root`` (default `fs.cache_root`) with its file count and size,
    in `KNOWN` order."""
    root = fs.cache_root() if root is None else root
    return [_measure(name, os.path.join(root, name)) for name in KNOWN]


def clear(root: str | None = None) -> list[CacheFolder]:
    """Remove every cache folder under ``root`` (default `fs.cache_root`), then the root if left
    empty; what was removed, as it was before (folders that did not exist are left out).

    Raises:
        ConfigError: the root holds files or folders that are not zephon_columnar's caches, or is
            the home folder or a file system root: nothing is removed.
    """
    root = fs.cache_root() if root is None else root
    if not os.path.isdir(root):
        return []
    real = os.path.realpath(root)
    if real == os.path.realpath(os.path.expanduser("~")) or os.path.dirname(real) == real:
        raise ConfigError(
            f"cache clear: the cache root {root} is the home folder or a file system root, not zephon_columnar's "
            "cache folder; nothing was removed. Point ZEPHON_COLUMNAR_CACHE at a folder of its own."
        )
    foreign = sorted(set(os.listdir(root)) - set(KNOWN))
    if foreign:
        shown = foreign[:5] + ([f"... ({len(foreign)} in all)"] if len(foreign) > 5 else [])
        raise ConfigError(
            f"cache clear: {root} holds {shown}, which zephon_columnar did not write, so it may not be the package's "
            "cache root (ZEPHON_COLUMNAR_CACHE points there?); nothing was removed. Point ZEPHON_COLUMNAR_CACHE at "
            f"the cache folder, or remove its subfolders {sorted(KNOWN)} by hand."
        )
    removed = [folder for folder in usage(root) if os.path.lexists(folder.path)]
    for folder in removed:
        if os.path.isdir(folder.path) and not os.path.islink(folder.path):
            shutil.rmtree(folder.path)
        else:
            os.remove(folder.path)
    try:
        os.rmdir(root)
    except OSError:  # another process wrote to it meanwhile: leave it
        pass
    return removed


def _measure(name: str, path: str) -> CacheFolder:
    files = size = 0
    for folder, _, names in os.walk(path):
        for file_name in names:
            try:
                size += os.lstat(os.path.join(folder, file_name)).st_size
            except OSError:  # removed meanwhile (an eviction, a temp file renamed)
                continue
            files += 1
    return CacheFolder(name=name, path=path, holds=KNOWN[name], files=files, bytes=size)
