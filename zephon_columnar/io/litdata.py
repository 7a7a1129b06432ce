"""LitData optimized datasets (``litdata.optimize`` output: ``index.json`` and
``chunk-R-I.bin`` files), read in place without the ``litdata`` library.

``index.json`` lists the chunks with their item counts, and its ``config`` names the sample's
leaves (``data_spec``, a serialized pytree) and each leaf's serializer (``data_format``), so
discovery reads that file only. A chunk is an offset-indexed file of items
(`zephon_columnar.io.binary_records`), each a header of leaf sizes and the leaves; a reader
memory-maps it and takes any rows by index (random access, so ``to_indexable_torch_dataset``
works over LitData too). Compressed chunks (``compression="zstd"``: framed batches, per-item
frames or whole files) are decompressed once into the shard cache as plain chunks; chunks that
hold their rows as a trailing Arrow table (what litdata writes for plain dict rows when pyarrow
is installed) are read from it. Remote chunks are downloaded once first.

Columns: a dict sample's keys (nested dicts joined with ``.``, list and tuple positions as
``0``, ``1``...), a bare leaf's ``value``, and ``TokensLoader`` datasets' one array per item as
``tokens``. By serializer: ``str``/``text`` -> string, ``int`` -> int64, ``float`` -> float64,
``bool`` -> bool, ``bytes`` -> binary, ``no_header_numpy``/``no_header_tensor`` 1-D arrays ->
a list of their dtype (pre-tokenized ids: ``pack_flat(tokens_field="tokens")``), ``json`` ->
string (the JSON text), images, files and multi-dimensional arrays -> binary (their stored
bytes). ``pickle`` leaves are refused: unpickling runs code from the data, and a data loader
never unpickles its data.

Example:
    >>> leaf = {"type": None, "context": None, "children_spec": []}
    >>> spec = [1, {"type": "builtins.dict", "context": json.dumps(["id", "text"]), "children_spec": [leaf, leaf]}]
    >>> LITDATA.leaf_names({"data_spec": json.dumps(spec)}, where="index.json")
    ['id', 'text']
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyarrow as pa

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

_CHUNK = re.compile(r"^chunk-\d+-\d+(\.\w+)?\.bin$")
#: litdata's dtype tables (their indices are what ``no_header_numpy:<i>`` / ``no_header_tensor:<i>`` name).
_NUMPY = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64")
_TORCH = ("float32", "float32", "float64", "float64", None, None, None, None, "float16", "float16", None, "uint8",
          "int8", "int16", "int16", "int32", "int32", "int64", "int64", "bool", "uint16")  # fmt: skip
_SCALARS = {"int": ("<i8", pa.int64()), "float": ("<f8", pa.float64()), "bool": ("u1", pa.bool_())}
_FRAMED = b"LDFZ01\0\0"
_FRAMED_PREFIX = struct.Struct("<8sHHIII")  # magic, version, flags, items, items per frame, frames
_FRAME = struct.Struct("<IIQII")  # first item, items, compressed offset, compressed length, length
_ARROW_FOOTER = b"LDARW01\0"


def _leaf_type(serializer: str, where: str) -> tuple[pa.DataType, np.dtype | None]:
    """``(column type, array dtype)`` of a leaf written by ``serializer`` (dtype: 1-D arrays only)."""
    name, _, param = serializer.partition(":")
    if name in ("str", "text", "json"):
        return pa.string(), None
    if name in _SCALARS:
        return _SCALARS[name][1], None
    if name == "pickle":
        raise DatasetFormatError(
            f"{where} is pickled: unpickling runs code from the data, so it is never read; write that field "
            "as a str, a number, bytes or a numpy array."
        )
    if name in ("no_header_numpy", "no_header_tensor"):
        table = _NUMPY if name == "no_header_numpy" else _TORCH
        index = int(param) if param.isdigit() else -1
        dtype = table[index] if 0 <= index < len(table) else None
        if dtype is None:
            raise DatasetFormatError(f"{where}: {serializer!r} names a dtype this reader cannot hold in Arrow.")
        return pa.list_(pa.from_numpy_dtype(np.dtype(dtype))), np.dtype(dtype).newbyteorder("<")
    return pa.binary(), None  # bytes, images, files, multi-dimensional arrays: their stored bytes


@dataclass(frozen=True)
class LitDataFormat(FileFormat):
    """A LitData optimized folder (``index.json`` with ``chunks`` and ``config``)."""

    name: ClassVar[str] = "litdata"
    expected: ClassVar[str] = "a LitData folder (index.json and chunk-*.bin files)"
    shared_readers: ClassVar[bool] = True  # one memory map per chunk and process

    def recognises_file(self, file_name: str, *, chosen: bool) -> bool:
        # Claimed so a folder of chunks without its index.json is named as such (`discover`).
        return _CHUNK.match(file_name) is not None

    def recognises_folder(self, path: str) -> bool:
        index = fs.join(path, INDEX)
        if not fs.exists(index):
            return False
        found = read_index(index, kind="MDS or LitData")
        return isinstance(found.get("chunks"), list) and isinstance(found.get("config"), dict)

    def discover(self, name: str, files: Sequence[str]) -> Discovered:
        raise DatasetFormatError(
            f"Dataset {name!r}: LitData chunks ({fs.basename(files[0])}...) are read through their folder's {INDEX}, "
            f"which is missing; point at the folder litdata.optimize wrote (with its {INDEX})."
        )

    @staticmethod
    def leaf_names(config: dict[str, Any], *, where: str) -> list[str]:
        """The column name of each leaf of the sample, in ``data_format`` order (pre-order)."""
        if config.get("item_loader") == "TokensLoader":
            return ["tokens"]
        try:
            _, root = json.loads(config["data_spec"])
        except (KeyError, ValueError, TypeError) as err:
            raise DatasetFormatError(f"{where}: the config's data_spec is not a litdata tree spec ({err!r}).") from err
        names: list[str] = []

        def walk(node: dict[str, Any], prefix: str) -> None:
            children = node.get("children_spec") or []
            if not children:
                names.append(prefix or "value")
                return
            kind = node.get("type") or ""
            keys = json.loads(node["context"]) if kind.endswith(("dict", "OrderedDict")) else None
            for i, child in enumerate(children):
                key = str(keys[i]) if keys is not None else str(i)
                walk(child, f"{prefix}.{key}" if prefix else key)

        walk(root, "")
        return names

    def discover_folder(self, name: str, path: str) -> Discovered:
        index_url = fs.join(path, INDEX)
        index = read_index(index_url, kind="LitData")
        config = index["config"]
        formats = list(config.get("data_format") or [])
        names = self.leaf_names(config, where=index_url)
        if len(names) != len(formats):
            raise DatasetFormatError(
                f"{index_url}: {len(names)} leaves in data_spec but {len(formats)} data_format entries."
            )
        if config.get("encryption"):
            raise DatasetFormatError(f"{index_url}: the chunks are encrypted; decrypt them (litdata) before reading.")
        types = [_leaf_type(f, f"{index_url}: field {n!r}") for n, f in zip(names, formats)]
        compression = (config.get("compression") or "").partition(":")[0] or None
        if compression not in (None, "zstd"):
            raise DatasetFormatError(f"{index_url}: chunks compressed with {compression!r}; this reader reads zstd.")
        level = config.get("compression_level") if compression else None
        shards = []
        for i, chunk in enumerate(index["chunks"]):
            try:
                filename, rows = chunk["filename"], int(chunk["chunk_size"])
            except (KeyError, TypeError, ValueError) as err:
                raise DatasetFormatError(
                    f"{index_url}: chunk {i}'s entry lacks {err}; is the index cut short?"
                ) from err
            whole_file = compression is not None and level is None  # chunk-R-I.zstd.bin
            shards.append(
                ShardInfo(
                    shard_id=i,
                    path=fs.join(path, filename),
                    num_rows=rows,
                    num_bytes=0 if whole_file else int(chunk.get("chunk_bytes") or 0),
                    extra={
                        "packing": "file" if whole_file else level,
                        "serializers": tuple(formats),
                        "tokens": config.get("item_loader") == "TokensLoader",  # items without leaf sizes
                    },
                )
            )
        schema = pa.schema([pa.field(n, t) for n, (t, _) in zip(names, types)])
        return Discovered(format=self, shards=tuple(shards), schema=schema)

    def open_reader(self, dataset: Dataset, *, columns: Sequence[str] | None = None) -> ShardReader:
        return LitDataReader(dataset, columns=columns)


def plain_chunk(info: ShardInfo) -> str:
    """A local path with the chunk in litdata's plain layout: the file itself, or a copy
    decompressed once into the shard cache (framed batches, per-item frames or a whole file)."""
    url = info.file_path()
    local = fs.default_shard_cache().ensure_local(url, info.num_bytes or None)
    packing = info.extra.get("packing")
    if packing is None:
        return local
    return unpacked_copy(url, local, lambda packed: _unpack(packed, packing, url))


def _unpack(packed: bytes, packing: str, url: str) -> bytes:
    if packing == "file":
        return unzstd(packed)
    if packing == "sample":
        n = struct.unpack_from("<I", packed, 0)[0]
        offsets = np.frombuffer(packed, dtype="<u4", count=n + 1, offset=4).astype(np.int64)
        items = [unzstd(packed[s:e]) for s, e in pairwise(offsets.tolist())]
        return _plain(items)
    if packing == "batch":
        magic, version, _, n, _, frames = _FRAMED_PREFIX.unpack_from(packed, 0)
        if magic != _FRAMED or version != 1:
            raise DatasetFormatError(f"{url}: not a framed litdata chunk (magic {magic!r}, version {version}).")
        at = _FRAMED_PREFIX.size
        logical = np.frombuffer(packed, dtype="<u4", count=n + 1, offset=at).astype(np.int64)
        at += 4 * (n + 1)
        body = []
        for f in range(frames):
            _, _, start, length, size = _FRAME.unpack_from(packed, at + f * _FRAME.size)
            part = unzstd(packed[start : start + length], size)
            if len(part) != size:
                raise DatasetFormatError(
                    f"{url}: frame {f} inflates to {len(part)} bytes, not {size}; is it cut short?"
                )
            body.append(part)
        joined = b"".join(body)
        return _plain([joined[s:e] for s, e in pairwise(logical.tolist())])
    raise DatasetFormatError(f"{url}: compression level {packing!r} is not one this reader knows.")


def _plain(items: list[bytes]) -> bytes:
    """Items in litdata's plain chunk layout: count, absolute offsets, items."""
    header = 4 + 4 * (len(items) + 1)
    offsets = np.concatenate(([header], header + np.cumsum([len(i) for i in items], dtype=np.int64)))
    return struct.pack("<I", len(items)) + offsets.astype("<u4").tobytes() + b"".join(items)


class LitDataReader:
    """Reads rows of a LitData dataset's chunks (each memory-mapped once; not thread-safe)."""

    def __init__(self, dataset: Dataset, *, columns: Sequence[str] | None = None) -> None:
        self.dataset = dataset
        self.schema = project(dataset.schema, check_columns(dataset.name, dataset.schema, columns))
        self._leaves = {f.name: k for k, f in enumerate(dataset.schema)}
        self._chunks: dict[int, tuple[RecordFile, pa.Table | None]] = {}

    def _open(self, shard_id: int) -> tuple[RecordFile, pa.Table | None, ShardInfo]:
        info = shard_info(self.dataset.shards, shard_id, dataset=self.dataset.name)
        if shard_id not in self._chunks:
            chunk = RecordFile(info.file_path(), plain_chunk(info), rows=info.num_rows)
            self._chunks[shard_id] = (chunk, _arrow_rows(chunk))
        return (*self._chunks[shard_id], info)

    def take(self, shard_id: int, rows: np.ndarray) -> pa.Table:
        chunk, arrow, info = self._open(shard_id)
        rows = np.asarray(rows, dtype=np.int64)
        if arrow is not None:
            return self._from_arrow(chunk, arrow, rows)
        serializers = info.extra["serializers"]
        # An item is its leaves' sizes, then the leaves; a TokensLoader item is its array alone.
        layout = RecordLayout(sizes=(None,) * len(serializers), prefixed=(not info.extra["tokens"],) * len(serializers))
        spans = chunk.spans(rows, layout)
        arrays = []
        for field in self.schema:
            k = self._leaves[field.name]
            where = f"{chunk.url}: field {field.name!r}"
            arrays.append(_decode(chunk, spans[k], serializers[k], field.type, where))
        return pa.Table.from_arrays(arrays, schema=self.schema)

    def _from_arrow(self, chunk: RecordFile, arrow: pa.Table, rows: np.ndarray) -> pa.Table:
        """Rows of a chunk that holds them as a trailing Arrow table, in the dataset's types
        (nested values as their JSON text, as the plain layout's ``json`` leaves read)."""
        taken = _leaf_columns(arrow.take(pa.array(rows)), self.dataset.schema.names)
        arrays = []
        for field in self.schema:
            if field.name not in taken.column_names:
                raise DatasetFormatError(f"{chunk.url}: its Arrow rows lack the field {field.name!r}.")
            column = taken.column(field.name)
            if pa.types.is_string(field.type) and not pa.types.is_string(column.type):
                column = pa.array([None if v is None else json.dumps(v) for v in column.to_pylist()], pa.string())
            arrays.append(column.cast(field.type))
        return pa.Table.from_arrays(arrays, schema=self.schema)

    def close(self) -> None:
        for chunk, _ in self._chunks.values():
            chunk.close()
        self._chunks.clear()


def _leaf_columns(table: pa.Table, leaves: Sequence[str]) -> pa.Table:
    """``table`` with its nested dicts (struct columns that are not a leaf themselves) as a
    column per field, named as litdata's tree spec names the leaves (``outer.inner``)."""
    while True:
        nested = [f.name for f in table.schema if pa.types.is_struct(f.type) and f.name not in leaves]
        if not nested:
            return table
        for name in nested:
            column = table.column(name)
            at = table.column_names.index(name)
            table = table.remove_column(at)
            for k, child in enumerate(column.flatten()):
                table = table.add_column(at + k, f"{name}.{column.type.field(k).name}", child)


def _arrow_rows(chunk: RecordFile) -> pa.Table | None:
    """The chunk's trailing Arrow table when its items are not in its body (None otherwise)."""
    data = chunk.data
    if len(data) < 12 or bytes(data[-8:]) != _ARROW_FOOTER or (chunk.rows and chunk.offsets[-1] > chunk.offsets[0]):
        return None
    length = int(data[-12:-8].view("<u4")[0])
    start = len(data) - 12 - length
    try:
        return pa.ipc.open_file(pa.py_buffer(bytes(data[start : start + length]))).read_all()
    except (pa.ArrowInvalid, OSError) as err:
        raise DatasetFormatError(
            f"{chunk.url}: its trailing Arrow rows cannot be read ({err}); is it cut short?"
        ) from err


def _decode(chunk: RecordFile, spans: Spans, serializer: str, type_: pa.DataType, where: str) -> pa.Array:
    name = serializer.partition(":")[0]
    if name in _SCALARS:
        dtype = np.dtype(_SCALARS[name][0])
        if np.any(spans.lengths != dtype.itemsize):
            raise DatasetFormatError(f"{where}: a value is not {dtype.itemsize} bytes; is the chunk corrupt?")
        values = scalar_column(chunk, spans, dtype)
        return pa.array(values.astype(bool) if name == "bool" else values, type_)
    if pa.types.is_list(type_):
        return list_column(chunk, spans, np.dtype(type_.value_type.to_pandas_dtype()).newbyteorder("<"), where)
    if name == "json":
        raw = binary_column(chunk, spans, pa.binary(), where).to_pylist()
        return pa.array([json_text(value, where) for value in raw], pa.string())
    return binary_column(chunk, spans, type_, where)


def json_text(raw: bytes | None, where: str) -> str | None:
    """A litdata ``json`` leaf as JSON text: older writers stored the text itself, newer ones a
    tagged binary form (a tag byte, then little-endian lengths and values), decoded here.

    Example:
        >>> json_text(b'{"a": 1}', "x"), json_text(bytes([2]) + struct.pack("<Iqq", 2, 3, 4), "x")
        ('{"a": 1}', '[3, 4]')
    """
    if raw is None:
        return None
    if not raw or raw[0] > 0x20:  # JSON text (starts with "[", "{", a digit...)
        return raw.decode("utf-8")
    try:
        value, _ = _tagged(raw, 0)
    except (struct.error, IndexError, ValueError, UnicodeDecodeError) as err:
        raise DatasetFormatError(f"{where}: a json value cannot be decoded ({err}); is the chunk corrupt?") from err
    return json.dumps(value)


def _tagged(raw: bytes, at: int) -> tuple[Any, int]:
    """One value of litdata's tagged JSON form at ``raw[at]``, and where the next one starts."""
    tag = raw[at]
    count = struct.unpack_from("<I", raw, at + 1)[0] if tag <= 6 else 0
    if tag == 0:  # JSON text
        return json.loads(raw[at + 5 : at + 5 + count]), at + 5 + count
    if tag == 1:  # strings
        out, at = [], at + 5
        for _ in range(count):
            text, at = _utf8(raw, at)
            out.append(text)
        return out, at
    if tag in (2, 3):  # int64s, float64s
        values = np.frombuffer(raw, dtype="<i8" if tag == 2 else "<f8", count=count, offset=at + 5)
        return values.tolist(), at + 5 + 8 * count
    if tag == 4:  # bools
        return [bool(b) for b in raw[at + 5 : at + 5 + count]], at + 5 + count
    if tag == 5:  # a dict
        mapping, at = {}, at + 5
        for _ in range(count):
            key, at = _utf8(raw, at)
            mapping[key], at = _tagged(raw, at)
        return mapping, at
    if tag == 6:  # records: a dict per row over one key list, each value tagged 0x10-0x14
        keys_count = struct.unpack_from("<I", raw, at + 5)[0]
        at += 9
        keys = []
        for _ in range(keys_count):
            key, at = _utf8(raw, at)
            keys.append(key)
        rows = []
        for _ in range(count):
            row: dict[str, Any] = {}
            for key in keys:
                row[key], at = _record_value(raw, at)
            rows.append(row)
        return rows, at
    if tag in _SCALAR_TAGS:
        return _scalar(_SCALAR_TAGS[tag], raw, at + 1)
    raise ValueError(f"unknown tag {tag}")


def _record_value(raw: bytes, at: int) -> tuple[Any, int]:
    """A field of a records value: a tag (0x10-0x14) and the scalar it names."""
    if raw[at] not in _RECORD_TAGS:
        raise ValueError(f"unknown record tag {raw[at]}")
    return _scalar(_RECORD_TAGS[raw[at]], raw, at + 1)


# The scalars of the tagged form, by tag: as a value of its own, and as a field of a records value.
_SCALAR_TAGS = {7: "str", 8: "int", 9: "float", 10: "bool", 11: "none"}
_RECORD_TAGS = {0x10: "none", 0x11: "str", 0x12: "int", 0x13: "float", 0x14: "bool"}


def _scalar(kind: str, raw: bytes, at: int) -> tuple[Any, int]:
    """The scalar ``kind`` stored at ``raw[at]`` (past its tag), and where the next value starts."""
    if kind == "str":
        return _utf8(raw, at)
    if kind in ("int", "float"):
        return struct.unpack_from("<q" if kind == "int" else "<d", raw, at)[0], at + 8
    if kind == "bool":
        return bool(raw[at]), at + 1
    return None, at


def _utf8(raw: bytes, at: int) -> tuple[str, int]:
    length = struct.unpack_from("<I", raw, at)[0]
    return raw[at + 4 : at + 4 + length].decode("utf-8"), at + 4 + length


LITDATA = LitDataFormat()
