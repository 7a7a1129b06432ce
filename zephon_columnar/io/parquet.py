"""Parquet: shard discovery from footers, and a row-group-aware reader.

Discovery reads only footers (``pq.read_metadata``): per file the row count, the row count of
every row group (``ShardInfo.extra["row_groups"]``), the size in bytes and the Arrow schema.
Every shard must have the same columns and types; the same columns in another order are fine
(the reader returns every shard in the first shard's column order).

The reader decodes whole row groups (Parquet's unit of decoding) and keeps a small LRU of
decoded row groups, so a sequential scan in slices smaller than a row group decodes each row
group once, and rows that fall in one row group come back as zero-copy slices.

Decoding uses ``ParquetFile.read_row_groups(use_threads=False)``, several row groups per call
on sequential access (read-ahead: 4 MiB of row groups per call, doubling to 64 MiB). Measured
on pyarrow 26 (2 vCPU VM, fresh processes, `benchmarks/RESULTS.md`): the dataset API
(``ParquetFileFragment.subset(...).to_table()``, what ``pq.read_table`` uses) decodes a big scan
up to 1.6x faster when a core is idle, but its scanner hands work between thread pools and
its first calls in a process took 35-140 ms for what ``read_row_groups`` did in a steady 46 ms.
In a pipeline the other cores are busy (tokenizer, packing, the training step), and the
runner's workers are the parallelism, so the reader decodes in the calling thread.

Example:
    >>> ds = Dataset.from_path("web", "data/web/part-000.parquet")
    >>> reader = ParquetReader(ds)
    >>> reader.take(0, np.arange(10, 14)).column("id").to_pylist()
    [10, 11, 12, 13]
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from zephon_columnar.errors import DatasetFormatError
from zephon_columnar.io import fs
from zephon_columnar.io.base import ShardInfo, ShardReader, check_columns, project, shard_info
from zephon_columnar.io.decoded import decoded_cache, new_owner
from zephon_columnar.io.format import Discovered, FileFormat
from zephon_columnar.io.open_files import OPEN_FILES
from zephon_columnar.io.retry import RetriesExhaustedError
from zephon_columnar.io.tables import check_same_schema, in_column_order, take_rows
from zephon_columnar.memory import buffer_pool

if TYPE_CHECKING:
    from zephon_columnar.io.dataset import Dataset

# Decoded row groups kept per reader (read-ahead + what is being sliced), within the process-wide
# `zephon_columnar.io.decoded` limit that every reader shares.
DEFAULT_CACHE_BYTES = 32 << 20
DEFAULT_MAX_OPEN_FILES = 16
# Sequential read-ahead, in uncompressed bytes (footer sizes) per decode call: starts at 4 MiB
# and doubles while the scan stays sequential, up to 64 MiB (and half the row-group cache).
# Fewer, larger calls amortize the per-call cost; a byte budget keeps that true for tiny and
# for huge row groups alike.
_READAHEAD_START_BYTES = 4 << 20
_READAHEAD_MAX_BYTES = 64 << 20
_FOOTER_THREADS = 16
_FOOTER_GUESS_BYTES = 64 << 10  # the first range read of a remote footer (Arrow's own guess)


# ---------------------------------------------------------------- the format
@dataclass(frozen=True)
class ParquetFormat(FileFormat):
    """``*.parquet`` files, one shard each; row counts, row-group sizes and the schema from footers.

    Example:
        >>> found = PARQUET.discover("web", ["data/web/part-000.parquet"])
        >>> found.shards[0].num_rows, found.shards[0].extra["row_groups"]
        (16, (8, 8))
    """

    name: ClassVar[str] = "parquet"
    expected: ClassVar[str] = "*.parquet"
    shared_readers: ClassVar[bool] = True  # one row-group cache per process

    def recognises_file(self, file_name: str, *, chosen: bool) -> bool:
        return file_name.endswith(".parquet")

    def discover(self, name: str, files: Sequence[str]) -> Discovered:
        """Reads only the footers. Raises :class:`DatasetFormatError` naming the file for a
        corrupt or non-Parquet file, and naming the shard when schemas differ."""
        files = list(files)
        footers: list[_Footer] = []
        # Each footer is cut down to its facts as it comes, and the schemas equal to the first
        # share its object: a folder of 100,000 files held every footer and schema at once
        # (1.1 GB at the peak of its discovery, 0.4 GB once it was done).
        for footer in _footers_of(files):
            if footers and footer.schema.equals(footers[0].schema):
                footer = dataclasses.replace(footer, schema=footers[0].schema)
            footers.append(footer)
        labelled = [(f"shard {i} ({fs.basename(f)})", ft.schema) for i, (f, ft) in enumerate(zip(files, footers))]
        check_same_schema(name, labelled)
        shards = tuple(
            ShardInfo(
                shard_id=i,
                path=f,
                num_rows=sum(footer.row_groups),
                num_bytes=footer.size,
                extra={"row_groups": footer.row_groups},
            )
            for i, (f, footer) in enumerate(zip(files, footers))
        )
        return Discovered(format=self, shards=shards, schema=footers[0].schema if footers else pa.schema([]))

    def open_reader(self, dataset: Dataset, *, columns: Sequence[str] | None = None) -> ShardReader:
        return ParquetReader(dataset, columns=columns)


PARQUET = ParquetFormat()


def _read_remote_footer(url: str) -> tuple[pq.FileMetaData, int]:
    """The footer from range reads of the file's end (retried after transient errors), parsed
    outside the retries: Arrow reports a corrupt footer as an ``OSError``, which must not be
    mistaken for a network error.

    The footer's bytes are remembered in the shard cache (`ShardCache.remember`), keyed by the
    URL, size and version tag (ETag) of the file: the processes of a node that share the cache
    read each footer once between them. A backend that reports no version tag is read each time.
    """
    size, tag = fs.file_info(url)

    def footer_bytes() -> bytes:
        tail = fs.remote_call(url, "footer read", lambda: fs.read_range(url, max(0, size - _FOOTER_GUESS_BYTES), size))
        if len(tail) >= 8 and tail[-4:] == b"PAR1":
            needed = int.from_bytes(tail[-8:-4], "little") + 8  # footer length + its 8-byte trailer
            if len(tail) < needed <= size:
                tail = fs.remote_call(url, "footer read", lambda: fs.read_range(url, size - needed, size))
            elif needed <= len(tail):
                tail = tail[-needed:]
        return tail

    key = f"parquet footer\0{fs.canonical(url)}\0{size}\0{tag}"
    tail = fs.default_shard_cache().remember(key, footer_bytes) if tag else footer_bytes()
    return pq.read_metadata(pa.BufferReader(tail)), size


@dataclass(frozen=True, kw_only=True)
class _Footer:
    """What discovery keeps of a file's footer."""

    row_groups: tuple[int, ...]  # rows in each row group
    size: int  # the file's size in bytes
    schema: pa.Schema


def _footers_of(files: list[str]) -> Iterator[_Footer]:
    """The facts of each file's footer, in order (read on a few threads: footer reads are
    latency-bound on remote stores, and threads hide that)."""
    if len(files) <= 1:
        yield from map(_footer_facts, files)
        return
    with ThreadPoolExecutor(max_workers=min(_FOOTER_THREADS, len(files))) as pool:
        yield from pool.map(_footer_facts, files)


def _footer_facts(url: str) -> _Footer:
    md, size = _read_footer(url)
    return _Footer(
        row_groups=tuple(md.row_group(g).num_rows for g in range(md.num_row_groups)),
        size=size,
        schema=md.schema.to_arrow_schema(),
    )


def _read_footer(url: str) -> tuple[pq.FileMetaData, int]:
    """``(footer, file size)``; a file that is not Parquet becomes a DatasetFormatError, one the
    OS cannot read (permissions, I/O error) an :class:`~zephon_columnar.io.fs.UnreadableFileError`."""
    try:
        if fs.is_local(url):
            path = fs.to_local(url)
            return pq.read_metadata(path), fs.file_size(path)
        return _read_remote_footer(url)
    except (pa.ArrowInvalid, OSError) as err:
        if isinstance(err, (FileNotFoundError, RetriesExhaustedError)):
            raise
        if fs.is_read_failure(err):
            raise fs.unreadable_file(url, err) from err
        raise DatasetFormatError(
            f"{url}: not a readable Parquet file ({err}). Re-write it (e.g. with "
            "pyarrow.parquet.write_table) or remove it from the dataset directory."
        ) from err


# ---------------------------------------------------------------- reading
class _OpenShard:
    """One shard's open file, footer and row-group layout (an entry of the handle LRU)."""

    def __init__(self, url: str, path: str, counts: Sequence[int]) -> None:
        self.url = url  # what error messages name (the local copy of a remote shard is a cache file)
        # pre_buffer=False: the file is local (remote shards are read from their cached copy),
        # so plain reads in this thread beat coalesced reads handed to Arrow's I/O pool.
        self.file = _open_file(path)
        md = self.file.metadata
        found = [md.row_group(g).num_rows for g in range(md.num_row_groups)]
        if counts and list(counts) != found:
            raise DatasetFormatError(
                f"{url}: row groups {found} differ from {list(counts)} seen at discovery; the file "
                "changed since the dataset was discovered. Rediscover it with Dataset.from_path."
            )
        self.starts = np.zeros(len(found) + 1, dtype=np.int64)
        np.cumsum(found, out=self.starts[1:])
        self.rows = int(self.starts[-1])
        self.group_bytes = np.array([md.row_group(g).total_byte_size for g in range(md.num_row_groups)], dtype=np.int64)
        # The row group right after the last decode: a miss there, by a take that continues
        # the previous one (``next_row``: the row after it, -1 for none), means a sequential scan.
        self.next_group = 0
        self.next_row = -1
        self.window_bytes = _READAHEAD_START_BYTES  # read-ahead budget; doubles while sequential

    def close(self) -> None:
        self.file.close()


def _open_file(path: str) -> pq.ParquetFile:
    """``ParquetFile(path)`` whose reads allocate from `memory.buffer_pool` (``ParquetFile``
    takes no pool: its reader is re-opened with one; any failure there keeps the default reader)."""
    file = pq.ParquetFile(path, pre_buffer=False)
    pool = buffer_pool()
    if pool is not None:
        try:
            from pyarrow._parquet import ParquetReader as _LowLevelReader

            reader = _LowLevelReader(memory_pool=pool)
            reader.open(
                path, use_memory_map=False, pre_buffer=False, metadata=file.metadata, arrow_extensions_enabled=True
            )
        except (ImportError, AttributeError, TypeError, ValueError, OSError, pa.ArrowException):
            return file  # a pyarrow without this (private) API: the default reader works
        file.reader.close()
        file.reader = reader
    return file


class ParquetReader:
    """Reads rows of a Parquet dataset's shards, decoding whole row groups once.

    Contract:
        - ``take(shard_id, rows)`` returns the payload columns (or ``columns``) of ``rows``
          (int64 indices into the shard) in that order, columns in the dataset schema's order
          whatever the order in the shard's file; a zero-copy slice when the rows are
          consecutive, ``Table.take`` otherwise.
        - Decoded row groups are kept in the process's `DecodedCache` (every reader's
          together within its ``limit_bytes``; this reader's within ``cache_bytes``, decoded
          Arrow bytes); open files and footers in an LRU of ``max_open_files`` shards, all
          closed after a take when the process's readers hold more than `OPEN_FILES` allows.
        - A scan (a take of consecutive rows that continues the previous take of the shard)
          reads ahead (4 MiB of row groups per decode, doubling up to 64 MiB or half the
          cache), so a scan in slices of any size decodes each row group exactly once; any
          other take decodes only the row groups it needs.
        - Remote shards are read from their local copy in ``shard_cache``.
        - Not thread-safe: one reader per worker. ``stats`` counts decoded row groups
          (``"decoded_groups"``), decode calls and cache hits.

    Example:
        >>> reader = ParquetReader(Dataset.from_path("web", "data/web"))
        >>> reader.take(0, np.array([5, 3, 4])).column("id").to_pylist()  # in the order asked
        [5, 3, 4]
        >>> reader.stats["decoded_groups"]
        1
    """

    def __init__(
        self,
        dataset: Dataset,
        *,
        columns: Sequence[str] | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        max_open_files: int = DEFAULT_MAX_OPEN_FILES,
        shard_cache: fs.ShardCache | None = None,
    ) -> None:
        schema = dataset.schema
        self._columns = check_columns(dataset.name, schema, columns)
        self._schema = project(schema, self._columns)
        self._names = self._schema.names  # every shard comes back in this column order
        self._name = dataset.name
        self._shards = dataset.shards
        self._cache_bytes = int(cache_bytes)
        self._max_open = max(1, int(max_open_files))
        self._shard_cache = shard_cache or fs.default_shard_cache()
        self._open: OrderedDict[int, _OpenShard] = OrderedDict()
        self._decoded = decoded_cache()
        self._owner = new_owner()  # this reader's entries in it: (owner, shard_id, group)
        self.stats = {"decoded_groups": 0, "decode_calls": 0, "cache_hits": 0}

    # ------------------------------------------------------------ public
    def take(self, shard_id: int, rows: np.ndarray) -> pa.Table:
        try:
            return self._take(shard_id, rows)
        finally:
            if OPEN_FILES.over():  # the process's readers hold too many files: give this one's back
                self._close_files()

    def _take(self, shard_id: int, rows: np.ndarray) -> pa.Table:
        rows = np.asarray(rows, dtype=np.int64)
        n = len(rows)
        if n == 0:
            return self._schema.empty_table()
        shard = self._shard(shard_id)
        starts = shard.starts
        if n == 1:  # a wide mixture asks each dataset for a row or so per frame: no reductions
            lo = hi = int(rows[0])
            run = True
        else:
            lo, hi = int(rows.min()), int(rows.max())
            run = int(rows[0]) == lo and hi - lo == n - 1 and bool(np.all(np.diff(rows) == 1))
        if lo < 0 or hi >= shard.rows:
            bad = lo if lo < 0 else hi
            raise IndexError(f"{shard.url}: row {bad} is out of range for shard {shard_id} with {shard.rows} rows.")
        if len(starts) == 2:  # one row group
            g_lo = g_hi = 0
        else:
            g_lo = int(np.searchsorted(starts, lo, side="right")) - 1
            g_hi = int(np.searchsorted(starts, hi, side="right")) - 1
        # Read ahead only for a run that continues the previous take of this shard: a scan.
        # The first take of a shard, or scattered rows (a restore recomputing the documents a
        # checkpoint holds, a shuffled block), say nothing about what comes next, and decoding
        # more would only delay the rows asked for.
        scan = run and lo == shard.next_row
        shard.next_row = hi + 1 if run else -1
        if g_lo == g_hi:  # one row group: slice or take inside it
            table = self._load(shard_id, shard, [g_lo], scan=scan)[g_lo]
            return take_rows(table, rows - starts[g_lo])
        if run:
            # A consecutive run across row groups: concatenated zero-copy slices.
            tables = self._load(shard_id, shard, range(g_lo, g_hi + 1), scan=scan)
            pieces = []
            for g in range(g_lo, g_hi + 1):
                a, b = max(lo, int(starts[g])), min(hi + 1, int(starts[g + 1]))
                pieces.append(tables[g].slice(a - int(starts[g]), b - a))
            return pa.concat_tables(pieces)
        groups = np.searchsorted(starts, rows, side="right") - 1
        used = np.unique(groups)
        tables = self._load(shard_id, shard, used.tolist(), scan=False)
        # Offset of each used group inside the concatenation of the used groups.
        sizes = starts[used + 1] - starts[used]
        base = np.zeros(len(starts), dtype=np.int64)
        base[used] = np.cumsum(sizes) - sizes
        positions = rows - starts[groups] + base[groups]
        combined = pa.concat_tables([tables[int(g)] for g in used])
        return combined.take(pa.array(positions, pa.int64()))

    def close(self) -> None:
        self._close_files()
        self._decoded.release(self._owner)

    def _close_files(self) -> None:
        for shard in self._open.values():
            shard.close()
        OPEN_FILES.closed(len(self._open))
        self._open.clear()

    # ------------------------------------------------------------ files
    def _shard(self, shard_id: int) -> _OpenShard:
        shard = self._open.get(shard_id)
        if shard is not None:
            self._open.move_to_end(shard_id)
            return shard
        info = shard_info(self._shards, shard_id, dataset=self._name)
        url = info.file_path()
        counts = info.extra.get("row_groups", ())

        def open_copy(path: str) -> _OpenShard:
            try:
                return _OpenShard(url, path, counts)
            except (pa.ArrowInvalid, OSError) as err:
                if fs.is_read_failure(err):
                    raise fs.unreadable_file(url, err) from err
                raise DatasetFormatError(
                    f"{info.path}: cannot open as Parquet ({err}). Re-write the file or remove it "
                    "from the dataset directory, then rediscover the dataset."
                ) from err

        # Opened while no other process sharing the cache may evict the copy.
        shard = self._shard_cache.open_local(url, info.num_bytes or None, open_copy)
        self._open[shard_id] = shard
        OPEN_FILES.opened()
        while len(self._open) > self._max_open:
            _, old = self._open.popitem(last=False)
            old.close()
            OPEN_FILES.closed()
        return shard

    # ------------------------------------------------------------ row groups
    def _load(self, shard_id: int, shard: _OpenShard, wanted: Iterable[int], *, scan: bool) -> dict[int, pa.Table]:
        """Decoded tables of the row groups ``wanted`` (sorted), decoding the missing ones (and,
        with ``scan``, the next ones when the access is sequential)."""
        out: dict[int, pa.Table] = {}
        missing: list[int] = []
        for g in wanted:
            table = self._decoded.get((self._owner, shard_id, g))
            if table is None:
                missing.append(g)
            else:
                self.stats["cache_hits"] += 1
                out[g] = table
        if missing:
            decode = self._with_readahead(shard_id, shard, missing, scan)
            for g, table in zip(decode, self._decode(shard, decode)):
                if g in missing:
                    out[g] = table
                self._decoded.put((self._owner, shard_id, g), table, table.nbytes, owner_limit=self._cache_bytes)
        return out

    def _with_readahead(self, shard_id: int, shard: _OpenShard, missing: list[int], scan: bool) -> list[int]:
        """``missing`` plus the next row groups when a scan (see `take`) meets them in order."""
        last = missing[-1]
        sequential = scan and missing[0] == shard.next_group and last - missing[0] == len(missing) - 1
        decode = list(missing)
        if sequential:
            # Never read ahead more than half of this reader's room (its own limit, and its share
            # of the process's among the readers holding groups), so read-ahead cannot evict
            # itself, nor push out what the other datasets' readers will use next.
            room = min(self._cache_bytes, self._decoded.fair_share()) // 2
            budget = min(shard.window_bytes, room) - int(shard.group_bytes[missing].sum())
            n_groups = len(shard.starts) - 1
            g = last + 1
            while g < n_groups and (self._owner, shard_id, g) not in self._decoded:
                budget -= int(shard.group_bytes[g])
                if budget < 0:
                    break
                decode.append(g)
                g += 1
            shard.window_bytes = min(_READAHEAD_MAX_BYTES, shard.window_bytes * 2)
        else:
            shard.window_bytes = _READAHEAD_START_BYTES
        shard.next_group = decode[-1] + 1
        return decode

    def _decode(self, shard: _OpenShard, groups: list[int]) -> list[pa.Table]:
        self.stats["decode_calls"] += 1
        self.stats["decoded_groups"] += len(groups)
        try:
            # One thread: Arrow's pool gains nothing on a column or two of one shard, and its
            # start-up and hand-offs cost more than the decode on small hosts (measured in
            # benchmarks/RESULTS.md); the runner's workers are the parallelism.
            table = shard.file.read_row_groups(groups, columns=self._columns, use_threads=False)
            # A shard may store the dataset's columns in another order: return the dataset's.
            table = in_column_order(table, self._names)
            if len(groups) == 1:
                return [table]
        except (pa.ArrowInvalid, OSError) as err:
            if fs.is_read_failure(err):
                raise fs.unreadable_file(shard.url, err) from err
            raise DatasetFormatError(
                f"{shard.url}: row groups {groups} cannot be decoded ({err}). The file is corrupt; "
                "re-write it or remove it from the dataset directory."
            ) from err
        # The scan returns the groups in order; cut it back into one zero-copy table per group.
        out, offset = [], 0
        for g in groups:
            size = int(shard.starts[g + 1] - shard.starts[g])
            out.append(table.slice(offset, size))
            offset += size
        return out
