"""The JSON Lines reader: rows of a dataset by byte ranges from each file's line index.

Contract: :class:`JsonlReader` (its docstring has the details) returns rows in the order asked,
with the dataset's schema imposed on every read; its open files count toward the process's
`OPEN_FILES` and compressed files' decompressed content lives in the process's `DecodedCache`.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson

from zephon_columnar.errors import DatasetFormatError
from zephon_columnar.io import fs
from zephon_columnar.io.base import check_columns, project, shard_info
from zephon_columnar.io.decoded import decoded_cache, new_owner
from zephon_columnar.io.jsonl.bad_lines import _FIX_OR_SKIP, _check_objects, _check_utf8, _raise_bad_line
from zephon_columnar.io.jsonl.compression import Compression, _read_decompressed, _read_error, compression_of
from zephon_columnar.io.jsonl.index import LineIndex
from zephon_columnar.io.jsonl.index_cache import line_index
from zephon_columnar.io.jsonl.lines import _PYARROW_REFUSED, _parse_options, _terminated
from zephon_columnar.io.open_files import OPEN_FILES

if TYPE_CHECKING:
    from zephon_columnar.io.dataset import Dataset


DEFAULT_DECODED_CACHE_BYTES = 512 << 20  # decompressed .gz/.zst files kept per reader


DEFAULT_MAX_OPEN_FILES = 16


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
