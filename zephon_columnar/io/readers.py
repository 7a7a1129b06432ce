"""`open_reader`: the :class:`~zephon_columnar.io.base.ShardReader` for a dataset's storage.

Backend kinds and their readers:
    ``parquet``               -> :class:`~zephon_columnar.io.parquet.ParquetReader`
    ``jsonl``                 -> :class:`~zephon_columnar.io.jsonl.JsonlReader`
    ``hf_arrow``, ``arrow_ipc`` -> :class:`~zephon_columnar.io.hf.ArrowReader`
    ``inmem``, ``arrow``, ``hf_memory`` (in-memory tables) -> ``TableReader``

Example:
    >>> reader = open_reader(Dataset.from_path("web", "data/web"))
    >>> type(reader).__name__
    'ParquetReader'
    >>> reader.take(1, np.arange(3)).column("id").to_pylist()  # shard 1, rows 0..2
    [16, 17, 18]
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from zephon_columnar.errors import ConfigError
from zephon_columnar.io.base import ShardReader, check_columns
from zephon_columnar.io.dataset import Dataset, TableReader

_IN_MEMORY = ("inmem", "arrow", "hf_memory")


def open_reader(dataset: Dataset, *, columns: Sequence[str] | None = None) -> ShardReader:
    """A fresh reader of ``dataset``'s shards (one per worker; not thread-safe).

    ``columns`` restricts file-backed readers to those payload columns (Parquet then decodes
    only those); None reads all. Every reader takes ``shard_id`` as the dataset's shard id
    (``Dataset.ids()``), never as a position.
    """
    kind = dataset.backend.get("kind")
    if kind == "parquet":
        from zephon_columnar.io.parquet import ParquetReader

        return ParquetReader(dataset, columns=columns)
    if kind == "jsonl":
        from zephon_columnar.io.jsonl import JsonlReader

        return JsonlReader(dataset, columns=columns)
    if kind in ("hf_arrow", "arrow_ipc"):
        from zephon_columnar.io.hf import ArrowReader

        return ArrowReader(dataset, columns=columns)
    if kind in _IN_MEMORY:
        tables = dataset.backend["tables"]
        if columns is not None and tables:
            columns = check_columns(dataset.name, tables[0].schema, columns)
            tables = [t.select(columns) for t in tables]  # zero-copy
        return TableReader(tables, [s.shard_id for s in dataset.shards], dataset=dataset.name)
    raise ConfigError(
        f"Dataset {dataset.name!r} has backend kind {kind!r}, which no reader handles; known kinds are "
        f"['parquet', 'jsonl', 'hf_arrow', 'arrow_ipc', {', '.join(repr(k) for k in _IN_MEMORY)}]. "
        "Build datasets with Dataset.from_path / from_hf / from_dict / from_tables."
    )


class _LockedReader:
    """A reader shared by threads: takes are serialized, so each row group is decoded once.

    Parquet decodes several row groups per call on Arrow's own threads, so serializing the
    Python side loses little parallelism, and sequential read-ahead serves every thread.
    """

    def __init__(self, reader: ShardReader) -> None:
        self._reader = reader
        self._lock = threading.Lock()

    def take(self, shard_id: int, rows: Any) -> Any:
        with self._lock:
            return self._reader.take(shard_id, rows)

    def close(self) -> None:
        with self._lock:
            self._reader.close()


class ReaderPool:
    """Per-process readers shared by worker threads, for the kinds in ``SHARED_KINDS``.

    The engine makes one pool per pass; `FetchOp` asks it first and opens a private reader
    for other kinds (JSONL parsing gains from parallel readers, not from a shared cache).
    Pickling (process runner) gives each worker process an empty pool of its own.
    """

    #: Kinds whose readers cache decoded data (Parquet row groups, memory-mapped Arrow files):
    #: worth one shared reader per process rather than one per worker thread.
    SHARED_KINDS = ("parquet", "hf_arrow", "arrow_ipc")

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._readers: dict[int, _LockedReader] = {}

    def shared_reader(self, dataset_id: int, dataset: Dataset) -> ShardReader | None:
        if dataset.backend.get("kind") not in self.SHARED_KINDS:
            return None
        with self._lock:
            reader = self._readers.get(dataset_id)
            if reader is None:
                reader = self._readers[dataset_id] = _LockedReader(open_reader(dataset))
            return reader

    def close(self) -> None:
        with self._lock:
            for reader in self._readers.values():
                reader.close()
            self._readers.clear()

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self._reset()
