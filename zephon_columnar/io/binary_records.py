"""Offset-indexed binary shards of sample records, the layout MDS and LitData chunks share, read
column by column into Arrow without a Python object per value.

A shard file starts with a little-endian uint32 record count ``N`` and ``N + 1`` uint32 absolute
offsets; record ``i`` is the bytes ``[offsets[i], offsets[i + 1])``. A record holds its columns
back to back, after a header of uint32 byte sizes for the columns whose size varies (MDS: the
variable-size ones; LitData: all of them). `RecordFile` memory-maps a shard and finds, for the
rows asked, each column's byte spans; `binary_column`, `scalar_column` and `list_column` turn
spans into Arrow arrays with one copy of the bytes (Python touches each row's span, never each
token).

Example:
    >>> import struct
    >>> records = struct.pack("<I", 2) + b"hi" + struct.pack("<q", 7) + struct.pack("<I", 0) + struct.pack("<q", 9)
    >>> _ = open("two.bin", "wb").write(struct.pack("<4I", 2, 16, 30, 42) + records)
    >>> shard = RecordFile("two.bin", "two.bin")
    >>> layout = RecordLayout(sizes=(None, 8), prefixed=(True, False))
    >>> (text, number) = shard.spans(np.array([1, 0]), layout)
    >>> binary_column(shard, text, pa.string(), "two.bin: text").to_pylist()
    ['', 'hi']
    >>> scalar_column(shard, number, np.dtype("<i8")).tolist()
    [9, 7]
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import zstandard

from zephon_columnar.errors import DatasetFormatError
from zephon_columnar.io import fs

INDEX = "index.json"  # the file that lists an MDS or LitData folder's shards


def read_index(url: str, *, kind: str) -> dict[str, Any]:
    """The parsed ``index.json`` at ``url`` (``kind`` names the format in errors)."""
    try:
        value = json.loads(fs.read_bytes(url))
    except (ValueError, UnicodeDecodeError) as err:
        raise DatasetFormatError(f"{url}: the {kind} index is not readable JSON ({err}); is it cut short?") from err
    if not isinstance(value, dict):
        raise DatasetFormatError(f"{url}: the {kind} index is not a JSON object.")
    return value


def unzstd(packed: bytes, size: int | None = None) -> bytes:
    """The first zstd frame of ``packed``, decompressed in one call into one buffer of the size
    its header states, or of ``size`` (what an index says) when it states none; grown as it goes
    only when neither is known (a third slower on 30 MB shards: the output is copied as it grows).

    Example:
        >>> unzstd(zstandard.ZstdCompressor(write_content_size=False).compress(b"ids" * 4), size=12)
        b'idsidsidsids'
    """
    inflate = zstandard.ZstdDecompressor()
    if zstandard.frame_content_size(packed) >= 0 or size:
        return inflate.decompress(packed, max_output_size=size or 0)
    return inflate.decompressobj().decompress(packed)


def unpacked_copy(url: str, local: str, unpack: Callable[[bytes], bytes], *, size: int | None = None) -> str:
    """A local file with ``unpack(bytes of local)`` (a compressed shard's plain bytes), made once
    in the shard cache and found there after (keyed by ``url`` and the packed or, when known, the
    unpacked ``size``; within the cache's ``limit_bytes``, evicted like a download and made again
    when next needed); a shard that does not unpack, or not to ``size`` bytes, is named."""

    def unpacked() -> bytes:
        with open(local, "rb") as f:
            packed = f.read()
        try:
            plain = unpack(packed)
        except (zstandard.ZstdError, OSError, EOFError, ValueError, IndexError, struct.error) as err:
            if isinstance(err, DatasetFormatError):
                raise
            raise DatasetFormatError(f"{url} cannot be decompressed ({err}); is it cut short?") from err
        if size is not None and len(plain) != size:
            raise DatasetFormatError(
                f"{url} decompresses to {len(plain)} bytes where its index says {size}; is it cut short?"
            )
        return plain

    key_size = size if size is not None else os.path.getsize(local)
    return fs.default_shard_cache().derived(f"{url}#unpacked", key_size, unpacked, made_size=size)


def gather_spans(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The bytes ``data[starts[k] : starts[k] + lengths[k]]`` of every k joined into one uint8
    array, and the int64 offsets of each part in it (``len(starts) + 1`` of them).

    Example:
        >>> joined, offsets = gather_spans(np.frombuffer(b"abcdef", np.uint8), np.array([4, 0]), np.array([2, 3]))
        >>> joined.tobytes(), offsets.tolist()
        (b'efabc', [0, 2, 5])
    """
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    joined = np.empty(int(offsets[-1]), np.uint8)
    source, target = data.data, joined.data  # memoryviews
    # A copy a span, each slice freed before the next: a list of a chunk's slices (as
    # b"".join takes) is a thousand live GC-tracked objects, enough to set off the garbage
    # collector in the training process every chunk, and its first full pass over torch's
    # objects (~0.1 s) inside the loader's first epoch.
    for start, length, at in zip(starts.tolist(), lengths.tolist(), offsets.tolist()):
        target[at : at + length] = source[start : start + length]
    return joined, offsets


@dataclass(frozen=True, kw_only=True)
class RecordLayout:
    """How a record's columns are laid out: ``sizes[k]`` the fixed byte size of column ``k``
    (None: it varies), ``prefixed[k]`` whether the record header holds column ``k``'s size. A
    column with neither is the rest of the record (LitData's token arrays)."""

    sizes: tuple[int | None, ...]
    prefixed: tuple[bool, ...]


@dataclass(frozen=True)
class Spans:
    """Where one column's value sits in each asked row: absolute byte ``starts`` and ``lengths``."""

    starts: np.ndarray
    lengths: np.ndarray


class RecordFile:
    """One shard, memory-mapped; ``url`` names it in errors. ``first`` is where its count and
    offsets start (0 for MDS and LitData chunks)."""

    def __init__(self, url: str, local: str, *, rows: int | None = None, first: int = 0) -> None:
        self.url = url
        size = os.path.getsize(local)
        with open(local, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        self.data = np.frombuffer(self._map, dtype=np.uint8) if self._map is not None else np.zeros(0, np.uint8)
        if size < first + 4:
            raise DatasetFormatError(f"{url} is cut short: {size} bytes, not even a record count.")
        count = int(self.data[first : first + 4].view("<u4")[0])
        if rows is not None and count != rows:
            raise DatasetFormatError(f"{url} holds {count} records where its index says {rows}; is it the right file?")
        if size < first + 4 * (count + 2):
            raise DatasetFormatError(f"{url} is cut short: its {count + 1} record offsets end past its {size} bytes.")
        self.offsets = self.data[first + 4 : first + 4 * (count + 2)].view("<u4").astype(np.int64)
        self.rows = count
        if count and (self.offsets[-1] > size or np.any(np.diff(self.offsets) < 0)):
            raise DatasetFormatError(
                f"{url} is cut short or corrupt: its records end at byte {int(self.offsets[-1])} of {size}."
            )

    def spans(self, rows: np.ndarray, layout: RecordLayout) -> list[Spans]:
        """Each column's byte spans in the records ``rows`` (in that order)."""
        if len(rows) and (int(rows.min()) < 0 or int(rows.max()) >= self.rows):
            raise DatasetFormatError(f"{self.url}: rows {rows.tolist()[:5]}... are outside its {self.rows} records.")
        begins, ends = self.offsets[rows], self.offsets[rows + 1]
        prefixed = sum(layout.prefixed)
        header = (
            self.data[(begins[:, None] + np.arange(4 * prefixed)).ravel()].view("<u4").reshape(len(rows), prefixed)
            if prefixed
            else np.zeros((len(rows), 0), np.uint32)
        ).astype(np.int64)
        at = begins + 4 * prefixed
        out, k = [], 0
        for size, in_header in zip(layout.sizes, layout.prefixed):
            if in_header:
                lengths = header[:, k]
                k += 1
            elif size is not None:
                lengths = np.full(len(rows), size, np.int64)
            else:  # neither a fixed size nor one in the header: the rest of the record
                lengths = ends - at
            out.append(Spans(at, lengths))
            at = at + lengths
        if len(rows) and np.any(at > ends):
            bad = int(rows[np.flatnonzero(at > ends)[0]])
            raise DatasetFormatError(f"{self.url}: record {bad} is corrupt: its columns run past its end.")
        return out

    def gather(self, spans: Spans) -> tuple[np.ndarray, np.ndarray]:
        """The spans' bytes joined (uint8), and the int64 offsets of each row's part in them."""
        return gather_spans(self.data, spans.starts, spans.lengths)

    def close(self) -> None:
        self.data = np.zeros(0, np.uint8)
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # arrays still viewing the map keep it alive
                pass
            self._map = None


def binary_column(shard: RecordFile, spans: Spans, type_: pa.DataType, where: str) -> pa.Array:
    """The spans as a binary or string array (UTF-8 checked; ``where`` names the column)."""
    joined, offsets = shard.gather(spans)
    large = offsets[-1] >= 2**31
    kind = (pa.large_string() if large else pa.string()) if pa.types.is_string(type_) else pa.binary()
    buffers = [None, pa.py_buffer(offsets.astype(np.int64 if large else np.int32)), pa.py_buffer(joined)]
    array = pa.Array.from_buffers(pa.large_binary() if large else pa.binary(), len(spans.lengths), buffers)
    if pa.types.is_string(type_):
        try:
            array = array.cast(kind)
        except pa.ArrowInvalid as err:
            raise DatasetFormatError(f"{where} holds bytes that are not UTF-8 text ({err}).") from err
    return array.cast(type_) if large else array


def scalar_column(shard: RecordFile, spans: Spans, dtype: np.dtype) -> np.ndarray:
    """Fixed-size spans of ``dtype.itemsize`` bytes each, as one numpy array of ``dtype``."""
    positions = spans.starts[:, None] + np.arange(dtype.itemsize)
    column: np.ndarray = shard.data[positions.ravel()].view(dtype).copy()
    return column


def list_column(shard: RecordFile, spans: Spans, dtype: np.dtype, where: str) -> pa.Array:
    """Each span as a list of ``dtype`` values (1-D arrays stored as raw bytes)."""
    if np.any(spans.lengths % dtype.itemsize):
        raise DatasetFormatError(
            f"{where}: a value's {dtype} array is not a whole number of {dtype.itemsize}-byte items."
        )
    joined, offsets = shard.gather(spans)
    values = joined.view(dtype)
    counts = offsets // dtype.itemsize
    index = pa.array(counts.astype(np.int32) if counts[-1] < 2**31 else counts)
    array_type = pa.list_(pa.from_numpy_dtype(dtype.newbyteorder("=")))
    if counts[-1] >= 2**31:
        array_type = pa.large_list(array_type.value_type)
        return pa.LargeListArray.from_arrays(index, pa.array(values), type=array_type)
    return pa.ListArray.from_arrays(index, pa.array(values), type=array_type)
