"""JSON Lines: shard discovery from a cached line index, and a batch-parsing reader.

Files: ``*.jsonl``, ``*.jsonl.gz``, ``*.jsonl.zst`` (and ``*.json`` / ``*.ndjson`` holding JSON
Lines, with the same compressions), in UTF-8. Every non-blank line must be one JSON object; it is
one row.

Discovery counts newlines in big binary blocks and keeps the byte offset of every row (a
:class:`LineIndex`); in the same pass pyarrow parses each block (columnar, no Python object per
row) to learn the schema of every line. Index and schema are cached on disk under
``cache_root()/jsonl_index`` keyed by the file's identity, size and modification time, so a
second discovery of an unchanged file reads the cache instead of parsing the file again.

Blank lines (empty or only spaces, tabs, ``\\r``) are skipped anywhere in a file, as pyarrow,
pandas and Hugging Face ``datasets`` do; they are not rows, but error messages still give the
physical 1-based line number.

The dataset's schema covers every field of every line of every file: a field that first appears
on line 1,000,000 or only in the last file is a column, null in the rows without it. Types widen
as Arrow's JSON reader widens them: null and any type give that type, ints and floats give
``double``, objects merge their fields, arrays their items. A field with two JSON types that do not
widen (a number on one line, a string or an object on another) fails discovery with a
DatasetFormatError naming the file, the line and the field. Strings that look like timestamps stay
strings (a JSON string is a ``str`` in Zephon's payload). The schema is imposed on every read
(``pyarrow.json.read_json`` with an explicit schema).

Discovery also checks the first ~1000 rows of the first non-empty file strictly: a line there that
is not one JSON object, or not UTF-8, fails discovery. A bad line further on is left out of the
schema and reported, with its line number, by the reader when its row is read.

Example:
    >>> ds = Dataset.from_path("chat", "data/chat/part-000.jsonl")
    >>> rows = JsonlReader(ds).take(0, np.array([3, 1])).to_pylist()
    >>> [(row["id"], row["messages"][-1]) for row in rows]
    [(3, {'role': 'assistant', 'content': 'Buenos días.'}), (1, {'role': 'assistant', 'content': 'Cheerful.'})]
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import IO, TYPE_CHECKING, Any, ClassVar, Literal, cast

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson

from zephon_columnar.errors import DatasetFormatError
from zephon_columnar.io import fs
from zephon_columnar.io.base import (
    SHOWN_SKIPPED,
    BadRecordPolicy,
    ShardInfo,
    ShardReader,
    SkippedRecords,
    check_columns,
    project,
    shard_info,
)
from zephon_columnar.io.decoded import decoded_cache, new_owner
from zephon_columnar.io.format import Discovered, FileFormat
from zephon_columnar.io.open_files import OPEN_FILES

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from Python 3.11; annotations only

    from zephon_columnar.io.dataset import Dataset

log = logging.getLogger(__name__)

Compression = Literal["gzip", "zstd"] | None

_BASES = (".jsonl", ".json", ".ndjson")
_COMPRESSIONS: dict[str, Compression] = {"": None, ".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
JSONL_SUFFIXES = tuple(b + c for b in _BASES for c in _COMPRESSIONS)

SCHEMA_SAMPLE_ROWS = 1000
DEFAULT_DECODED_CACHE_BYTES = 512 << 20  # decompressed .gz/.zst files kept per reader
DEFAULT_MAX_OPEN_FILES = 16
_SCAN_BLOCK = 16 << 20  # bytes per block when counting lines
_MEMORY_INDEX_BYTES = 256 << 20  # in-process LRU of line indexes (also the fallback cache)
_WHITESPACE = b" \t\r"  # with "\n": JSON's insignificant whitespace
_LBRACE = ord("{")


def compression_of(path: str) -> Compression:
    """``"gzip"``, ``"zstd"`` or None from a JSON Lines file name.

    Example:
        >>> compression_of("a.jsonl.zst"), compression_of("a.jsonl")
        ('zstd', None)
    """
    for suffix, comp in _COMPRESSIONS.items():
        if suffix and path.endswith(suffix):
            return comp
    return None


def is_jsonl_name(name: str, *, plain_json: bool = True) -> bool:
    """Whether ``name`` looks like a JSON Lines file (``.json`` ones only if ``plain_json``)."""
    bases = _BASES if plain_json else (".jsonl", ".ndjson")
    return any(name.endswith(b + c) for b in bases for c in _COMPRESSIONS)


# ---------------------------------------------------------------- line index
@dataclass(frozen=True)
class LineIndex:
    """Byte offsets of the rows of one (decompressed) JSON Lines file, and their schema.

    ``offsets`` has ``num_rows + 1`` entries: row ``r`` is the bytes ``[offsets[r],
    offsets[r+1])`` (its line, its newline, and any blank lines after it); the last entry is
    the decompressed size. ``blank_before[i]`` is the row that follows the i-th blank line
    (``num_rows`` for trailing ones), which maps rows back to physical line numbers.
    ``schema`` is the Arrow schema of every row of the file (widened as the module docstring
    says; rows pyarrow cannot parse are left out, the reader reports them). ``bad_rows`` are
    those rows, increasing: a line that is not one JSON object in UTF-8 that pyarrow parses
    (``on_bad_record="skip"`` leaves them out of the dataset); ``bad_reasons`` say why for the
    first `SHOWN_SKIPPED` of them, as ``"line N: why"``.
    """

    offsets: np.ndarray
    blank_before: np.ndarray
    schema: pa.Schema = field(default_factory=lambda: pa.schema([]))
    bad_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    bad_reasons: tuple[str, ...] = ()

    @property
    def num_rows(self) -> int:
        return len(self.offsets) - 1

    def line_no(self, row: int) -> int:
        """1-based physical line number of ``row``."""
        return int(row) + 1 + int(np.searchsorted(self.blank_before, row, side="right"))

    @property
    def nbytes(self) -> int:
        return self.offsets.nbytes + self.blank_before.nbytes + self.bad_rows.nbytes

    def good_rows(self) -> np.ndarray:
        """The rows that are not bad, increasing (row ``i`` of a dataset that skips bad records
        is ``good_rows()[i]``)."""
        return np.delete(np.arange(self.num_rows, dtype=np.int64), self.bad_rows)


def _scan_lines(stream: IO[bytes], url: str, seed: pa.Schema | None = None) -> LineIndex:
    """Build a :class:`LineIndex` by counting newlines in big blocks, and infer its schema by
    parsing each block's complete lines with pyarrow (one call per block).

    ``seed`` is a schema the file's types must agree with (those of the dataset's earlier files):
    a field whose type conflicts with it, or changes within the file, raises DatasetFormatError
    naming ``url``, the line and the field.
    """
    row_starts: list[np.ndarray] = []
    blanks: list[np.ndarray] = []
    carry = b""  # the unfinished last line of the previous block
    base = 0  # file offset of carry[0]
    rows = 0
    schema = _SchemaSoFar(url, seed)

    def line_numbers(of_rows: np.ndarray) -> np.ndarray:
        """1-based physical line numbers of rows scanned so far (only on slow paths: the blank
        lines seen so far are all those before these rows)."""
        blank_before = np.concatenate(blanks) if blanks else np.zeros(0, dtype=np.int64)
        return of_rows + 1 + np.searchsorted(blank_before, of_rows, side="right")

    while True:
        block = stream.read(_SCAN_BLOCK)
        if not block:
            break
        buf = carry + block if carry else block
        arr = np.frombuffer(buf, dtype=np.uint8)
        nl = np.flatnonzero(arr == 10)
        if len(nl) == 0:
            carry = buf
            continue
        starts = np.empty(len(nl), dtype=np.int64)
        starts[0] = 0
        starts[1:] = nl[:-1] + 1
        blank = _blank_lines(buf, arr, starts, nl - starts)
        keep = ~blank
        row_starts.append(starts[keep] + base)
        if blank.any():
            blanks.append(rows + np.cumsum(keep)[blank])
        end = int(nl[-1]) + 1
        block_starts = starts[keep]
        if len(block_starts):
            # A row runs to the next row's start (blank lines between them included) or `end`.
            block_ends = np.append(block_starts[1:], end)
            schema.widen(buf, block_starts, block_ends, np.arange(rows, rows + len(block_starts)), line_numbers)
        rows += len(block_starts)
        carry = buf[end:]
        base += end
    if carry:  # a last line without a trailing newline
        if carry.strip(_WHITESPACE):
            row_starts.append(np.array([base], dtype=np.int64))
            last = _terminated(carry)
            schema.widen(last, np.zeros(1, dtype=np.int64), np.array([len(last)]), np.array([rows]), line_numbers)
            rows += 1
        else:
            blanks.append(np.array([rows], dtype=np.int64))
    total = base + len(carry)
    offsets = np.concatenate(row_starts + [np.array([total], dtype=np.int64)]).astype(np.int64, copy=False)
    blank_before = np.concatenate(blanks).astype(np.int64) if blanks else np.zeros(0, dtype=np.int64)
    return LineIndex(
        offsets=offsets,
        blank_before=blank_before,
        schema=schema.schema,
        bad_rows=np.array(schema.bad_rows, dtype=np.int64),
        bad_reasons=tuple(schema.bad_reasons),
    )


def _blank_lines(buf: bytes, arr: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Mask of blank lines (empty, or only spaces/tabs/CR) among lines ``[starts, starts+lengths)``."""
    blank = lengths == 0
    nonempty = np.flatnonzero(~blank)
    first = arr[starts[nonempty]]
    # Only a line that starts with whitespace can be blank; that is rare, so check those in Python.
    maybe = nonempty[(first == 32) | (first == 9) | (first == 13)]
    for i in maybe.tolist():
        s = int(starts[i])
        if not buf[s : s + int(lengths[i])].strip(_WHITESPACE):
            blank[i] = True
    return blank


class _IndexCache:
    """Line indexes: an in-process LRU in front of an on-disk cache (atomic writes).

    The disk cache lives in ``cache_root()/jsonl_index``; if that folder cannot be written, the
    in-process LRU is the only cache (logged once), and other processes rebuild their own.
    """

    def __init__(self, max_bytes: int = _MEMORY_INDEX_BYTES) -> None:
        self._mem: OrderedDict[str, LineIndex] = OrderedDict()
        self._mem_bytes = 0
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self._warned = False
        self.scans = 0  # how many files were actually scanned (tests assert on this)

    def clear_memory(self) -> None:
        with self._lock:
            self._mem.clear()
            self._mem_bytes = 0

    def get(self, key: str, scan: Callable[[], LineIndex]) -> LineIndex:
        """The index for ``key``; ``scan()`` builds it on a miss."""
        with self._lock:
            hit = self._mem.get(key)
            if hit is not None:
                self._mem.move_to_end(key)
                return hit
        path = self._disk_path(key)
        index = _load_index(path)
        if index is None:
            index = scan()
            with self._lock:
                self.scans += 1
            self._save(path, index)
        with self._lock:
            if key not in self._mem:
                self._mem[key] = index
                self._mem_bytes += index.nbytes
            while self._mem_bytes > self._max_bytes and len(self._mem) > 1:
                _, old = self._mem.popitem(last=False)
                self._mem_bytes -= old.nbytes
        return index

    @staticmethod
    def _disk_path(key: str) -> str:
        digest = hashlib.sha256(key.encode()).hexdigest()[:40]
        return os.path.join(fs.cache_root(), "jsonl_index", f"{digest}.npz")

    def _save(self, path: str, index: LineIndex) -> None:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            out = io.BytesIO()
            np.savez(
                out,
                offsets=index.offsets,
                blank_before=index.blank_before,
                schema=np.frombuffer(index.schema.serialize(), dtype=np.uint8),
                bad_rows=index.bad_rows,
                bad_reasons=np.array(index.bad_reasons, dtype=np.str_),
            )
            fs.atomic_write(path, out.getbuffer())
        except OSError as err:
            if not self._warned:
                self._warned = True
                log.warning(
                    "JSONL line index cache %s is not writable (%s); keeping indexes in "
                    "memory only. Set ZEPHON_COLUMNAR_CACHE to a writable folder.",
                    os.path.dirname(path),
                    err,
                )


def _load_index(path: str) -> LineIndex | None:
    try:
        with np.load(path) as z:
            offsets, blank = z["offsets"], z["blank_before"]
            # An index written before schemas (or bad rows) were cached has none: rebuild it.
            schema = pa.ipc.read_schema(pa.py_buffer(z["schema"].tobytes()))
            bad_rows, bad_reasons = z["bad_rows"], z["bad_reasons"]
    except (OSError, KeyError, ValueError):  # pa.ArrowInvalid is a ValueError
        return None  # absent or unreadable: rebuild (and rewrite) it
    if offsets.ndim != 1 or len(offsets) == 0 or offsets.dtype != np.int64 or bad_rows.dtype != np.int64:
        return None
    return LineIndex(
        offsets=offsets,
        blank_before=blank.astype(np.int64, copy=False),
        schema=schema,
        bad_rows=bad_rows,
        bad_reasons=tuple(str(r) for r in bad_reasons.tolist()),
    )


INDEX_CACHE = _IndexCache()


def _index_key(url: str, size: int, version: str) -> str:
    return f"{fs.canonical(url)}\0{size}\0{version}"


def _open_decompressed(local: str, compression: Compression) -> IO[bytes]:
    """A binary stream of the decompressed content of the local file ``local``."""
    if compression == "gzip":
        return cast("IO[bytes]", gzip.open(local, "rb"))  # a binary file object, as typeshed does not say
    raw = open(local, "rb")  # noqa: SIM115 - returned open (or owned by the zstd reader): the caller closes it
    if compression == "zstd":
        import zstandard

        return cast("IO[bytes]", zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True, closefd=True))
    return raw


def _read_decompressed(local: str, compression: Compression) -> bytes:
    """The whole decompressed content of ``local``."""
    with _open_decompressed(local, compression) as stream:
        return stream.read()


def line_index(url: str, local: str, size: int, version: str) -> LineIndex:
    """The :class:`LineIndex` of ``url`` (whose bytes are at the local path ``local``).

    Cached in memory and on disk by ``(url, size, version)``: a rewritten file gets a new index.
    A truncated or corrupt ``.gz``/``.zst`` file is a DatasetFormatError naming it, as is a field
    whose type changes within the file; a file the OS cannot read (permissions, I/O error) an
    :class:`~zephon_columnar.io.fs.UnreadableFileError`.
    """
    return INDEX_CACHE.get(_index_key(url, size, version), lambda: _scan_file(url, local))


def _scan_file(url: str, local: str, seed: pa.Schema | None = None) -> LineIndex:
    """:func:`_scan_lines` over the decompressed bytes of ``url`` (a local copy at ``local``)."""
    comp = compression_of(url)
    try:
        with _open_decompressed(local, comp) as stream:
            return _scan_lines(stream, url, seed)
    except DatasetFormatError:
        raise  # a bad line: already names the file and line
    except (EOFError, OSError, ValueError) as err:
        error = _read_error(url, err, f"cannot read as {comp or 'uncompressed'} JSON Lines")
        if error is err:
            raise
        raise error from err


def _read_error(url: str, err: BaseException, what: str) -> BaseException:
    """The error for a file that failed to open or decompress: itself if missing, an OS read
    failure (permissions, I/O) as `fs.unreadable_file`, else a truncated or corrupt file."""
    if isinstance(err, FileNotFoundError):
        return err
    if fs.is_read_failure(err):
        return fs.unreadable_file(url, err)
    return DatasetFormatError(
        f"{url}: {what} ({type(err).__name__}: {err}). The file is truncated or corrupt; "
        "re-write it or remove it from the dataset directory."
    )


# ---------------------------------------------------------------- the format
@dataclass(frozen=True)
class JsonlFormat(FileFormat):
    """JSON Lines files, one shard each (the module docstring has the rules).

    Example:
        >>> found = JSONL.discover("chat", ["data/chat/part-000.jsonl", "data/chat/part-001.jsonl"])
        >>> [s.num_rows for s in found.shards], JSONL.recognises_file("rows.json", chosen=False)
        ([4, 4], False)
    """

    name: ClassVar[str] = "jsonl"
    expected: ClassVar[str] = "*.jsonl[.gz|.zst]"
    #: "skip": the lines the index found bad (`LineIndex.bad_rows`) are not rows of the dataset.
    on_bad_record: BadRecordPolicy = "raise"

    def with_bad_record_policy(self, policy: BadRecordPolicy, *, dataset: str) -> Self:
        return replace(self, on_bad_record=policy)

    def recognises_file(self, file_name: str, *, chosen: bool) -> bool:
        # In a folder *.json is usually metadata (manifest.json); it counts when asked for.
        return is_jsonl_name(file_name, plain_json=chosen)

    def discover(self, name: str, files: Sequence[str]) -> Discovered:
        """Counts rows from each file's (cached) line index; the schema is the widening of the
        schemas of every file (each inferred from all its lines when it was indexed), in shard
        order. Checks the first ~1000 rows of the first non-empty file strictly. Remote files
        are downloaded once into the shard cache (counting lines needs every byte; the reader
        needs the copy anyway)."""
        files = list(files)

        skip = self.on_bad_record == "skip"

        def one(url: str) -> tuple[LineIndex, ShardInfo]:
            size, version = fs.file_info(url)
            local = fs.default_shard_cache().ensure_local(url, size)
            index = line_index(url, local, size, version)
            extra: dict[str, Any] = {"compression": compression_of(url), "size": size, "version": version}
            rows = index.num_rows
            if skip and len(index.bad_rows):
                rows -= len(index.bad_rows)
                first = tuple(f"{url}:{reason.removeprefix('line ')}" for reason in index.bad_reasons)
                extra["skipped"] = SkippedRecords(count=len(index.bad_rows), first=first)
            return index, ShardInfo(shard_id=0, path=url, num_rows=rows, num_bytes=size, extra=extra)

        if len(files) > 1:
            with ThreadPoolExecutor(max_workers=min(8, len(files))) as pool:
                found = list(pool.map(one, files))
        else:
            found = [one(f) for f in files]
        shards = tuple(
            ShardInfo(shard_id=i, path=info.path, num_rows=info.num_rows, num_bytes=info.num_bytes, extra=info.extra)
            for i, (_, info) in enumerate(found)
        )
        first = next((i for i, s in enumerate(shards) if s.num_rows > 0), None)
        if first is not None and not skip:
            _check_sample(files[first], found[first][0], shards[first].num_bytes)
        schema = _dataset_schema([(info, index) for index, info in found])
        return Discovered(format=self, shards=shards, schema=schema)

    def open_reader(self, dataset: Dataset, *, columns: Sequence[str] | None = None) -> ShardReader:
        return JsonlReader(dataset, columns=columns, skip_bad_records=self.on_bad_record == "skip")


JSONL = JsonlFormat()


def _dataset_schema(files: Sequence[tuple[ShardInfo, LineIndex]]) -> pa.Schema:
    """The schemas of ``files`` widened into one, in order; a field whose types conflict across
    files raises DatasetFormatError naming the first line of the later file that conflicts."""
    schema = pa.schema([])
    for info, index in files:
        try:
            schema = _merge_schemas(schema, index.schema)
        except _TypeConflict as conflict:
            # Only the file's widened schema is cached, not where each type came from: scan it
            # again with the earlier files' types as the seed, which names the line.
            url = info.file_path()
            local = fs.default_shard_cache().ensure_local(url, info.extra.get("size", info.num_bytes))
            _scan_file(url, local, seed=schema)
            raise DatasetFormatError(
                f"{info.path}: field {conflict.path!r} is {conflict.new} in this file but {conflict.old} "
                f"in the files before it. {_ONE_TYPE_PER_FIELD}"
            ) from None
    return schema


def _check_sample(url: str, index: LineIndex, size: int) -> None:
    """Raise DatasetFormatError naming the line unless each of the first ``SCHEMA_SAMPLE_ROWS``
    rows of ``url`` is one JSON object in UTF-8 (also when its index came from the cache: a
    broken file then fails discovery, not the first read of its first rows)."""
    k = min(SCHEMA_SAMPLE_ROWS, index.num_rows)
    local = fs.default_shard_cache().ensure_local(url, size)
    end = int(index.offsets[k])
    try:
        with _open_decompressed(local, compression_of(url)) as stream:
            sample = _read_exactly(stream, end)
    except OSError as err:  # the index came from the cache: this is the first read of the file
        if fs.is_read_failure(err):
            raise fs.unreadable_file(url, err) from err
        raise
    rows = np.arange(k, dtype=np.int64)
    starts = index.offsets[:k]
    ends = index.offsets[1 : k + 1]
    _check_objects(url, index, sample, starts, ends, rows)
    try:
        table = pajson.read_json(
            pa.BufferReader(_terminated(sample)), read_options=pajson.ReadOptions(block_size=max(1 << 20, end + 1))
        )
    except pa.ArrowInvalid as err:
        _raise_bad_line(url, index, sample, starts, ends, rows, None)
        raise DatasetFormatError(
            f"{url}: cannot parse its first {k} rows ({err}). Check the file's encoding (UTF-8) and line endings."
        ) from err
    if table.num_rows != k:  # two values on one line parse as two rows
        _raise_bad_line(url, index, sample, starts, ends, rows, None)
    _check_utf8(url, index, sample, starts, ends, rows, table)


def _read_exactly(stream: IO[bytes], n: int) -> bytes:
    parts, got = [], 0
    while got < n:
        block = stream.read(n - got)
        if not block:
            break
        parts.append(block)
        got += len(block)
    return b"".join(parts)


def _timestamps_as_strings(t: pa.DataType) -> pa.DataType:
    """pyarrow infers timestamps from date-like strings; keep them strings, as in the JSON."""
    if pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_time(t):
        return pa.string()
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(_timestamps_as_strings(t.field(i).type)) for i in range(t.num_fields)])
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_timestamps_as_strings(t.value_type)))
    return t


# ---------------------------------------------------------------- schema of every line
_ONE_TYPE_PER_FIELD = (
    "A field must have one JSON type on every line of every file of a dataset (null is allowed "
    "anywhere, ints and floats mix and are read as floats, objects may have different keys). Give "
    "the field one type (e.g. always a string), or fix or remove the line."
)


class _TypeConflict(Exception):
    """Two types of the field ``path`` that do not widen into one (internal: the caller turns it
    into a DatasetFormatError naming the line)."""

    def __init__(self, path: str, old: pa.DataType, new: pa.DataType) -> None:
        super().__init__(path, old, new)
        self.path, self.old, self.new = path, old, new


def _merge_types(old: pa.DataType, new: pa.DataType, path: str) -> pa.DataType:
    """The type that holds the values of both ``old`` and ``new``, widened as pyarrow's JSON
    reader widens within a file: null gives way to any type, ints to floats, objects merge their
    fields (new ones last), arrays their items. Raises :class:`_TypeConflict` otherwise.

    Example:
        >>> _merge_types(pa.int64(), pa.float64(), "score")
        DataType(double)
        >>> _merge_types(pa.struct([("a", pa.int64())]), pa.struct([("b", pa.null())]), "meta")
        StructType(struct<a: int64, b: null>)
        >>> try:
        ...     _merge_types(pa.int64(), pa.string(), "id")
        ... except _TypeConflict as conflict:
        ...     print(conflict.path, conflict.old, conflict.new)
        id int64 string
    """
    if old == new:
        return old
    if pa.types.is_null(old):
        return new
    if pa.types.is_null(new):
        return old
    if _is_number(old) and _is_number(new):
        return pa.float64()
    if pa.types.is_struct(old) and pa.types.is_struct(new):
        return pa.struct(_merge_fields(_fields(old), _fields(new), path + "."))
    if pa.types.is_list(old) and pa.types.is_list(new):
        return pa.list_(old.value_field.with_type(_merge_types(old.value_type, new.value_type, path + "[]")))
    raise _TypeConflict(path, old, new)


def _merge_schemas(old: pa.Schema, new: pa.Schema) -> pa.Schema:
    """``old`` widened by ``new`` (see :func:`_merge_types`); fields first seen in ``new`` last."""
    return pa.schema(_merge_fields(list(old), list(new), ""))


def _merge_fields(old: list[pa.Field], new: list[pa.Field], prefix: str) -> list[pa.Field]:
    new_by_name = {f.name: f for f in new}
    merged = [
        f.with_type(_merge_types(f.type, new_by_name[f.name].type, prefix + f.name)) if f.name in new_by_name else f
        for f in old
    ]
    old_names = {f.name for f in old}
    return merged + [f for f in new if f.name not in old_names]


def _fields(struct: pa.StructType) -> list[pa.Field]:
    return [struct.field(i) for i in range(struct.num_fields)]


def _is_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


class _SchemaSoFar:
    """The schema of the rows of one file, widened block by block while :func:`_scan_lines`
    counts its lines.

    Fast path: each block's complete lines go through one ``pyarrow.json.read_json`` (type
    inference, no explicit schema), whose schema is merged into the file's so far. Slow path,
    only when that fails (a line that is not one JSON object, or a field that changes type):
    ``json.loads`` line by line finds the first line whose field conflicts and raises
    DatasetFormatError naming it; lines that do not parse are left out of the schema (the
    reader reports them, with their line numbers, when their rows are read).
    """

    def __init__(self, url: str, seed: pa.Schema | None) -> None:
        self.url = url
        self.schema = pa.schema([])  # of this file's rows
        self._seed = seed if seed is not None else pa.schema([])  # types of the files before it
        self.bad_rows: list[int] = []  # rows left out of the schema, increasing
        self.bad_reasons: list[str] = []  # "line N: why", for the first SHOWN_SKIPPED of them

    def widen(
        self,
        buf: bytes | memoryview,
        starts: np.ndarray,
        ends: np.ndarray,
        rows: np.ndarray,
        line_numbers: Callable[[np.ndarray], np.ndarray],
    ) -> None:
        """Widen by ``rows``, consecutive rows whose bytes are ``buf[starts:ends]`` (each range
        ends with a newline); ``line_numbers(rows)`` gives their physical line numbers."""
        found = None
        if _object_lines(buf, starts, ends).all():  # pyarrow crashes on a leading `null` line
            found = _parsed_schema(
                memoryview(buf)[int(starts[0]) : int(ends[-1])], int((ends - starts).max()), len(rows)
            )
        if found is not None:
            try:
                self._merge(found)
                return
            except _TypeConflict:
                pass  # find the line below
        # Slow path (rare): a line pyarrow cannot parse, or a field that changes type.
        lines_of_rows = line_numbers(rows)
        bad: dict[int, str] = {}  # index into rows -> why its line is left out
        good = self._check_lines(buf, starts, ends, lines_of_rows, bad)
        kept = np.flatnonzero(good)
        try:
            lines = [bytes(buf[s:e]) for s, e in zip(starts[kept].tolist(), ends[kept].tolist())]
            found = _parsed_schema(b"".join(lines), max(map(len, lines)), len(lines)) if lines else None
            if found is not None:
                self._merge(found)
            else:
                # Lines Python's json accepts but pyarrow does not: leave those out too, one by one.
                for i, line in zip(kept.tolist(), lines):
                    found = _parsed_schema(line, len(line), 1)
                    if found is None:
                        bad[i] = _PYARROW_REFUSED
                    else:
                        self._merge(found)
        except _TypeConflict as conflict:  # pyarrow and the line-by-line check disagreed
            raise DatasetFormatError(
                f"{self.url}: lines {lines_of_rows[0]}-{lines_of_rows[-1]}: field "
                f"{conflict.path!r} is {conflict.new} there but {conflict.old} before. {_ONE_TYPE_PER_FIELD}"
            ) from None
        for i in sorted(bad):
            self.bad_rows.append(int(rows[i]))
            if len(self.bad_reasons) < SHOWN_SKIPPED:
                self.bad_reasons.append(f"line {lines_of_rows[i]}: {bad[i]}")

    def _merge(self, found: pa.Schema) -> None:
        schema = _merge_schemas(self.schema, found)
        _merge_schemas(self._seed, schema)  # raises if it conflicts with the files before it
        self.schema = schema

    def _check_lines(
        self,
        buf: bytes | memoryview,
        starts: np.ndarray,
        ends: np.ndarray,
        line_numbers: np.ndarray,
        bad: dict[int, str],
    ) -> np.ndarray:
        """Mask of the lines ``buf[starts:ends]`` (physical ``line_numbers``) that parse to one
        JSON object (``bad[i]`` says why line ``i`` does not); raise DatasetFormatError naming the
        first line whose field has another JSON type than on an earlier line (or in the files
        before it)."""
        kinds: dict[str, tuple[str, str]] = {}  # field path -> (JSON type, where it was seen)
        for f in self.schema:
            _seed_kinds(f.type, f.name, "on an earlier line", kinds)
        for f in self._seed:
            if f.name not in kinds:
                _seed_kinds(f.type, f.name, "in the dataset's files before this one", kinds)
        good = np.zeros(len(starts), dtype=bool)
        for i, (s, e, line) in enumerate(zip(starts.tolist(), ends.tolist(), line_numbers.tolist())):
            try:
                value = json.loads(bytes(buf[s:e]), parse_constant=_reject_constant)
            except ValueError as err:  # not JSON, not UTF-8, or NaN/Infinity: the reader reports it
                bad[i] = _not_json(err)
                continue
            if isinstance(value, dict):
                for name, field_value in value.items():
                    _check_kind(self.url, line, name, field_value, kinds)
                good[i] = True
            else:
                bad[i] = f"a JSON {_json_kind(value)}, not an object"
        return good


def _parsed_schema(buf: bytes | memoryview, longest_line: int, num_lines: int) -> pa.Schema | None:
    """The schema pyarrow infers for the ``num_lines`` JSON objects in ``buf`` (timestamps kept
    as strings), or None if it cannot parse them into that many rows of valid values (pyarrow
    copies the bytes of strings as they are: a string that is not UTF-8 fails the validation,
    ~0.2 ms per MB of strings against ~2 ms per MB to parse)."""
    block = max(1 << 20, longest_line + 1)
    options = pajson.ReadOptions(use_threads=len(buf) > 4 * block, block_size=block)
    try:
        table = pajson.read_json(pa.BufferReader(buf), read_options=options)
        table.validate(full=True)
    except pa.ArrowInvalid:
        return None
    if table.num_rows != num_lines:  # two values on one line parse as two rows
        return None
    return pa.schema([f.with_type(_timestamps_as_strings(f.type)) for f in table.schema])


def _not_json(err: ValueError) -> str:
    """Why ``json.loads`` refused a line, as a message says it."""
    if isinstance(err, json.JSONDecodeError):
        return f"not valid JSON ({err.msg}: column {err.colno})"
    if isinstance(err, UnicodeDecodeError):
        return (
            f"not UTF-8 (byte 0x{err.object[err.start]:02x} at byte {err.start + 1} of the line; JSON Lines files "
            "must be UTF-8: re-encode the file, e.g. iconv -f latin1 -t utf-8)"
        )
    return f"not valid JSON ({err})"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # pyarrow rejects NaN and Infinity


def _kind_of_type(t: pa.DataType) -> str | None:
    """The JSON type of the values of ``t`` (None for ``null``: it agrees with any)."""
    if _is_number(t):
        return "number"
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_struct(t):
        return "object"
    if pa.types.is_list(t):
        return "array"
    return None


def _seed_kinds(t: pa.DataType, path: str, where: str, kinds: dict[str, tuple[str, str]]) -> None:
    """Record the JSON type of field ``path`` (of Arrow type ``t``) and of its nested fields."""
    kind = _kind_of_type(t)
    if kind is None:
        return
    kinds[path] = (kind, where)
    if kind == "object":
        for f in _fields(t):
            _seed_kinds(f.type, f"{path}.{f.name}", where, kinds)
    elif kind == "array":
        _seed_kinds(t.value_type, path + "[]", where, kinds)


def _check_kind(url: str, line: int, path: str, value: Any, kinds: dict[str, tuple[str, str]]) -> None:
    """Raise DatasetFormatError if ``value`` (field ``path`` on ``line``) has another JSON type
    than the field had before; else record it (nested fields too)."""
    kind = _json_kind(value)
    if kind == "null":
        return
    seen = kinds.setdefault(path, (kind, f"on line {line}"))
    if seen[0] != kind:
        raise DatasetFormatError(
            f"{url}:{line}: field {path!r} is {_with_article(kind)} here but {_with_article(seen[0])} "
            f"{seen[1]}. {_ONE_TYPE_PER_FIELD}"
        )
    if kind == "object":
        for name, field_value in value.items():
            _check_kind(url, line, f"{path}.{name}", field_value, kinds)
    elif kind == "array":
        for item in value:
            _check_kind(url, line, path + "[]", item, kinds)


def _with_article(kind: str) -> str:
    return ("an " if kind[0] in "aeiou" else "a ") + kind


# ---------------------------------------------------------------- parsing and errors
def _terminated(buf: bytes | memoryview) -> bytes | memoryview:
    """``buf`` with a final newline (the last line of a file may lack one)."""
    if len(buf) and buf[-1] != 10:
        return bytes(buf) + b"\n"
    return buf


def _check_objects(
    url: str, index: LineIndex, buf: bytes | memoryview, starts: np.ndarray, ends: np.ndarray, rows: np.ndarray
) -> None:
    """Raise unless every row's line starts with ``{`` (after optional whitespace).

    Besides giving a clear error, this guards pyarrow: ``read_json`` crashes the process on a
    buffer that starts with ``null`` and turns a ``null`` line elsewhere into an all-null row.
    """
    for i in np.flatnonzero(~_object_lines(buf, starts, ends)).tolist():
        _raise_bad_line(url, index, buf, starts[i : i + 1], ends[i : i + 1], rows[i : i + 1], None)


def _object_lines(buf: bytes | memoryview, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Mask of the lines ``buf[starts:ends]`` that start with ``{`` (after optional whitespace)."""
    is_object = np.ones(len(starts), dtype=bool)
    if len(starts) == 0:
        return is_object
    arr = np.frombuffer(buf, dtype=np.uint8)
    for i in np.flatnonzero(arr[starts] != _LBRACE).tolist():  # rare: check those in Python
        is_object[i] = bytes(buf[int(starts[i]) : int(ends[i])]).lstrip(_WHITESPACE).startswith(b"{")
    return is_object


_PYARROW_REFUSED = "pyarrow cannot parse it (a number out of range, or a string that is not UTF-8?)"
_FIX_OR_SKIP = (
    "Fix or remove the line, or pass on_bad_record='skip' to Dataset.from_path to leave such lines out "
    "(counted and warned)."
)


def _raise_bad_line(
    url: str,
    index: LineIndex,
    buf: bytes | memoryview,
    starts: np.ndarray,
    ends: np.ndarray,
    rows: np.ndarray,
    schema: pa.Schema | None,
) -> None:
    """Find the first bad row among ``rows`` (their bytes are ``buf[starts:ends]``) and raise.

    Slow path, only after a batch failed: each line goes through ``json.loads`` (and, with a
    ``schema``, through pyarrow alone) to name the line and the reason. Returns if none fails.
    """
    for s, e, r in zip(starts.tolist(), ends.tolist(), rows.tolist()):
        line = bytes(buf[s:e]).strip()
        where = f"{url}:{index.line_no(r)}"
        try:
            value = json.loads(line)
        except ValueError as err:  # not JSON, or not UTF-8
            raise DatasetFormatError(f"{where}: {_not_json(err)}. {_FIX_OR_SKIP}") from err
        if not isinstance(value, dict):
            raise DatasetFormatError(
                f"{where}: is a JSON {_json_kind(value)}, not an object; every line must be one "
                f'object like {{"text": ...}}. {_FIX_OR_SKIP}'
            )
        if schema is not None:
            try:
                pajson.read_json(pa.BufferReader(line + b"\n"), parse_options=_parse_options(schema))
            except pa.ArrowInvalid as err:
                raise DatasetFormatError(
                    f"{where}: does not match the dataset's schema ({err}). The schema {schema} was "
                    "inferred from every line of the dataset's files when it was discovered; fix or "
                    "remove the line (or, if the file changed, rediscover it with Dataset.from_path)."
                ) from err


def _check_utf8(
    url: str,
    index: LineIndex,
    buf: bytes | memoryview,
    starts: np.ndarray,
    ends: np.ndarray,
    rows: np.ndarray,
    table: pa.Table,
) -> None:
    """Raise DatasetFormatError naming the first bad line unless every string in ``table``
    (parsed from ``rows``, one table row per row, bytes ``buf[starts:ends]``) is valid UTF-8.

    pyarrow's JSON parser copies string bytes as they are, so a file in another encoding would
    give ``string`` columns that fail far from the file (a UnicodeDecodeError in ``to_pylist``).
    Fast path: one ``Table.validate(full=True)`` per batch (~0.2 ms per MB of strings on one core,
    against ~2 ms per MB to parse).
    Slow path, only after it failed: the lines whose bytes do not decode are checked one by one
    (invalid bytes in a field outside the schema are harmless: pyarrow skips that field).
    """
    try:
        table.validate(full=True)
        return
    except pa.ArrowInvalid as err:
        invalid = err
    for i, (s, e, r) in enumerate(zip(starts.tolist(), ends.tolist(), rows.tolist())):
        line = bytes(buf[s:e])
        try:
            line.decode("utf-8")
            continue
        except UnicodeDecodeError as err:
            bad = err
        one = table.take(pa.array([i], pa.int64()))  # a copy of this row only: validates just it
        fields = [n for n, col in zip(one.column_names, one.columns) if not _valid(col)]
        if fields:
            raise DatasetFormatError(
                f"{url}:{index.line_no(r)}: field {fields[0]!r} is not valid UTF-8 (byte 0x{line[bad.start]:02x} "
                f"at byte {bad.start + 1} of the line). JSON Lines files must be UTF-8: re-encode the file "
                f"(e.g. iconv -f latin1 -t utf-8). {_FIX_OR_SKIP}"
            ) from bad
    raise DatasetFormatError(
        f"{url}: lines {index.line_no(int(rows[0]))}-{index.line_no(int(rows[-1]))} parse into invalid "
        f"values ({invalid}). Check that the file is UTF-8 JSON Lines."
    ) from invalid


def _valid(column: pa.ChunkedArray) -> bool:
    try:
        column.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}.get(
        type(value), "value"
    )


def _parse_options(schema: pa.Schema) -> pajson.ParseOptions:
    return pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore", newlines_in_values=False)


# ---------------------------------------------------------------- reading
class _OpenFile:
    """One shard's bytes: an open file descriptor, or (compressed) its decompressed content,
    which the reader hands it for the length of a take (``data``) from the process's
    `DecodedCache`."""

    def __init__(self, url: str, local: str, index: LineIndex, compression: Compression) -> None:
        self.url = url
        self.local = local
        self.index = index
        self.compression = compression
        self.rows: np.ndarray | None = None  # the shard's rows (its good lines); None: every line
        self.fd: int | None = None
        self.data: bytes | None = None
        if compression is None:
            try:
                self.fd = os.open(local, os.O_RDONLY)
            except OSError as err:
                error = _read_error(url, err, "cannot open")
                if error is err:
                    raise
                raise error from err

    def decompress(self) -> bytes:
        """The whole decompressed content (a compressed file's only way to its lines)."""
        assert self.compression is not None
        try:
            return _read_decompressed(self.local, self.compression)
        except (EOFError, OSError, ValueError) as err:
            error = _read_error(self.url, err, "cannot decompress")
            if error is err:
                raise
            raise error from err

    def read(self, start: int, end: int) -> bytes | memoryview:
        if self.compression is not None:
            assert self.data is not None, "a compressed file is read within a take, which sets data"
            return memoryview(self.data)[start:end]
        assert self.fd is not None  # one of the two is set in __init__
        out = os.pread(self.fd, end - start, start)
        if len(out) != end - start:
            raise DatasetFormatError(
                f"{self.url}: expected {end - start} bytes at offset {start}, got {len(out)}; the file "
                "shrank since it was indexed. Rediscover the dataset with Dataset.from_path."
            )
        return out

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.data = None


class JsonlReader:
    """Reads rows of a JSON Lines dataset by byte ranges from the line index.

    Contract:
        - ``take(shard_id, rows)`` returns the rows in that order with the dataset's schema
          (or ``columns`` of it). Uncompressed files: only the requested lines are read, each
          run of consecutive rows in one ``pread``, and all of them parsed in one
          ``pyarrow.json.read_json`` call. Compressed files: decompressed whole and kept in the
          process's `DecodedCache` (with every reader's decoded data, within its limit, and this
          reader's within ``decoded_cache_bytes``); open files, as Parquet's, count toward
          `OPEN_FILES`.
        - A malformed line raises DatasetFormatError ``"{path}:{line}: not valid JSON (...)"``;
          a line that is not an object, whose values do not fit the schema, or whose strings
          are not valid UTF-8, names the line too.
        - ``skip_bad_records`` (``on_bad_record="skip"``): the lines the file's index found bad
          (`LineIndex.bad_rows`) are not rows: row ``r`` of the shard is its ``r``-th good line.
        - A file that changed since discovery raises DatasetFormatError (rediscover it).
        - Not thread-safe: one reader per worker.

    Example:
        >>> reader = JsonlReader(Dataset.from_path("chat", "data/chat"))
        >>> reader.take(1, np.array([2, 0])).column("id").to_pylist()  # shard 1, rows 2 and 0
        [6, 4]
    """

    def __init__(
        self,
        dataset: Dataset,
        *,
        columns: Sequence[str] | None = None,
        decoded_cache_bytes: int = DEFAULT_DECODED_CACHE_BYTES,
        max_open_files: int = DEFAULT_MAX_OPEN_FILES,
        shard_cache: fs.ShardCache | None = None,
        skip_bad_records: bool = False,
    ) -> None:
        schema = dataset.schema
        self._skip_bad = skip_bad_records
        # A projection is parsed as the explicit schema: pyarrow then skips the other fields.
        self._schema = project(schema, check_columns(dataset.name, schema, columns))
        self._parse = _parse_options(self._schema)
        self._name = dataset.name
        self._shards = dataset.shards
        self._decoded_bytes = int(decoded_cache_bytes)
        self._max_open = max(1, int(max_open_files))
        self._shard_cache = shard_cache or fs.default_shard_cache()
        self._open: OrderedDict[int, _OpenFile] = OrderedDict()
        self._decoded = decoded_cache()
        self._owner = new_owner()  # this reader's entries there: (owner, shard_id)

    def take(self, shard_id: int, rows: np.ndarray) -> pa.Table:
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) == 0:
            return self._schema.empty_table()
        f = self._file(shard_id)
        if f.compression is not None:
            f.data = self._decoded.get((self._owner, shard_id))
            if f.data is None:
                f.data = f.decompress()
                self._decoded.put((self._owner, shard_id), f.data, len(f.data), owner_limit=self._decoded_bytes)
        try:
            return self._take(f, shard_id, rows)
        finally:
            f.data = None  # the cache holds it (or let it go); an open file holds no content
            if OPEN_FILES.over():  # the process's readers hold too many files: give this one's back
                self.close_files()

    def _take(self, f: _OpenFile, shard_id: int, rows: np.ndarray) -> pa.Table:
        n_rows = len(f.rows) if f.rows is not None else f.index.num_rows
        lo, hi = int(rows.min()), int(rows.max())
        if lo < 0 or hi >= n_rows:
            raise IndexError(
                f"{f.url}: row {lo if lo < 0 else hi} is out of range for shard {shard_id} with {n_rows} rows."
            )
        if f.rows is not None:
            rows = f.rows[rows]  # the good lines (on_bad_record="skip")
        elif len(f.index.bad_rows) and (bad := rows[np.isin(rows, f.index.bad_rows)]).size:
            self._raise_bad_row(f, int(bad[0]))
        diffs = np.diff(rows)
        if bool(np.all(diffs > 0)):
            order, inverse = rows, None
        else:
            # Read each line once, in file order; reorder (and repeat) after parsing.
            order, inverse = np.unique(rows, return_inverse=True)
            diffs = np.diff(order)
        table = self._parse_rows(f, order, diffs)
        if inverse is not None:
            table = table.take(pa.array(inverse.astype(np.int64, copy=False)))
        return table

    def close(self) -> None:
        self.close_files()
        self._decoded.release(self._owner)

    def close_files(self) -> None:
        """Close the open files (their decompressed content stays in the decoded cache)."""
        for f in self._open.values():
            f.close()
        OPEN_FILES.closed(len(self._open))
        self._open.clear()

    # ------------------------------------------------------------ internals
    def _file(self, shard_id: int) -> _OpenFile:
        f = self._open.get(shard_id)
        if f is not None:
            self._open.move_to_end(shard_id)
            return f
        info = shard_info(self._shards, shard_id, dataset=self._name)
        url, size, version = info.file_path(), info.extra.get("size", info.num_bytes), info.extra.get("version", "")
        if fs.is_local(url):
            now = fs.file_info(url)
            if now != (size, version):
                raise DatasetFormatError(
                    f"{info.path}: changed since the dataset was discovered (size/mtime "
                    f"{size}/{version} then, {now[0]}/{now[1]} now). Rediscover it with Dataset.from_path."
                )
        local = self._shard_cache.ensure_local(url, size)
        index = line_index(url, local, size, version)
        good = index.good_rows() if self._skip_bad and len(index.bad_rows) else None
        rows_now = index.num_rows if good is None else len(good)
        if rows_now != info.num_rows:
            raise DatasetFormatError(
                f"{info.path}: has {rows_now} rows now, {info.num_rows} at discovery; it changed "
                "since the dataset was discovered. Rediscover it with Dataset.from_path."
            )
        f = _OpenFile(url, local, index, info.extra.get("compression", compression_of(url)))
        f.rows = good
        self._open[shard_id] = f
        OPEN_FILES.opened()
        while len(self._open) > self._max_open:
            _, old = self._open.popitem(last=False)
            old.close()
            OPEN_FILES.closed()
        return f

    def _raise_bad_row(self, f: _OpenFile, row: int) -> None:
        """Raise naming ``row``, a line the file's index found bad (whatever the columns read:
        a line is a row or not the same way under every projection and policy)."""
        line = _terminated(f.read(int(f.index.offsets[row]), int(f.index.offsets[row + 1])))
        _raise_bad_line(f.url, f.index, line, np.zeros(1, np.int64), np.array([len(line)]), np.array([row]), None)
        raise DatasetFormatError(f"{f.url}:{f.index.line_no(row)}: {_PYARROW_REFUSED}. {_FIX_OR_SKIP}")

    def _parse_rows(self, f: _OpenFile, rows: np.ndarray, diffs: np.ndarray) -> pa.Table:
        """Parse the distinct, increasing ``rows`` of ``f`` in one pyarrow call."""
        offsets = f.index.offsets
        row_starts, row_ends = offsets[rows], offsets[rows + 1]
        # Coalesce runs of consecutive rows into one read each.
        cut = np.flatnonzero(diffs != 1) + 1
        first = np.concatenate(([0], cut))
        last = np.concatenate((cut, [len(rows)])) - 1
        pieces = [f.read(int(a), int(b)) for a, b in zip(row_starts[first].tolist(), row_ends[last].tolist())]
        if len(pieces[-1]) and pieces[-1][-1] != 10:  # the file's last line may lack a newline
            pieces[-1] = _terminated(pieces[-1])
        buf = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        # Where each row sits inside `buf`.
        piece_len = np.array([len(p) for p in pieces], dtype=np.int64)
        piece_base = np.cumsum(piece_len) - piece_len
        run_of = np.repeat(np.arange(len(pieces)), last - first + 1)
        starts = row_starts - row_starts[first][run_of] + piece_base[run_of]
        ends = starts + (row_ends - row_starts)
        _check_objects(f.url, f.index, buf, starts, ends, rows)
        longest = int((ends - starts).max())
        block = max(1 << 20, longest + 1)
        options = pajson.ReadOptions(use_threads=len(buf) > 4 * block, block_size=block)
        try:
            table = pajson.read_json(pa.BufferReader(buf), read_options=options, parse_options=self._parse)
        except pa.ArrowInvalid as err:
            _raise_bad_line(f.url, f.index, buf, starts, ends, rows, self._schema)
            raise DatasetFormatError(
                f"{f.url}: lines {f.index.line_no(int(rows[0]))}-{f.index.line_no(int(rows[-1]))} "
                f"cannot be parsed ({err}). Check the file's encoding (UTF-8) and line endings."
            ) from err
        if table.num_rows != len(rows):
            # Two values on one line parse as two rows; find and name that line.
            _raise_bad_line(f.url, f.index, buf, starts, ends, rows, self._schema)
            raise DatasetFormatError(
                f"{f.url}: lines {f.index.line_no(int(rows[0]))}-{f.index.line_no(int(rows[-1]))} gave "
                f"{table.num_rows} rows for {len(rows)} lines. Put exactly one JSON object on each line."
            )
        _check_utf8(f.url, f.index, buf, starts, ends, rows, table)
        return table
