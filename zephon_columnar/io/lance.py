"""Lance datasets (a folder with ``_versions/`` and ``data/``), read in place with ``pylance``.

A Lance dataset is versioned: every write adds a manifest. Discovery opens the dataset's latest
version and pins it (``ShardInfo.extra["version"]``), so a dataset appended to after discovery
reads the same rows in every worker and after every restore. Each *fragment* of that version
is one shard; its row count comes from the manifest (rows deleted in that version are not
counted, and row indices skip them, as Lance's own fragment ``take`` does). A reader takes any
rows of a fragment by index (random access, so ``to_indexable_torch_dataset`` works over Lance
too) and returns them in the order asked.

Lance reads local folders and the object stores it knows itself (``s3://``, ``gs://``,
``az://``; credentials and endpoint from the environment, e.g. ``AWS_ENDPOINT_URL``), not through
the shard cache; other fsspec URLs are refused by name.
Reading needs the ``lance`` extra (``pip install 'zephon_columnar[lance]'``).

Example:
    >>> import lance
    >>> _ = lance.write_dataset(pa.table({"id": [0, 1, 2]}), "corpus.lance", max_rows_per_file=2)
    >>> found = LANCE.discover_folder("corpus", "corpus.lance")
    >>> [s.num_rows for s in found.shards], found.schema.names
    ([2, 1], ['id'])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyarrow as pa

from zephon_columnar.errors import ConfigError, DatasetFormatError
from zephon_columnar.io import fs
from zephon_columnar.io.base import ShardInfo, ShardReader, check_columns, project, shard_info
from zephon_columnar.io.format import Discovered, FileFormat, optional_library
from zephon_columnar.io.tables import in_column_order

if TYPE_CHECKING:
    from zephon_columnar.io.dataset import Dataset

_VERSIONS = "_versions"  # the folder of manifests that makes a folder a Lance dataset
_NATIVE = ("s3://", "s3a://", "gs://", "gcs://", "az://", "abfs://")  # object stores Lance reads itself


def _lance_uri(url: str) -> str:
    """What ``lance.dataset`` takes for ``url``: a local path, or a URL of a store Lance knows."""
    if fs.is_local(url):
        return fs.to_local(url)
    if url.startswith(_NATIVE):
        return url
    raise ConfigError(
        f"{url}: Lance reads local folders and s3://, gs:// and az:// URLs itself, not this kind of URL; "
        "copy the dataset to local disk or to one of those stores."
    )


def open_version(url: str, version: int | None) -> Any:
    """The Lance dataset at ``url`` (``version``: None for the latest); one that Lance cannot
    open is a DatasetFormatError naming the folder."""
    lance = optional_library("lance", extra="lance", what="Lance datasets")
    uri = _lance_uri(url)
    try:
        return lance.dataset(uri, version=version)
    except (ValueError, OSError, RuntimeError) as err:
        if isinstance(err, FileNotFoundError):
            raise
        raise DatasetFormatError(
            f"{url}: not a readable Lance dataset ({err}); is a manifest or data file missing or cut short?"
        ) from err


@dataclass(frozen=True)
class LanceFormat(FileFormat):
    """A Lance dataset folder: one shard per fragment of the version found at discovery."""

    name: ClassVar[str] = "lance"
    expected: ClassVar[str] = "a Lance dataset folder (with _versions/)"

    def recognises_folder(self, path: str) -> bool:
        return fs.isdir(fs.join(path, _VERSIONS))

    def discover(self, name: str, files: Sequence[str]) -> Discovered:
        raise ConfigError(
            f"Dataset {name!r}: a Lance dataset is a folder, not files; point at the folder that holds "
            f"{_VERSIONS}/ and data/ (files given: {[fs.basename(f) for f in files][:3]})."
        )

    def discover_folder(self, name: str, path: str) -> Discovered:
        handle = open_version(path, None)
        version = int(handle.version)
        shards = []
        for i, fragment in enumerate(handle.get_fragments()):
            extra = {"version": version, "fragment_id": int(fragment.fragment_id)}
            size = sum(int(f.file_size_bytes or 0) for f in fragment.data_files())
            shards.append(
                ShardInfo(shard_id=i, path=path, num_rows=int(fragment.count_rows()), num_bytes=size, extra=extra)
            )
        return Discovered(format=self, shards=tuple(shards), schema=handle.schema)

    def open_reader(self, dataset: Dataset, *, columns: Sequence[str] | None = None) -> ShardReader:
        return LanceReader(dataset, columns=columns)


class LanceReader:
    """Reads rows of a Lance dataset's fragments by index (the pinned version opened once per
    reader; not thread-safe). Lance takes strictly increasing indices, so the reader asks for
    the distinct rows in order and puts them in the order asked."""

    def __init__(self, dataset: Dataset, *, columns: Sequence[str] | None = None) -> None:
        self.dataset = dataset
        self.schema = project(dataset.schema, check_columns(dataset.name, dataset.schema, columns))
        self._handle: Any = None
        self._fragments: dict[int, Any] = {}

    def _fragment(self, shard_id: int) -> tuple[str, Any]:
        info = shard_info(self.dataset.shards, shard_id, dataset=self.dataset.name)
        url = info.file_path()
        if shard_id not in self._fragments:
            if self._handle is None:
                self._handle = open_version(url, info.extra["version"])
            fragment = self._handle.get_fragment(info.extra["fragment_id"])
            if fragment is None:
                raise DatasetFormatError(
                    f"{url}: version {info.extra['version']} has no fragment {info.extra['fragment_id']} any more; "
                    "discover the dataset again."
                )
            self._fragments[shard_id] = fragment
        return url, self._fragments[shard_id]

    def take(self, shard_id: int, rows: np.ndarray) -> pa.Table:
        url, fragment = self._fragment(shard_id)
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) == 0:
            return self.schema.empty_table()
        wanted, where = np.unique(rows, return_inverse=True)
        try:
            table = fragment.take(wanted.tolist(), columns=self.schema.names)
        except (ValueError, OSError, RuntimeError) as err:
            raise DatasetFormatError(f"{url}: reading rows of fragment {shard_id} failed ({err}).") from err
        table = in_column_order(table, self.schema.names)
        if len(wanted) == len(rows) and bool(np.all(where == np.arange(len(rows)))):
            return table
        return table.take(pa.array(where, pa.int64()))

    def close(self) -> None:
        self._handle, self._fragments = None, {}


LANCE = LanceFormat()
