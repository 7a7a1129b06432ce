"""The formats ``Dataset.from_path`` knows: the one list of them.

A built-in format is a module with a :class:`~zephon_columnar.io.format.FileFormat` subclass
and its instance in `BUILT_IN` (and its name in `DatasetFormat`, which a test holds equal to
it). A format of one's own is registered with `register_format`; ``Dataset.from_path`` then
detects it like the built-in ones.

Example:
    >>> [f.name for f in formats()][:4]
    ['parquet', 'jsonl', 'hf', 'arrow']
    >>> format_named("parquet", where="example").expected
    '*.parquet'
"""

from __future__ import annotations

import threading
from typing import Literal

from zephon_columnar.errors import ConfigError
from zephon_columnar.io.format import FileFormat
from zephon_columnar.io.hf import ARROW, HF
from zephon_columnar.io.jsonl import JSONL
from zephon_columnar.io.lance import LANCE
from zephon_columnar.io.litdata import LITDATA
from zephon_columnar.io.mds import MDS
from zephon_columnar.io.parquet import PARQUET
from zephon_columnar.io.vortex import VORTEX
from zephon_columnar.io.webdataset import WEBDATASET

#: The formats that ship, in the order discovery asks them (a folder's files go to the first
#: format that claims them) and error messages list them.
BUILT_IN: tuple[FileFormat, ...] = (PARQUET, JSONL, HF, ARROW, WEBDATASET, LANCE, VORTEX, MDS, LITDATA)

#: The names ``Dataset.from_path(fmt=...)`` takes for the built-in formats (for type checkers
#: and IDEs; a registered format's name is accepted too).
DatasetFormat = Literal["parquet", "jsonl", "hf", "arrow", "webdataset", "lance", "vortex", "mds", "litdata"]

_registered: list[FileFormat] = []
_lock = threading.Lock()


def formats() -> tuple[FileFormat, ...]:
    """Every format discovery asks, in order: the built-in ones, then the registered ones."""
    with _lock:
        return BUILT_IN + tuple(_registered)


def register_format(fmt: FileFormat) -> None:
    """Make ``Dataset.from_path`` detect ``fmt`` (after the built-in formats) and accept its
    name as ``fmt=``. Registering the same format again does nothing; another format under a
    name already taken is a ConfigError.

    Readers need no registration: a dataset carries its format, so a worker process reads
    through the pickled copy (define the class in an importable module, not in ``__main__``,
    when the process runner is used).
    """
    if not isinstance(fmt, FileFormat):
        raise ConfigError(f"register_format: expected a FileFormat instance, got {type(fmt).__name__}.")
    with _lock:
        taken = next((f for f in BUILT_IN + tuple(_registered) if f.name == fmt.name), None)
        if taken is None:
            _registered.append(fmt)
        elif taken != fmt:
            raise ConfigError(
                f"register_format: the name {fmt.name!r} is taken by {type(taken).__name__}; give "
                f"{type(fmt).__name__} another name."
            )


def format_named(name: str, *, where: str) -> FileFormat:
    """The format called ``name``; a ConfigError from ``where`` listing the formats otherwise."""
    known = formats()
    for fmt in known:
        if fmt.name == name:
            return fmt
    raise ConfigError(
        f"{where}: fmt={name!r} is not a format; pass one of {[f.name for f in known]} "
        "or None to detect it from the file names."
    )
