"""`open_reader`: the :class:`~zephon_columnar.io.base.ShardReader` for a dataset's storage.

Backend kinds and their readers:
    ``parquet``               -> :class:`~zephon_columnar.io.parquet.ParquetReader`
    ``jsonl``                 -> :class:`~zephon_columnar.io.jsonl.JsonlReader`
    ``hf_arrow``, ``arrow_ipc`` -> :class:`~zephon_columnar.io.hf.ArrowReader`
    ``inmem``, ``arrow``, ``hf_memory`` (in-memory tables) -> ``TableReader``

Example:
    >>> reader = open_reader(Dataset.from_path("web", "data/web"))  # doctest: +SKIP
    >>> reader.take(0, np.arange(8)).num_rows  # doctest: +SKIP
    8
"""

from __future__ import annotations

from typing import Sequence

from zephon_columnar.errors import ConfigError
from zephon_columnar.io.base import ShardReader, check_columns
from zephon_columnar.io.dataset import Dataset, TableReader

_IN_MEMORY = ("inmem", "arrow", "hf_memory")


def open_reader(dataset: Dataset, *, columns: Sequence[str] | None = None) -> ShardReader:
    """A fresh reader of ``dataset``'s shards (one per worker; not thread-safe).

    ``columns`` restricts file-backed readers to those payload columns (Parquet then decodes
    only those); None reads all.
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
        return TableReader(tables)
    raise ConfigError(
        f"Dataset {dataset.name!r} has backend kind {kind!r}, which no reader handles; known kinds are "
        f"['parquet', 'jsonl', 'hf_arrow', 'arrow_ipc', {', '.join(repr(k) for k in _IN_MEMORY)}]. "
        "Build datasets with Dataset.from_path / from_hf / from_dict / from_tables."
    )
