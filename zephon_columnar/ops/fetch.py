"""`FetchOp`: sample pointers in, payload rows out (the implicit first operator).

Input is a pointer frame (bookkeeping only: dataset, shard, row per sample, in read order);
output is the same frame with the payload columns of those rows. Rows are read per
(dataset, shard) group through each dataset's reader, so a run of consecutive rows of one
shard is one zero-copy slice of a decoded row group.

With execution tracking on (``StageInfo.collect_stats``), each read of one shard's rows is a
*fetch group*: its rows, seconds, and the shard cache's hits, downloads and retries during it
(`take_group_counts`, which the engine sums into ``Pipeline.fetch_timing_snapshot``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from itertools import pairwise
from typing import Any

import numpy as np
import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.errors import DatasetFormatError
from zephon_columnar.io import fs
from zephon_columnar.io.base import ShardReader
from zephon_columnar.io.dataset import Dataset
from zephon_columnar.io.decoded import DEFAULT_LIMIT_BYTES as DEFAULT_DECODED_LIMIT_BYTES
from zephon_columnar.io.decoded import configure_decoded_cache
from zephon_columnar.ops.base import FrameOp, OpContext, OpTraits

#: The first element of a fetch group's metrics key: ``(FETCH_GROUP, stage, dataset_id, shard_id)``.
FETCH_GROUP = "fetch_group"

#: Runs read between two gathers of an interleaved frame (see `FetchOp.process_frame`).
_GATHER_RUNS = 64


def shard_cache_settings(options: Any) -> dict[str, Any] | None:
    """``configure_shard_cache`` arguments from ``RuntimeOptions.io_options`` (None: defaults)."""
    cache = options.store_options().cache
    settings = {
        "root": cache.root,
        "limit_bytes": cache.limit_bytes,
        "download_policy": cache.download_policy(),
        "metadata_policy": cache.metadata_policy(),
    }
    defaults = {
        "root": None,
        "limit_bytes": None,
        "download_policy": fs.DOWNLOAD_POLICY,
        "metadata_policy": fs.METADATA_POLICY,
    }
    return None if settings == defaults else settings


def decoded_cache_limit(options: Any) -> int | None:
    """``configure_decoded_cache``'s limit from ``RuntimeOptions.io_options`` (None: the default,
    left as the process has it)."""
    limit: int = options.store_options().decoded_cache_bytes
    return None if limit == DEFAULT_DECODED_LIMIT_BYTES else limit


def mixture_fields(datasets: Mapping[int, Any]) -> pa.Schema | None:
    """The union of the datasets' fields (in dataset id order, each field first seen, its
    first non-null type) when their field names differ; None when they agree or a dataset's
    schema is unknown (in-memory data of a custom work source has none).

    Example:
        >>> a = Dataset.from_tables("a", [pa.table({"id": [1], "text": ["x"]})])
        >>> b = Dataset.from_tables("b", [pa.table({"id": [2], "key": ["k"]})])
        >>> mixture_fields({0: a, 1: b}).names
        ['id', 'text', 'key']
        >>> mixture_fields({0: a, 1: a}) is None
        True
    """
    schemas = [ds.schema for _, ds in sorted(datasets.items()) if isinstance(ds, Dataset) and ds.format is not None]
    if len(schemas) < len(datasets) or len({tuple(s.names) for s in schemas}) <= 1:
        return None
    fields: dict[str, pa.Field] = {}
    for schema in schemas:
        for fld in schema:
            if fld.name not in fields or pa.types.is_null(fields[fld.name].type):
                fields[fld.name] = fld
    return pa.schema(list(fields.values()))


class FetchOp(FrameOp):
    """Read the payload rows of a pointer frame. Stateless; one reader per dataset per worker."""

    name = "fetch"

    def __init__(self, parallelism: int | None = None, max_batch: int | None = None) -> None:
        super().__init__()
        self.parallelism = parallelism
        self.max_batch = max_batch  # rows per frame; None: the engine chooses (Engine.rows_per_frame)
        self._datasets: dict[int, Any] = {}
        self._fields: pa.Schema | None = None  # a mixture's union of fields, when its datasets' differ
        self._readers: dict[int, ShardReader] = {}
        self._own: list[ShardReader] = []
        self._pool: Any = None
        self._stage = -1
        self._groups: list[tuple[tuple[str, int, int, int], dict[str, int]]] | None = None  # None: not tracking

    def traits(self) -> OpTraits:
        # It writes each dataset's own columns, the ones the engine knows (fields_by_dataset).
        return OpTraits(
            preserves_cursor_order=True,
            parallelism=self.parallelism or 1,
            emits="one",
            reads=frozenset(),
            writes=frozenset(),
        )

    def setup(self, ctx: OpContext) -> None:
        super().setup(ctx)
        cache = ctx.get("shard_cache")
        if cache is not None:  # options(io_options=...) named a cache root or limit: in this process too
            fs.configure_shard_cache(**cache)
        decoded_limit = ctx.get("decoded_cache_bytes")
        if decoded_limit is not None:  # options(io_options={"decoded_cache_bytes": ...}), in this process too
            configure_decoded_cache(decoded_limit)
        self._datasets = dict(ctx.get("datasets_by_id", {}))
        self._fields = mixture_fields(self._datasets)
        self._pool = ctx.get("reader_pool")
        self._readers = {}
        self._own = []
        self._stage = ctx.stage_info.stage_index
        self._groups = [] if ctx.stage_info.collect_stats else None

    def teardown(self) -> None:
        for reader in self._own:  # shared readers belong to the pool
            reader.close()
        self._readers, self._own = {}, []

    def _reader(self, dataset_id: int) -> ShardReader:
        reader = self._readers.get(dataset_id)
        if reader is None:
            dataset = self._datasets[dataset_id]
            reader = self._pool.shared_reader(dataset_id, dataset) if self._pool is not None else None
            if reader is None:
                reader = dataset.open_reader()
                self._own.append(reader)
            self._readers[dataset_id] = reader
        return reader

    def process_frame(self, frame: pa.Table) -> pa.Table:
        n = frame.num_rows
        if n == 0:
            return frame
        dataset = frame.column(F.DATASET).to_numpy()
        shard = frame.column(F.SHARD).to_numpy()
        row = frame.column(F.ROW).to_numpy()
        key = dataset.astype(np.int64) << 32 | shard.astype(np.int64)
        run_starts = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1])))
        if len(run_starts) <= max(8, n // 64):
            # Few runs (one dataset, or long runs per shard): read each run in place, no reorder.
            bounds = np.append(run_starts, n).tolist()
            parts = [self._take(int(dataset[s]), int(shard[s]), row[s:e]) for s, e in pairwise(bounds)]
            payload = F.concat_frames(parts)
        else:
            # Many short runs (an interleaved mixture): one read per shard, then one reorder.
            order = np.argsort(key, kind="stable")
            sorted_key = key[order]
            cuts = np.flatnonzero(sorted_key[1:] != sorted_key[:-1]) + 1
            bounds = np.concatenate(([0], cuts, [n])).tolist()
            # A read returns a zero-copy slice that keeps its whole row group alive: gathered
            # every _GATHER_RUNS runs, a frame of a wide mixture (a row or two from each of a
            # thousand row groups) holds at most that many row groups beyond the decoded cache,
            # whose limit then bounds memory, rather than one per row of the frame.
            gathered = []
            for i in range(0, len(bounds) - 1, _GATHER_RUNS):
                parts = [
                    self._take(int(dataset[order[s]]), int(shard[order[s]]), row[order[s:e]])
                    for s, e in pairwise(bounds[i : i + _GATHER_RUNS + 1])
                ]
                joined = F.concat_frames(parts)
                gathered.append(joined.combine_chunks() if len(parts) > 1 and joined.num_columns else joined)
            inverse = np.empty(n, dtype=np.int64)
            inverse[order] = np.arange(n)
            payload = F.concat_frames(gathered)
            if payload.num_columns:  # rows without fields have no order to restore
                payload = payload.take(pa.array(inverse))
        if self._fields is not None:
            payload = F.with_fields(payload, self._fields)
        return F.with_payload(frame, payload)

    def take_group_counts(self) -> list[tuple[tuple[str, int, int, int], dict[str, int]]]:
        """The fetch groups read since the last call: ``((FETCH_GROUP, stage, dataset_id,
        shard_id), counts)``, counts in `FetchTimingTotals`' names ([] when not tracking)."""
        if not self._groups:
            return []
        out, self._groups = self._groups, []
        return out

    def _take(self, dataset_id: int, shard_id: int, rows: np.ndarray) -> pa.Table:
        if self._groups is None:
            return self._checked_take(dataset_id, shard_id, rows)
        cache = fs.default_shard_cache()
        before, t0 = cache.thread_counts(), time.perf_counter_ns()
        table = self._checked_take(dataset_id, shard_id, rows)
        spent, asked = time.perf_counter_ns() - t0, cache.thread_counts().since(before)
        self._groups.append(
            (
                (FETCH_GROUP, self._stage, dataset_id, shard_id),
                {
                    "samples": len(rows),
                    "groups": 1,
                    "group_ns": spent,
                    "read_ns": spent,
                    "retries": asked.retries,
                    "cache_hits": asked.hits,
                    "cache_misses": asked.downloads,
                },
            )
        )
        return table

    def _checked_take(self, dataset_id: int, shard_id: int, rows: np.ndarray) -> pa.Table:
        table = self._reader(dataset_id).take(shard_id, rows)
        if table.num_rows != len(rows):
            ds = self._datasets[dataset_id]
            raise DatasetFormatError(
                f"dataset {ds.name!r} ({dataset_id}), {ds.shard_label(shard_id)}: asked for {len(rows)} rows, the "
                f"reader returned "
                f"{table.num_rows}; the file changed after discovery? Re-create the Dataset."
            )
        return table
