"""Arrow IPC data: Hugging Face ``save_to_disk`` folders, plain ``.arrow``/``.feather`` files,
and in-process ``datasets.Dataset`` objects.

A ``save_to_disk`` folder holds ``state.json`` (its ``_data_files`` list the shards, in order)
and ``data-*.arrow`` files in the Arrow IPC *stream* format. Row counts come from the record
batch headers of a memory map (no data is copied or decoded), and the reader takes rows
zero-copy from the memory-mapped table. A ``DatasetDict`` folder (``dataset_dict.json``) is
refused: point at one split's folder.

Plain ``*.arrow`` / ``*.feather`` files (IPC file or stream format, i.e. Feather V2) in a
directory are read the same way (``fmt="arrow"``).

The two formats: `HF` (``fmt="hf"``, a ``save_to_disk`` folder, or one of its files) and
`ARROW` (``fmt="arrow"``). ``table_of_hf`` is the Arrow table ``Dataset.from_hf`` wraps.

Example:
    >>> ds = Dataset.from_path("wiki", "data/wiki_train")
    >>> ArrowReader(ds).take(0, np.array([0, 1])).column_names
    ['text']
"""

from __future__ import annotations

import json
import sys
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyarrow as pa

from zephon_columnar.errors import ConfigError, DatasetFormatError
from zephon_columnar.io import fs
from zephon_columnar.io.base import ShardInfo, ShardReader, check_columns, project, shard_info
from zephon_columnar.io.format import Discovered, FileFormat
from zephon_columnar.io.tables import check_same_schema, in_column_order, take_rows

if TYPE_CHECKING:
    from zephon_columnar.io.dataset import Dataset

ARROW_SUFFIXES = (".arrow", ".feather")
DEFAULT_MAX_OPEN_FILES = 64
_FILE_MAGIC = b"ARROW1"


# ---------------------------------------------------------------- folders and files
def refuse_dataset_dict(path: str) -> None:
    """Raise ConfigError if ``path`` is a ``DatasetDict.save_to_disk`` folder, naming its splits."""
    marker = fs.join(path, "dataset_dict.json")
    if not fs.exists(marker):
        return
    try:
        splits = json.loads(fs.read_bytes(marker)).get("splits", [])
    except (ValueError, AttributeError):
        splits = []
    example = fs.join(path, splits[0]) if splits else fs.join(path, "train")
    raise ConfigError(
        f"{path} is a Hugging Face DatasetDict folder (splits {splits}); point at one split's "
        f"folder instead, e.g. Dataset.from_path(name, {example!r})."
    )


def hf_data_files(path: str) -> list[str]:
    """The Arrow files of a ``save_to_disk`` folder, in ``state.json`` order."""
    state_path = fs.join(path, "state.json")
    try:
        raw = fs.read_bytes(state_path)
    except OSError as err:
        if fs.is_read_failure(err):
            raise fs.unreadable_file(state_path, err) from err
        raise
    try:
        state = json.loads(raw)
        names = [entry["filename"] for entry in state["_data_files"]]
    except (ValueError, KeyError, TypeError) as err:
        raise DatasetFormatError(
            f"{state_path}: not a Hugging Face save_to_disk state file ({type(err).__name__}: {err}); "
            "expected {'_data_files': [{'filename': 'data-00000-of-00001.arrow'}, ...]}. Re-save the "
            "dataset with datasets.Dataset.save_to_disk, or pass fmt='arrow' to read the .arrow files."
        ) from err
    files = [fs.join(path, n) for n in names]
    missing = [f for f in files if not fs.exists(f)]
    if missing:
        raise DatasetFormatError(
            f"{state_path} lists {missing} but they do not exist; the folder is incomplete. Copy the "
            "whole save_to_disk folder again."
        )
    return files


@dataclass(frozen=True)
class ArrowFormat(FileFormat):
    """``*.arrow`` / ``*.feather`` files (Arrow IPC file or stream), one shard each, row counts
    from the record batch headers of a memory map.

    Remote files are downloaded once into the shard cache (an IPC stream has no footer to read
    the counts from; the reader needs the copy anyway).

    Example:
        >>> ARROW.recognises_file("part-0.feather", chosen=False), ARROW.shared_readers
        (True, True)
    """

    name: ClassVar[str] = "arrow"
    expected: ClassVar[str] = "*.arrow/*.feather"
    shared_readers: ClassVar[bool] = True  # one set of memory maps per process

    def recognises_file(self, file_name: str, *, chosen: bool) -> bool:
        return file_name.endswith(ARROW_SUFFIXES)

    def discover(self, name: str, files: Sequence[str]) -> Discovered:
        shards, schemas = [], []
        for i, url in enumerate(files):
            size = fs.file_size(url)
            # Mapping the table parses only the batch headers (uncompressed IPC, as save_to_disk
            # writes it); lz4/zstd-compressed Feather is decompressed here once.
            table = _map_table(url, fs.default_shard_cache().ensure_local(url, size))
            schemas.append((f"shard {i} ({fs.basename(url)})", table.schema))
            shards.append(ShardInfo(shard_id=i, path=url, num_rows=table.num_rows, num_bytes=size))
        check_same_schema(name, schemas)
        schema = schemas[0][1] if schemas else pa.schema([])
        return Discovered(format=self, shards=tuple(shards), schema=schema)

    def open_reader(self, dataset: Dataset, *, columns: Sequence[str] | None = None) -> ShardReader:
        return ArrowReader(dataset, columns=columns)


@dataclass(frozen=True)
class HfFormat(ArrowFormat):
    """A ``datasets.Dataset.save_to_disk`` folder: ``state.json`` lists its Arrow stream files,
    in order. A ``DatasetDict`` folder (``dataset_dict.json``) is refused, naming its splits.

    Example:
        >>> found = HF.discover_folder("wiki", "data/wiki_train")
        >>> found.format.name, len(found.shards)
        ('hf', 2)
    """

    name: ClassVar[str] = "hf"
    expected: ClassVar[str] = "a datasets save_to_disk folder (state.json)"

    def recognises_file(self, file_name: str, *, chosen: bool) -> bool:
        return False  # its files are plain Arrow streams; the folder's state.json says which

    def recognises_folder(self, path: str) -> bool:
        return fs.exists(fs.join(path, "state.json")) or fs.exists(fs.join(path, "dataset_dict.json"))

    def discover_folder(self, name: str, path: str) -> Discovered:
        refuse_dataset_dict(path)
        return self.discover(name, hf_data_files(path))


ARROW = ArrowFormat()
HF = HfFormat()


def _map_table(url: str, local: str) -> pa.Table:
    """The whole table of an IPC file or stream at ``local``, memory-mapped (zero-copy).

    Not Arrow IPC: a DatasetFormatError naming ``url``; refused or failed by the OS
    (permissions, I/O error): an :class:`~zephon_columnar.io.fs.UnreadableFileError`."""
    try:
        source = pa.memory_map(local)
        if source.read(len(_FILE_MAGIC)) == _FILE_MAGIC:
            source.seek(0)
            return pa.ipc.open_file(source).read_all()
        source.seek(0)
        return pa.ipc.open_stream(source).read_all()
    except (pa.ArrowInvalid, OSError) as err:
        if isinstance(err, FileNotFoundError):
            raise
        if fs.is_read_failure(err):
            raise fs.unreadable_file(url, err) from err
        raise DatasetFormatError(
            f"{url}: not an Arrow IPC file or stream ({err}). Re-write it with "
            "pyarrow.feather.write_feather (Feather V2) or datasets' save_to_disk, or remove it "
            "from the dataset directory. Feather V1 files are not supported."
        ) from err


class ArrowReader:
    """Reads rows of Arrow IPC shards (``hf_arrow`` and ``arrow_ipc`` datasets), zero-copy.

    Contract:
        - Each shard is memory-mapped once per reader (an LRU of ``max_open_files`` tables);
          ``take`` returns a slice of it for consecutive rows and ``Table.take`` otherwise,
          columns in the dataset schema's order (a file may store them in another order).
          Compressed IPC buffers (Feather's default lz4) are decompressed when mapped.
        - Remote shards are read from their local copy in ``shard_cache``.
        - Not thread-safe: one reader per worker.

    Example:
        >>> reader = ArrowReader(Dataset.from_path("wiki", "data/wiki_train"))
        >>> reader.take(1, np.arange(5)).num_rows
        5
    """

    def __init__(
        self,
        dataset: Dataset,
        *,
        columns: Sequence[str] | None = None,
        max_open_files: int = DEFAULT_MAX_OPEN_FILES,
        shard_cache: fs.ShardCache | None = None,
    ) -> None:
        self._columns = check_columns(dataset.name, dataset.schema, columns)
        self._schema = project(dataset.schema, self._columns)
        self._names = self._schema.names  # every shard comes back in this column order
        self._name = dataset.name
        self._shards = dataset.shards
        self._max_open = max(1, int(max_open_files))
        self._shard_cache = shard_cache or fs.default_shard_cache()
        self._tables: OrderedDict[int, pa.Table] = OrderedDict()

    def take(self, shard_id: int, rows: np.ndarray) -> pa.Table:
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) == 0:
            return self._schema.empty_table()
        table = self._table(shard_id)
        lo, hi = int(rows.min()), int(rows.max())
        if lo < 0 or hi >= table.num_rows:
            path = shard_info(self._shards, shard_id).path
            raise IndexError(
                f"{path}: row {lo if lo < 0 else hi} is out of range for shard {shard_id} with {table.num_rows} rows."
            )
        return take_rows(table, rows)

    def close(self) -> None:
        self._tables.clear()

    def _table(self, shard_id: int) -> pa.Table:
        table = self._tables.get(shard_id)
        if table is not None:
            self._tables.move_to_end(shard_id)
            return table
        info = shard_info(self._shards, shard_id, dataset=self._name)
        url = info.file_path()
        table = _map_table(url, self._shard_cache.ensure_local(url, info.num_bytes or None))
        if table.num_rows != info.num_rows:
            raise DatasetFormatError(
                f"{info.path}: has {table.num_rows} rows now, {info.num_rows} at discovery; it changed "
                "since the dataset was discovered. Rediscover it with Dataset.from_path."
            )
        # The projection, in the dataset schema's column order whatever the file's (zero-copy).
        table = in_column_order(table, self._names)
        self._tables[shard_id] = table
        while len(self._tables) > self._max_open:
            self._tables.popitem(last=False)
        return table


# ---------------------------------------------------------------- in-process datasets
def table_of_hf(hf_dataset: Any) -> pa.Table:
    """The Arrow table an in-process ``datasets.Dataset`` iterates over (``Dataset.from_hf``).

    Zero-copy: it *is* ``hf_dataset.data.table`` (memory-mapped when the dataset was loaded
    from disk), unless the dataset has an indices mapping (after ``select``, ``shuffle``,
    ``filter``, ...), which is materialized once with ``flatten_indices()``. The columns chosen
    with ``set_format(columns=...)`` are kept, as iterating it would.

    Example:
        >>> import datasets
        >>> hf = datasets.Dataset.from_dict({"text": ["a", "b"], "n": [1, 2]}).select_columns(["text"])
        >>> table_of_hf(hf).column_names
        ['text']
    """
    _require_map_style(hf_dataset)
    if getattr(hf_dataset, "_indices", None) is not None:
        hf_dataset = hf_dataset.flatten_indices()
    table = hf_dataset.data.table
    fmt = getattr(hf_dataset, "format", None) or {}
    columns = fmt.get("columns")
    if columns is not None and not fmt.get("output_all_columns") and list(columns) != table.column_names:
        table = table.select(list(columns))
    return table


def _require_map_style(obj: Any) -> None:
    """Raise ConfigError, saying what to pass, unless ``obj`` is a ``datasets.Dataset``."""
    datasets = sys.modules.get("datasets")  # whoever built `obj` imported it already
    if datasets is not None and isinstance(obj, datasets.Dataset):
        return
    kind = type(obj).__name__
    if kind in ("DatasetDict", "IterableDatasetDict"):
        keys = list(obj.keys()) if hasattr(obj, "keys") else []
        first = keys[0] if keys else "train"
        raise ConfigError(
            f"Dataset.from_hf got a {kind} with splits {keys}; pass one split instead, e.g. "
            f"Dataset.from_hf(name, hf[{first!r}])."
        )
    if kind == "IterableDataset":
        raise ConfigError(
            "Dataset.from_hf got a streaming datasets.IterableDataset, which has no row count or "
            "random access; load it without streaming=True, or save it with save_to_disk / "
            "to_parquet and use Dataset.from_path."
        )
    raise ConfigError(
        f"Dataset.from_hf expects a datasets.Dataset, got {kind}. For files on disk use "
        "Dataset.from_path; for Python rows use Dataset.from_dict."
    )
