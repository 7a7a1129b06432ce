"""`Format`: the one interface a storage format implements, and `Discovered`, what its discovery finds.

A :class:`~zephon_columnar.io.dataset.Dataset` holds its format. Everything the package asks of
a format goes through this interface:

- `FileFormat.recognises_file` / `FileFormat.recognises_folder`: whether a file or a whole
  folder is this format's (``Dataset.from_path`` detection, `zephon_columnar.io.discovery`);
- `FileFormat.discover` / `FileFormat.discover_folder`: the shards with their row counts, read
  from the format's metadata (footers, headers, an index), never by decoding the data, and the
  dataset's Arrow schema;
- `Format.open_reader`: a :class:`~zephon_columnar.io.base.ShardReader` that turns ``(shard id,
  row indices)`` into an Arrow table of the requested columns;
- `Format.shared_readers`: whether one reader per process, shared by the worker threads, serves
  better than one each (readers that cache decoded data);
- `Format.with_bad_record_policy`: the format reading under ``on_bad_record="skip"``, for the
  formats whose discovery finds records that cannot be read one by one (JSON Lines).

The file formats are listed once, in `zephon_columnar.io.registry`; adding one is a module with a
`FileFormat` subclass and a line there. In-memory tables are a format too
(`zephon_columnar.io.memory.InMemoryTables`), one that nothing discovers.

Example:
    >>> ds = Dataset.from_path("web", "data/web")
    >>> ds.format.name, ds.format.shared_readers, ds.schema.names
    ('parquet', True, ['id', 'text'])
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, ClassVar

import pyarrow as pa

from zephon_columnar.errors import ConfigError
from zephon_columnar.io.base import BadRecordPolicy, ShardInfo, ShardReader

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from Python 3.11; annotations only

    from zephon_columnar.io.dataset import Dataset


class Format(ABC):
    """How a dataset's shards are read. Implementations are frozen dataclasses, pickled with the
    dataset (a worker process reads through its own copy)."""

    #: The format's name: what ``Dataset.from_path(fmt=...)`` takes, ``repr(dataset)`` and the
    #: CLI show, and ``Dataset.backend["kind"]`` holds.
    name: ClassVar[str]
    #: Whether a reader caches decoded data (Parquet row groups, memory maps) that the worker
    #: threads of a process should share: the engine then opens one per process and serializes
    #: its takes; otherwise each thread opens its own (JSONL parsing gains from parallel readers).
    shared_readers: ClassVar[bool] = False
    #: What the format does with a record it cannot read: "raise" (its reader names it), or
    #: "skip" (discovery leaves it out of the rows, `skipped_records` says which).
    on_bad_record: BadRecordPolicy = "raise"

    def with_bad_record_policy(self, policy: BadRecordPolicy, *, dataset: str) -> Self:
        """This format reading with ``on_bad_record=policy``. Only formats that find bad records
        one by one when they index a file can skip them; for the others a damaged file fails as
        a whole, and "skip" is a ConfigError naming ``dataset``."""
        if policy == "raise":
            return self
        raise ConfigError(
            f"Dataset {dataset!r}: on_bad_record={policy!r} is for JSON Lines files, whose lines are read one by "
            f"one; {self.name} data has no record that can be damaged alone (a damaged file fails as a whole, "
            "naming it). Leave on_bad_record at 'raise'."
        )

    @abstractmethod
    def open_reader(self, dataset: Dataset, *, columns: Sequence[str] | None = None) -> ShardReader:
        """A fresh reader of ``dataset``'s shards (one per worker; not thread-safe), restricted
        to ``columns`` (None: all; an unknown name is a ConfigError listing the dataset's)."""


class FileFormat(Format):
    """A format ``Dataset.from_path`` finds on disk or in object storage."""

    #: What a user should point at, for error messages: ``"*.parquet"``.
    expected: ClassVar[str]

    def recognises_file(self, file_name: str, *, chosen: bool) -> bool:
        """Whether a file named ``file_name`` (a base name) holds this format's data.

        ``chosen`` is True when the user named this format (``fmt=``) or passed the file alone,
        so names that are ambiguous in a folder (``*.json``) count."""
        return False

    def recognises_folder(self, path: str) -> bool:
        """Whether the folder ``path`` is described as a whole by this format (a manifest such
        as a ``save_to_disk`` ``state.json``); then `discover_folder` reads it, not its files."""
        return False

    def discover_folder(self, name: str, path: str) -> Discovered:
        """The shards of the folder ``path`` that `recognises_folder` claimed."""
        raise ConfigError(
            f"Dataset {name!r}: the {self.name} format reads files, not a folder as a whole; "
            f"point at a folder of {self.expected} files."
        )

    @abstractmethod
    def discover(self, name: str, files: Sequence[str]) -> Discovered:
        """The shards ``files`` (local paths or URLs; shard ids ``0..n-1`` in this order) with
        their row counts from the format's metadata, and the dataset's schema. A corrupt file is
        a DatasetFormatError naming it; shards whose schemas differ, one naming the shard."""


@dataclass(frozen=True, kw_only=True)
class Discovered:
    """What a format's discovery found: the format, the shards (ids ``0..n-1``) and the schema
    every reader returns (all columns, in this order)."""

    format: FileFormat
    shards: tuple[ShardInfo, ...]
    schema: pa.Schema


def optional_library(module: str, *, extra: str, what: str) -> ModuleType:
    """``import module``, or an ImportError saying which extra to install to read ``what``.

    Example:
        >>> optional_library("json", extra="none", what="JSON").__name__
        'json'
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"reading {what} needs the {module!r} library: pip install 'zephon_columnar[{extra}]'."
        ) from err
