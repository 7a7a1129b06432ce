"""JSON Lines: shard discovery from a cached line index, and a batch-parsing reader.

Files: ``*.jsonl``, ``*.jsonl.gz``, ``*.jsonl.zst`` (and ``*.json`` / ``*.ndjson`` holding JSON
Lines, with the same compressions), in UTF-8. Every non-blank line must be one JSON object; it is
one row.

Discovery never parses JSON, except ~1000 lines to infer the schema: it counts newlines in
big binary blocks and keeps the byte offset of every row (a :class:`LineIndex`), cached on disk
under ``cache_root()/jsonl_index`` keyed by the file's identity, size and modification time, so
a second discovery of an unchanged file reads the index instead of the file.

Blank lines (empty or only spaces, tabs, ``\\r``) are skipped anywhere in a file, as pyarrow,
pandas and Hugging Face ``datasets`` do; they are not rows, but error messages still give the
physical 1-based line number.

The schema is inferred once per dataset from the first ~1000 rows of its first non-empty file
and then imposed on every read (``pyarrow.json.read_json`` with an explicit schema): a field
missing in a row is null, a field not in the schema is ignored, and strings that look like
timestamps stay strings (a JSON string is a ``str`` in Zephon's payload). A field that is null in
every sampled row is typed ``null``, so a later non-null value is an error naming the line.

Example:
    >>> ds = discover_jsonl("chat", "data/chat", ["data/chat/a.jsonl.zst"])  # doctest: +SKIP
    >>> JsonlReader(ds).take(0, np.array([3, 1])).to_pylist()  # doctest: +SKIP
    [{'text': 'fourth'}, {'text': 'second'}]
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Any, Literal, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson

from zephon_columnar.errors import DatasetFormatError
from zephon_columnar.io import fs
from zephon_columnar.io.base import ShardInfo, check_columns, project, shard_info
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
    """Byte offsets of the rows of one (decompressed) JSON Lines file.

    ``offsets`` has ``num_rows + 1`` entries: row ``r`` is the bytes ``[offsets[r],
    offsets[r+1])`` (its line, its newline, and any blank lines after it); the last entry is
    the decompressed size. ``blank_before[i]`` is the row that follows the i-th blank line
    (``num_rows`` for trailing ones), which maps rows back to physical line numbers.
    """

    offsets: np.ndarray
    blank_before: np.ndarray

    @property
    def num_rows(self) -> int:
        return len(self.offsets) - 1

    def line_no(self, row: int) -> int:
        """1-based physical line number of ``row``."""
        return int(row) + 1 + int(np.searchsorted(self.blank_before, row, side="right"))

    @property
    def nbytes(self) -> int:
        return self.offsets.nbytes + self.blank_before.nbytes


def _scan_lines(stream: IO[bytes]) -> LineIndex:
    """Build a :class:`LineIndex` by counting newlines in big blocks (no JSON parsing)."""
    row_starts: list[np.ndarray] = []
    blanks: list[np.ndarray] = []
    carry = b""  # the unfinished last line of the previous block
    base = 0  # file offset of carry[0]
    rows = 0
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
        rows += int(keep.sum())
        end = int(nl[-1]) + 1
        carry = buf[end:]
        base += end
    if carry:  # a last line without a trailing newline
        if carry.strip(_WHITESPACE):
            row_starts.append(np.array([base], dtype=np.int64))
            rows += 1
        else:
            blanks.append(np.array([rows], dtype=np.int64))
    total = base + len(carry)
    offsets = np.concatenate(row_starts + [np.array([total], dtype=np.int64)]).astype(np.int64, copy=False)
    blank_before = np.concatenate(blanks).astype(np.int64) if blanks else np.zeros(0, dtype=np.int64)
    return LineIndex(offsets=offsets, blank_before=blank_before)


def _blank_lines(buf: bytes, arr: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Mask of blank lines (empty, or only spaces/tabs/CR) among lines ``[starts, starts+lengths)``."""
    blank = lengths == 0
    nonempty = np.flatnonzero(~blank)
    first = arr[starts[nonempty]]
    # Only a line that starts with whitespace can be blank; that is rare, so check those in Python.
    maybe = nonempty[(first == 32) | (first == 9) | (first == 13)]
    for i in maybe.tolist():
        s = int(starts[i])
        if not buf[s:s + int(lengths[i])].strip(_WHITESPACE):
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

    def get(self, key: str, open_stream: Any) -> LineIndex:
        """The index for ``key``; ``open_stream()`` gives the decompressed bytes to scan on a miss."""
        with self._lock:
            hit = self._mem.get(key)
            if hit is not None:
                self._mem.move_to_end(key)
                return hit
        path = self._disk_path(key)
        index = _load_index(path)
        if index is None:
            with open_stream() as stream:
                index = _scan_lines(stream)
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
            np.savez(out, offsets=index.offsets, blank_before=index.blank_before)
            fs.atomic_write(path, out.getbuffer())
        except OSError as err:
            if not self._warned:
                self._warned = True
                log.warning("JSONL line index cache %s is not writable (%s); keeping indexes in "
                            "memory only. Set ZEPHON_COLUMNAR_CACHE to a writable folder.",
                            os.path.dirname(path), err)


def _load_index(path: str) -> LineIndex | None:
    try:
        with np.load(path) as z:
            offsets, blank = z["offsets"], z["blank_before"]
    except (OSError, KeyError, ValueError):
        return None  # absent or unreadable: rebuild (and rewrite) it
    if offsets.ndim != 1 or len(offsets) == 0 or offsets.dtype != np.int64:
        return None
    return LineIndex(offsets=offsets, blank_before=blank.astype(np.int64, copy=False))


INDEX_CACHE = _IndexCache()


def _index_key(url: str, size: int, version: str) -> str:
    return f"{fs.canonical(url)}\0{size}\0{version}"


def _open_decompressed(local: str, compression: Compression) -> IO[bytes]:
    """A binary stream of the decompressed content of the local file ``local``."""
    if compression == "gzip":
        return gzip.open(local, "rb")
    raw = open(local, "rb")
    if compression == "zstd":
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True, closefd=True)
    return raw


def _read_decompressed(local: str, compression: Compression) -> bytes:
    """The whole decompressed content of ``local``."""
    with _open_decompressed(local, compression) as stream:
        return stream.read()


def line_index(url: str, local: str, size: int, version: str) -> LineIndex:
    """The :class:`LineIndex` of ``url`` (whose bytes are at the local path ``local``).

    Cached in memory and on disk by ``(url, size, version)``: a rewritten file gets a new index.
    A truncated or corrupt ``.gz``/``.zst`` file is a DatasetFormatError naming it; a file the OS
    cannot read (permissions, I/O error) an :class:`~zephon_columnar.io.fs.UnreadableFileError`.
    """
    comp = compression_of(url)
    try:
        return INDEX_CACHE.get(_index_key(url, size, version), lambda: _open_decompressed(local, comp))
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
    return DatasetFormatError(f"{url}: {what} ({type(err).__name__}: {err}). The file is truncated or corrupt; "
                              "re-write it or remove it from the dataset directory.")


# ---------------------------------------------------------------- discovery
def discover_jsonl(name: str, root: str, files: Sequence[str]) -> Dataset:
    """A :class:`Dataset` over JSON Lines ``files`` (shard ids in the given order).

    Counts rows from each file's (cached) line index and infers the schema from the first
    ~1000 rows of the first non-empty file. Remote files are downloaded once into the shard
    cache (counting lines needs every byte; the reader needs the copy anyway).

    Example:
        >>> discover_jsonl("chat", "/data/chat", ["/data/chat/a.jsonl"]).total()  # doctest: +SKIP
        1000
    """
    files = list(files)

    def one(url: str) -> tuple[LineIndex, ShardInfo]:
        size, version = fs.file_info(url)
        local = fs.default_shard_cache().ensure_local(url, size)
        index = line_index(url, local, size, version)
        extra = {"compression": compression_of(url), "size": size, "version": version}
        return index, ShardInfo(shard_id=0, path=url, num_rows=index.num_rows, num_bytes=size, extra=extra)

    if len(files) > 1:
        with ThreadPoolExecutor(max_workers=min(8, len(files))) as pool:
            found = list(pool.map(one, files))
    else:
        found = [one(f) for f in files]
    shards = tuple(ShardInfo(shard_id=i, path=info.path, num_rows=info.num_rows, num_bytes=info.num_bytes,
                             extra=info.extra) for i, (_, info) in enumerate(found))
    first = next((i for i, s in enumerate(shards) if s.num_rows > 0), None)
    schema = pa.schema([]) if first is None else _infer_schema(files[first], found[first][0], shards[first].num_bytes)
    return Dataset(name=name, backend={"kind": "jsonl", "path": root, "schema": schema},
                   path=root, shards=shards)


def _infer_schema(url: str, index: LineIndex, size: int) -> pa.Schema:
    """The schema of the first ``SCHEMA_SAMPLE_ROWS`` rows of ``url`` (timestamps kept as strings)."""
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
    ends = index.offsets[1:k + 1]
    _check_objects(url, index, sample, starts, ends, rows)
    try:
        table = pajson.read_json(pa.BufferReader(_terminated(sample)),
                                 read_options=pajson.ReadOptions(block_size=max(1 << 20, end + 1)))
    except pa.ArrowInvalid as err:
        _raise_bad_line(url, index, sample, starts, ends, rows, None)
        raise DatasetFormatError(
            f"{url}: cannot infer one schema from its first {k} rows ({err}). Give every field one "
            "JSON type across lines (e.g. always a number, or always a string)."
        ) from err
    if table.num_rows != k:  # two values on one line parse as two rows
        _raise_bad_line(url, index, sample, starts, ends, rows, None)
    _check_utf8(url, index, sample, starts, ends, rows, table)
    return pa.schema([f.with_type(_timestamps_as_strings(f.type)) for f in table.schema])


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


# ---------------------------------------------------------------- parsing and errors
def _terminated(buf: bytes | memoryview) -> bytes | memoryview:
    """``buf`` with a final newline (the last line of a file may lack one)."""
    if len(buf) and buf[-1] != 10:
        return bytes(buf) + b"\n"
    return buf


def _check_objects(url: str, index: LineIndex, buf: bytes, starts: np.ndarray, ends: np.ndarray,
                   rows: np.ndarray) -> None:
    """Raise unless every row's line starts with ``{`` (after optional whitespace).

    Besides giving a clear error, this guards pyarrow: ``read_json`` crashes the process on a
    buffer that starts with ``null`` and turns a ``null`` line elsewhere into an all-null row.
    """
    if len(starts) == 0:
        return
    arr = np.frombuffer(buf, dtype=np.uint8)
    odd = np.flatnonzero(arr[starts] != _LBRACE)
    for i in odd.tolist():
        line = buf[int(starts[i]):int(ends[i])]
        if not bytes(line).lstrip(_WHITESPACE).startswith(b"{"):
            _raise_bad_line(url, index, buf, starts[i:i + 1], ends[i:i + 1], rows[i:i + 1], None)


def _raise_bad_line(url: str, index: LineIndex, buf: bytes | memoryview, starts: np.ndarray,
                    ends: np.ndarray, rows: np.ndarray, schema: pa.Schema | None) -> None:
    """Find the first bad row among ``rows`` (their bytes are ``buf[starts:ends]``) and raise.

    Slow path, only after a batch failed: each line goes through ``json.loads`` (and, with a
    ``schema``, through pyarrow alone) to name the line and the reason. Returns if none fails.
    """
    for s, e, r in zip(starts.tolist(), ends.tolist(), rows.tolist()):
        line = bytes(buf[s:e]).strip()
        where = f"{url}:{index.line_no(r)}"
        try:
            value = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            reason = f"{err.msg}: column {err.colno}" if isinstance(err, json.JSONDecodeError) else str(err)
            raise DatasetFormatError(f"{where}: not valid JSON ({reason}). Fix or remove the line.") from err
        if not isinstance(value, dict):
            raise DatasetFormatError(
                f"{where}: is a JSON {_json_kind(value)}, not an object; every line must be one "
                'object like {"text": ...}. Fix or remove the line.'
            )
        if schema is not None:
            try:
                pajson.read_json(pa.BufferReader(line + b"\n"), parse_options=_parse_options(schema))
            except pa.ArrowInvalid as err:
                raise DatasetFormatError(
                    f"{where}: does not match the dataset's schema ({err}). The schema {schema} was "
                    f"inferred from the first {SCHEMA_SAMPLE_ROWS} rows of the first file; give each "
                    "field the same JSON type on every line (a field null in all sampled rows is "
                    "typed null), or fix or remove the line."
                ) from err


def _check_utf8(url: str, index: LineIndex, buf: bytes | memoryview, starts: np.ndarray, ends: np.ndarray,
                rows: np.ndarray, table: pa.Table) -> None:
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
                "(e.g. iconv -f latin1 -t utf-8), or fix or remove the line."
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
    return {list: "array", str: "string", bool: "boolean", int: "number", float: "number"}.get(type(value), "value")


def _parse_options(schema: pa.Schema) -> pajson.ParseOptions:
    return pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore",
                               newlines_in_values=False)


# ---------------------------------------------------------------- reading
class _OpenFile:
    """One shard's bytes: an open file descriptor, or the whole decompressed content."""

    def __init__(self, url: str, local: str, index: LineIndex, compression: Compression) -> None:
        self.url = url
        self.index = index
        self.fd: int | None = None
        self.data: bytes | None = None
        try:
            if compression is None:
                self.fd = os.open(local, os.O_RDONLY)
            else:
                self.data = _read_decompressed(local, compression)
        except (EOFError, OSError, ValueError) as err:
            error = _read_error(url, err, "cannot decompress")
            if error is err:
                raise
            raise error from err

    @property
    def held_bytes(self) -> int:
        return len(self.data) if self.data is not None else 0

    def read(self, start: int, end: int) -> bytes | memoryview:
        if self.data is not None:
            return memoryview(self.data)[start:end]
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
          ``pyarrow.json.read_json`` call. Compressed files: decompressed once per reader and
          kept in an LRU bounded by ``decoded_cache_bytes`` (at least one file).
        - A malformed line raises DatasetFormatError ``"{path}:{line}: not valid JSON (...)"``;
          a line that is not an object, whose values do not fit the schema, or whose strings
          are not valid UTF-8, names the line too.
        - A file that changed since discovery raises DatasetFormatError (rediscover it).
        - Not thread-safe: one reader per worker.

    Example:
        >>> reader = JsonlReader(Dataset.from_path("chat", "data/chat"))  # doctest: +SKIP
        >>> reader.take(0, np.arange(100, 164)).num_rows  # doctest: +SKIP
        64
    """

    def __init__(
        self,
        dataset: Dataset,
        *,
        columns: Sequence[str] | None = None,
        decoded_cache_bytes: int = DEFAULT_DECODED_CACHE_BYTES,
        max_open_files: int = DEFAULT_MAX_OPEN_FILES,
        shard_cache: fs.ShardCache | None = None,
    ) -> None:
        schema: pa.Schema = dataset.backend["schema"]
        # A projection is parsed as the explicit schema: pyarrow then skips the other fields.
        self._schema = project(schema, check_columns(dataset.name, schema, columns))
        self._parse = _parse_options(self._schema)
        self._name = dataset.name
        self._shards = dataset.shards
        self._decoded_bytes = int(decoded_cache_bytes)
        self._max_open = max(1, int(max_open_files))
        self._shard_cache = shard_cache or fs.default_shard_cache()
        self._open: OrderedDict[int, _OpenFile] = OrderedDict()

    def take(self, shard_id: int, rows: np.ndarray) -> pa.Table:
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) == 0:
            return self._schema.empty_table()
        f = self._file(shard_id)
        n_rows = f.index.num_rows
        lo, hi = int(rows.min()), int(rows.max())
        if lo < 0 or hi >= n_rows:
            raise IndexError(f"{f.url}: row {lo if lo < 0 else hi} is out of range for shard "
                             f"{shard_id} with {n_rows} rows.")
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
        for f in self._open.values():
            f.close()
        self._open.clear()

    # ------------------------------------------------------------ internals
    def _file(self, shard_id: int) -> _OpenFile:
        f = self._open.get(shard_id)
        if f is not None:
            self._open.move_to_end(shard_id)
            return f
        info = shard_info(self._shards, shard_id, dataset=self._name)
        size, version = info.extra.get("size", info.num_bytes), info.extra.get("version", "")
        if fs.is_local(info.path):
            now = fs.file_info(info.path)
            if now != (size, version):
                raise DatasetFormatError(
                    f"{info.path}: changed since the dataset was discovered (size/mtime "
                    f"{size}/{version} then, {now[0]}/{now[1]} now). Rediscover it with Dataset.from_path."
                )
        local = self._shard_cache.ensure_local(info.path, size)
        index = line_index(info.path, local, size, version)
        if index.num_rows != info.num_rows:
            raise DatasetFormatError(
                f"{info.path}: has {index.num_rows} rows now, {info.num_rows} at discovery; it changed "
                "since the dataset was discovered. Rediscover it with Dataset.from_path."
            )
        f = _OpenFile(info.path, local, index, info.extra.get("compression", compression_of(info.path)))
        self._open[shard_id] = f
        held = sum(o.held_bytes for o in self._open.values())
        while len(self._open) > 1 and (len(self._open) > self._max_open or held > self._decoded_bytes):
            _, old = self._open.popitem(last=False)
            held -= old.held_bytes
            old.close()
        return f

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
