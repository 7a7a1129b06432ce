"""Where data lives: datasets (shards with row counts) and the readers that take rows from them.

Zephon's ``zephon.io`` names: :class:`Dataset`, :class:`InMemoryShard`, the storage options
(:class:`StoreOptions`, :class:`CacheOptions` and the rest, `zephon_columnar.io.options`), plus
:class:`ShardInfo` (the per-shard metadata every reader works from) and the format plug-in
(:class:`Format`, :class:`FileFormat`, :class:`Discovered`, :func:`register_format`; see
`zephon_columnar.io.format`).
"""

import os

# Arrow's compute, dataset (which pulls in pandas when installed), JSON and Parquet layers load
# lazily on first use, ~0.3 s; pyarrow.parquet.read_table pays the same. Loading them here puts that cost
# at import time instead of inside the first pass a training job times. A process runner's worker
# skips pyarrow.dataset (0.15-0.25 s of its start-up, on the first frame's path): nothing it
# runs needs it, and what does would load it then.
import pyarrow.compute
import pyarrow.json
import pyarrow.parquet

if os.environ.get("ZEPHON_COLUMNAR_PROCESS_WORKER") != "1":
    import pyarrow.dataset  # noqa: F401

from zephon_columnar.io.base import ShardInfo
from zephon_columnar.io.dataset import Dataset, InMemoryShard
from zephon_columnar.io.format import Discovered, FileFormat, Format
from zephon_columnar.io.options import (
    ArrowOptions,
    CacheOptions,
    LanceOptions,
    ParquetOptions,
    ParquetRGCacheOptions,
    StoreOptions,
    VortexOptions,
)
from zephon_columnar.io.registry import register_format

__all__ = [
    "ArrowOptions",
    "CacheOptions",
    "Dataset",
    "Discovered",
    "FileFormat",
    "Format",
    "InMemoryShard",
    "LanceOptions",
    "ParquetOptions",
    "ParquetRGCacheOptions",
    "ShardInfo",
    "StoreOptions",
    "VortexOptions",
    "register_format",
]
