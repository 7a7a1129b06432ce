"""MosaicML Streaming (MDS) datasets: a folder with ``index.json`` and ``shard.NNNNN.mds``
files (``.mds.zstd`` when compressed), read in place without the ``streaming`` library.

``index.json`` lists the shards with their sample counts and the columns (names, encodings,
fixed sizes), so discovery reads that file only. A shard is an offset-indexed file of records
(`zephon_columnar.io.binary_records`); a reader memory-maps it and takes any rows by index
(random access, so ``to_indexable_torch_dataset`` works over MDS too). A compressed shard
(``zstd``, ``gz``, ``bz2``) is decompressed once into the shard cache; remote shards are
downloaded once first.

Columns by MDS encoding: ``str`` and ``json`` (the JSON text) -> string, ``bytes`` -> binary,
``int``/``int8``..``uint64``/``float16``..``float64`` -> that number type, ``str_int`` -> int64,
``str_float`` -> float64, ``str_decimal`` -> string (the decimal's text), ``ndarray[:dtype]``
holding 1-D arrays -> a list of the dtype (pre-tokenized ids: ``pack_flat(tokens_field=
"tokens")``; an ``ndarray`` without a dtype takes the first sample's), ``pil``/``jpeg``/``png``
and the image lists -> binary (their stored bytes). ``pkl`` columns are refused: a pickle runs
code when it is read, and a data loader never unpickles its data.

Example:
    >>> MDS.column_type("ndarray:int32", where="x"), MDS.column_type("str_int", where="x")
    (ListType(list<item: int32>), DataType(int64))
"""

from __future__ import annotations

import bz2
import gzip
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from zephon_columnar.errors import DatasetFormatError
from zephon_columnar.io import fs
from zephon_columnar.io.base import ShardInfo, ShardReader, check_columns, project, shard_info
from zephon_columnar.io.binary_records import (
    INDEX,
    RecordFile,
    RecordLayout,
    Spans,
    binary_column,
    list_column,
    read_index,
    scalar_column,
    unpacked_copy,
    unzstd,
)
from zephon_columnar.io.format import Discovered, FileFormat

if TYPE_CHECKING:
    from zephon_columnar.io.dataset import Dataset

_NUMBERS = {
    name: np.dtype(f"<{code}")
    for name, code in {
        "int8": "i1", "uint8": "u1", "int16": "i2", "uint16": "u2", "int32": "i4", "uint32": "u4",
        "int64": "i8", "uint64": "u8", "float16": "f2", "float32": "f4", "float64": "f8", "int": "i8",
    }.items()
}  # fmt: skip
_ARRAY_DTYPES = {8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 18: "float16", 32: "uint32", 33: "int32",
                 34: "float32", 64: "uint64", 65: "int64", 66: "float64"}  # fmt: skip
_ARRAY_CODES = {np.dtype(name): code for code, name in _ARRAY_DTYPES.items()}
_SHAPE_WIDTHS = (1, 2, 4, 8)  # the shape header's low 2 bits: uint8, uint16, uint32, uint64 dimensions
_STORED_BYTES = frozenset(
    {"bytes", "pil", "jpeg", "png", "list[pil]", "list[jpeg]", "list[png]", "jpeg_array", "jpegarray"}
)
_TEXT = frozenset({"str", "json", "str_decimal"})
_PARSED = {"str_int": pa.int64(), "str_float": pa.float64()}


# Each shard's decompression given its bytes and the size the index says it has.
_DECOMPRESS: dict[str, Callable[[bytes, int], bytes]] = {
    "zstd": unzstd,
    "gz": lambda packed, _: gzip.decompress(packed),
    "bz2": lambda packed, _: bz2.decompress(packed),
}


@dataclass(frozen=True)
class MdsFormat(FileFormat):
    """An MDS folder (``index.json`` with ``"format": "mds"`` shards)."""

    name: ClassVar[str] = "mds"
    expected: ClassVar[str] = "an MDS folder (index.json and shard.*.mds files)"
    shared_readers: ClassVar[bool] = True  # one memory map per shard and process

    def recognises_file(self, file_name: str, *, chosen: bool) -> bool:
        # Claimed so a folder of shards without its index.json is named as such (`discover`).
        return file_name.endswith((".mds", ".mds.zstd", ".mds.gz", ".mds.bz2"))

    def recognises_folder(self, path: str) -> bool:
        index = fs.join(path, INDEX)
        if not fs.exists(index):
            return False
        shards = read_index(index, kind="MDS or LitData").get("shards")  # both write an index.json
        return isinstance(shards, list) and all(isinstance(s, dict) and s.get("format") == "mds" for s in shards)

    def discover(self, name: str, files: Sequence[str]) -> Discovered:
        index = files[0].rstrip("/").rsplit("/", 1)[0] + "/" + INDEX  # beside the first shard
        if fs.exists(index):  # there, but `recognises_folder` found no MDS shards in it
            raise DatasetFormatError(
                f'Dataset {name!r}: {index} lists no MDS shards (each entry of its "shards" needs '
                f'"format": "mds"), so the shards beside it ({fs.basename(files[0])}...) cannot be read; '
                "re-write the folder with MDSWriter, or fix the index."
            )
        raise DatasetFormatError(
            f"Dataset {name!r}: MDS shards ({fs.basename(files[0])}...) are read through their folder's {INDEX}, "
            f"which is missing; point at the folder MDSWriter wrote (with its {INDEX})."
        )

    @staticmethod
    def column_type(encoding: str, *, where: str) -> pa.DataType:
        """The Arrow type of an MDS column of ``encoding`` (``where`` names it in errors); an
        ``ndarray`` without a dtype is typed by `_first_array_dtype` instead."""
        base, _, params = encoding.partition(":")
        if encoding in _TEXT:
            return pa.string()
        if encoding in _STORED_BYTES:
            return pa.binary()
        if encoding in _NUMBERS:
            return pa.from_numpy_dtype(_NUMBERS[encoding].newbyteorder("="))
        if encoding in _PARSED:
            return _PARSED[encoding]
        if encoding == "pkl":
            raise DatasetFormatError(
                f"{where} is pickled ('pkl'): unpickling runs code from the data, so it is never read; "
                "re-write the column as 'json', 'str', 'bytes' or 'ndarray'."
            )
        if base == "ndarray" and params:
            dtype, _, shape = params.partition(":")
            if dtype not in _NUMBERS or dtype == "int":
                raise DatasetFormatError(f"{where}: ndarray dtype {dtype!r} is not one MDS writes.")
            if shape and "," in shape:
                raise DatasetFormatError(
                    f"{where} holds {shape}-shaped arrays; MDS arrays are read as 1-D lists (token ids); "
                    "store other arrays as 'bytes' to get their bytes."
                )
            return pa.list_(pa.from_numpy_dtype(np.dtype(dtype)))
        raise DatasetFormatError(f"{where}: the MDS encoding {encoding!r} is not one this reader knows.")

    def discover_folder(self, name: str, path: str) -> Discovered:
        index_url = fs.join(path, INDEX)
        index = read_index(index_url, kind="MDS")
        shards: list[ShardInfo] = []
        layout: tuple[tuple[str, str, int | None], ...] | None = None
        for i, entry in enumerate(index.get("shards") or ()):
            try:
                if entry.get("version") != 2:
                    raise DatasetFormatError(f"{index_url}: shard {i} is MDS version {entry.get('version')}, not 2.")
                found = tuple(zip(entry["column_names"], entry["column_encodings"], entry["column_sizes"], strict=True))
                zipped, raw = entry.get("zip_data"), entry["raw_data"]
                compression = (entry.get("compression") or "").partition(":")[0] or None
                stored = zipped if zipped else raw
                info = ShardInfo(
                    shard_id=i,
                    path=fs.join(path, stored["basename"]),
                    num_rows=int(entry["samples"]),
                    num_bytes=int(stored["bytes"]),
                    extra={
                        "compression": compression if zipped else None,
                        "raw_bytes": int(raw["bytes"]),
                        "columns": found,
                    },
                )
            except (KeyError, TypeError, ValueError, AttributeError) as err:
                raise DatasetFormatError(f"{index_url}: shard {i}'s entry is not an MDS shard's ({err!r}).") from err
            if layout is not None and found != layout:
                raise DatasetFormatError(
                    f"{index_url}: shard {i} has columns {found}, shard 0 {layout}; every shard of a dataset holds "
                    "the same columns."
                )
            if info.extra["compression"] is not None and info.extra["compression"] not in _DECOMPRESS:
                raise DatasetFormatError(
                    f"{index_url}: shard {i} is compressed with {compression!r}; this reader decompresses "
                    f"{sorted(_DECOMPRESS)}; re-write it with one of those or none."
                )
            layout = found
            shards.append(info)
        fields = []
        for column, encoding, _ in layout or ():
            where = f"{index_url}: column {column!r}"
            if encoding == "ndarray":  # the dtype is in each value: the first one's
                fields.append(
                    pa.field(column, pa.list_(pa.from_numpy_dtype(_first_array_dtype(shards, column, where))))
                )
            else:
                fields.append(pa.field(column, self.column_type(encoding, where=where)))
        return Discovered(format=self, shards=tuple(shards), schema=pa.schema(fields))

    def open_reader(self, dataset: Dataset, *, columns: Sequence[str] | None = None) -> ShardReader:
        return MdsReader(dataset, columns=columns)


def record_layout(columns: Sequence[tuple[str, str, int | None]]) -> RecordLayout:
    """An MDS record: a size in its header for each column without a fixed size."""
    return RecordLayout(
        sizes=tuple(size for _, _, size in columns), prefixed=tuple(size is None for _, _, size in columns)
    )


def local_shard(info: ShardInfo) -> str:
    """A local path with the shard's uncompressed bytes: the file itself, or its decompressed
    copy in the shard cache (made once; a remote shard is downloaded first)."""
    url = info.file_path()
    local = fs.default_shard_cache().ensure_local(url, info.num_bytes or None)
    compression = info.extra.get("compression")
    if compression is None:
        return local
    size, unpack = int(info.extra["raw_bytes"]), _DECOMPRESS[compression]
    return unpacked_copy(url, local, lambda packed: unpack(packed, size), size=size)


def _first_array_dtype(shards: Sequence[ShardInfo], column: str, where: str) -> np.dtype:
    """The dtype of an ``ndarray`` column whose encoding names none: its first value's (the
    first record of the first shard with records, read like any take)."""
    for info in shards:
        if info.num_rows:
            columns = info.extra["columns"]
            shard = RecordFile(info.file_path(), local_shard(info), rows=info.num_rows)
            try:
                span = shard.spans(np.zeros(1, np.int64), record_layout(columns))[
                    [c for c, _, _ in columns].index(column)
                ]
                code = int(shard.data[int(span.starts[0])]) if span.lengths[0] else -1
            finally:
                shard.close()
            if code not in _ARRAY_DTYPES:
                raise DatasetFormatError(f"{where}: its first array's dtype code {code} is not one MDS writes.")
            return np.dtype(_ARRAY_DTYPES[code])
    return np.dtype("int64")  # no value to type it by: an empty dataset's column


class MdsReader:
    """Reads rows of an MDS dataset's shards (each memory-mapped once; not thread-safe)."""

    def __init__(self, dataset: Dataset, *, columns: Sequence[str] | None = None) -> None:
        self.dataset = dataset
        self.schema = project(dataset.schema, check_columns(dataset.name, dataset.schema, columns))
        self._files: dict[int, tuple[RecordFile, RecordLayout, dict[str, tuple[int, str]]]] = {}

    def _open(self, shard_id: int) -> tuple[RecordFile, RecordLayout, dict[str, tuple[int, str]]]:
        if shard_id not in self._files:
            info = shard_info(self.dataset.shards, shard_id, dataset=self.dataset.name)
            columns = info.extra["columns"]
            shard = RecordFile(info.file_path(), local_shard(info), rows=info.num_rows)
            self._files[shard_id] = (shard, record_layout(columns), {c: (k, e) for k, (c, e, _) in enumerate(columns)})
        return self._files[shard_id]

    def take(self, shard_id: int, rows: np.ndarray) -> pa.Table:
        shard, layout, where_is = self._open(shard_id)
        rows = np.asarray(rows, dtype=np.int64)
        spans = shard.spans(rows, layout)
        arrays = []
        for field in self.schema:
            k, encoding = where_is[field.name]
            arrays.append(_decode(shard, spans[k], rows, field, encoding, f"{shard.url}: column {field.name!r}"))
        return pa.Table.from_arrays(arrays, schema=self.schema)

    def close(self) -> None:
        for shard, _, _ in self._files.values():
            shard.close()
        self._files.clear()


def _decode(shard: RecordFile, spans: Spans, rows: np.ndarray, field: pa.Field, encoding: str, where: str) -> pa.Array:
    """One column's values from their byte spans, by the column's MDS encoding."""
    if encoding in _NUMBERS:
        return pa.array(scalar_column(shard, spans, _NUMBERS[encoding]), field.type)
    if encoding in _PARSED:
        text = binary_column(shard, spans, pa.string(), where)
        try:
            return pc.utf8_trim_whitespace(text).cast(field.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
            raise DatasetFormatError(f"{where} ({encoding}) holds a value that is not a number ({err}).") from err
    if pa.types.is_list(field.type):
        dtype = np.dtype(field.type.value_type.to_pandas_dtype()).newbyteorder("<")
        return list_column(shard, _array_values(shard, spans, rows, encoding, dtype, where), dtype, where)
    return binary_column(shard, spans, field.type, where)


def _array_values(
    shard: RecordFile, spans: Spans, rows: np.ndarray, encoding: str, dtype: np.dtype, where: str
) -> Spans:
    """The spans of the array values themselves: past each value's dtype byte (``ndarray``
    without a dtype) and shape header (an encoding without a shape), every value 1-D and of the
    column's dtype."""
    _, _, params = encoding.partition(":")
    dtype_given, _, shape_given = params.partition(":")
    starts, lengths = spans.starts, spans.lengths
    if shape_given:
        return spans
    if np.any(lengths < (1 if dtype_given else 2)):
        raise DatasetFormatError(f"{where}: a value is too short for an ndarray header; is the shard corrupt?")
    if not dtype_given:
        codes = shard.data[starts]
        want = _ARRAY_CODES[dtype.newbyteorder("=")]
        if np.any(codes != want):
            bad = int(np.flatnonzero(codes != want)[0])
            raise DatasetFormatError(
                f"{where}: record {int(rows[bad])} holds a {_ARRAY_DTYPES.get(int(codes[bad]), codes[bad])} array; "
                f"every value must be {_ARRAY_DTYPES[want]} (the first one's)."
            )
        starts, lengths = starts + 1, lengths - 1
    shape_code = shard.data[starts].astype(np.int64)
    ndim, width = shape_code >> 2, np.asarray(_SHAPE_WIDTHS)[shape_code & 3]
    if np.any(ndim != 1):
        bad = int(np.flatnonzero(ndim != 1)[0])
        raise DatasetFormatError(
            f"{where}: record {int(rows[bad])} holds a {int(ndim[bad])}-D array; MDS arrays are read as 1-D lists "
            "(token ids); store other arrays as 'bytes' to get their bytes."
        )
    header = 1 + width
    return Spans(starts + header, lengths - header)


MDS = MdsFormat()
