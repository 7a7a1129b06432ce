"""`DatasetInspector`: read raw rows of one dataset by shard and row, without a pipeline.

For interactive inspection and data checks: no work source, no order, no metadata, no
prefetch. Single-process, not thread-safe; use it as a context manager.

Example:
    >>> import pyarrow as pa
    >>> from zephon_columnar.io.dataset import Dataset
    >>> ds = Dataset.from_tables("web", [pa.table({"text": ["a", "b", "c"]})])
    >>> with DatasetInspector(ds) as inspect:
    ...     inspect.read(0, 1), inspect.read_many(0, [2, 0])
    ({'text': 'b'}, [{'text': 'c'}, {'text': 'a'}])
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from zephon_columnar.io.options import StoreOptions

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from Python 3.11; annotations only

    from zephon_columnar.io.base import ShardReader
    from zephon_columnar.io.dataset import Dataset


class DatasetInspector:
    """Raw payloads of ``dataset``: ``read(shard_id, row)`` and ``read_many(shard_id, rows)``
    (rows in the order asked). ``io_options`` as for a pipeline (how remote files are read)."""

    def __init__(self, dataset: Dataset, *, io_options: StoreOptions | Mapping[str, Any] | None = None) -> None:
        self._dataset = dataset
        self._options = StoreOptions.from_any(io_options)
        self._reader: ShardReader | None = None
        self._closed = False

    def __enter__(self) -> Self:
        self._check_open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read(self, shard_id: int, sample_index: int) -> Any:
        """The payload of row ``sample_index`` of shard ``shard_id`` (an id of ``Dataset.ids()``)."""
        return self.read_many(shard_id, [sample_index])[0]

    def read_many(self, shard_id: int, sample_indices: list[int]) -> list[Any]:
        """The payloads of ``sample_indices`` of one shard, in that order ([] reads nothing)."""
        self._check_open()
        if not len(sample_indices):
            return []
        info = self._dataset.shard(int(shard_id))  # IndexError naming the shard ids
        rows = np.asarray([int(i) for i in sample_indices], np.int64)
        bad = rows[(rows < 0) | (rows >= info.num_rows)]
        if len(bad):
            raise IndexError(
                f"DatasetInspector: row {int(bad[0])} is out of range for {self._dataset.shard_label(int(shard_id))} "
                f"of dataset {self._dataset.name!r} ({info.num_rows} rows)."
            )
        if self._reader is None:
            self._reader = self._dataset.open_reader()
        samples: list[Any] = self._reader.take(int(shard_id), rows).to_pylist()
        return samples

    def close(self) -> None:
        """Close what was opened; safe to call twice. A closed inspector reads no more."""
        self._closed = True
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("DatasetInspector is closed; make a new one to read again.")


__all__ = ["DatasetInspector"]
