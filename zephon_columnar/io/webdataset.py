"""WebDataset tar shards (``*.tar``), read in place: one row per sample, one column per file
extension, the sample's key in ``key``.

A WebDataset shard is a plain tar whose members are named ``<key>.<extension>``; consecutive
members with the same key form one sample (``000017.txt`` and ``000017.json`` -> one row with
columns ``txt`` and ``json``). Discovery reads each shard's tar headers (512 bytes a member; the
data is skipped) for its samples and extensions, all at once as array operations where the
archive is plain (what ``tarfile``, GNU tar and ``TarWriter`` write), else member by member, and
once: the index is cached on disk (``cache_root()/tar_index``) for loader workers and later runs.
A reader memory-maps each shard it reads and copies exactly the members of the rows asked for
(random access, so ``to_indexable_torch_dataset`` works over tar shards too).

Columns, by extension (WebDataset's own conventions): ``txt``/``text`` -> string, ``json`` ->
string (the JSON text; parse it with ``pl.col("json").str.json_decode()``), ``cls``/``cls2``/
``index``/``idx``/``id`` -> int64, ``npy`` (also ``input_ids.npy``...) holding 1-D arrays ->
a list of their dtype (pre-tokenized ids: ``pack_flat`` and ``to_training`` find ``input_ids.npy``
and ``tokens.npy`` themselves; the dtype is the first member's, read from its 128-byte header at
discovery, and a member of another dtype or shape is an error naming it), anything else (``jpg``,
``pth``, ``pyd``...) -> binary, never unpickled. A sample without an extension some other sample
has holds null there. Remote shards are downloaded once into the shard cache.

Example:
    >>> WEBDATASET.recognises_file("shard-000.tar", chosen=False), WEBDATASET.column_type("cls")
    (True, DataType(int64))
"""

from __future__ import annotations

import ast
import functools
import hashlib
import io
import mmap
import os
import re
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from zephon_columnar.errors import DatasetFormatError
from zephon_columnar.io import fs, tar
from zephon_columnar.io.base import ShardInfo, ShardReader, check_columns, project, shard_info
from zephon_columnar.io.binary_records import gather_spans
from zephon_columnar.io.format import Discovered, FileFormat

if TYPE_CHECKING:
    from zephon_columnar.io.dataset import Dataset

KEY = "key"  # the sample key's column (names starting with "__" are the engine's own)
_TEXT, _INT = frozenset({"txt", "text", "json"}), frozenset({"cls", "cls2", "index", "idx", "id"})
_MEMBER = re.compile(r"^(?P<key>(?:.*/|)[^./]+)\.(?P<ext>[^/]+)$")  # WebDataset's split: key up to the first dot


@dataclass(frozen=True, kw_only=True)
class TarIndex:
    """Where each sample's members sit in one shard: ``offsets[ext][row]`` (-1: the sample has no
    such member) and ``sizes[ext][row]``, byte positions of the member data."""

    keys: pa.StringArray
    offsets: dict[str, np.ndarray]
    sizes: dict[str, np.ndarray]


def scan(url: str, local: str) -> TarIndex:
    """The index of the tar at ``local`` (``url`` names it in errors): its headers only."""
    return _scan(local, *_stamp(local), url)


def _stamp(local: str) -> tuple[int, int]:
    st = os.stat(local)
    return st.st_size, st.st_mtime_ns


@functools.lru_cache(maxsize=256)
def _scan(local: str, size: int, mtime: int, url: str) -> TarIndex:
    """The index from the on-disk cache (``cache_root()/tar_index``, keyed by the file's path,
    size and modification time: loader workers and later runs skip the walk), else walked and
    saved there (best effort: an unwritable cache only costs the walk again)."""
    path = os.path.join(
        fs.cache_root(), "tar_index", hashlib.sha256(f"{local}\0{size}\0{mtime}".encode()).hexdigest()[:40]
    )
    cached = _load_index(path + ".npz")
    if cached is not None:
        return cached
    index = _walk(local, size, url)
    try:
        out = io.BytesIO()
        arrays: dict[str, Any] = {"keys": np.frombuffer(_keys_ipc(index.keys), np.uint8)}
        arrays.update({f"offsets/{ext}": v for ext, v in index.offsets.items()})
        arrays.update({f"sizes/{ext}": v for ext, v in index.sizes.items()})
        np.savez(out, **arrays)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fs.atomic_write(path + ".npz", out.getbuffer())
    except OSError:
        pass
    return index


def _keys_ipc(keys: pa.StringArray) -> bytes:
    sink = pa.BufferOutputStream()
    batch = pa.record_batch([keys], names=[KEY])
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    data: bytes = sink.getvalue().to_pybytes()
    return data


def _load_index(path: str) -> TarIndex | None:
    try:
        with np.load(path) as saved:
            keys = pa.ipc.open_stream(pa.py_buffer(saved["keys"].tobytes())).read_all().column(KEY).combine_chunks()
            offsets = {name[len("offsets/") :]: saved[name] for name in saved.files if name.startswith("offsets/")}
            sizes = {name[len("sizes/") :]: saved[name] for name in saved.files if name.startswith("sizes/")}
    except (OSError, KeyError, ValueError):  # absent or unreadable: walk again (pa.ArrowInvalid is a ValueError)
        return None
    return TarIndex(keys=keys, offsets=offsets, sizes=sizes)


def _walk(local: str, size: int, url: str) -> TarIndex:
    """The tar's index: read from all its headers at once where the archive is plain
    (`tar.members_at_once`), else member by member (which also names whatever is wrong)."""
    found = tar.members_at_once(local, size)
    index = _samples_at_once(found) if found is not None else None
    return index if index is not None else _walk_members(local, size, url)


def _samples_at_once(found: tuple[pa.StringArray, np.ndarray, np.ndarray]) -> TarIndex | None:
    """The index of a plain tar's members ``(names, data offsets, data sizes)``
    (`tar.members_at_once`) as array operations: keys and extensions by one RE2 pass of the
    member pattern, samples where the key changes; None where a sample has two members of one
    extension or a member has the extension ``key`` (`_walk_members` then reads it and names
    that)."""
    names, offsets, lengths = found
    names = pc.replace_substring_regex(names, r"^\./", "", max_replacements=1)
    parts = pc.extract_regex(names, _MEMBER.pattern)  # the same pattern in RE2
    hidden = pc.match_substring_regex(names, r"(^|/)[._][^/]*$")
    keep = parts.is_valid().to_numpy(zero_copy_only=False) & ~hidden.to_numpy(zero_copy_only=False)
    keys, exts = parts.field("key").filter(keep), parts.field("ext").filter(keep)
    offsets, lengths = offsets[keep], lengths[keep]
    if len(keys) == 0 or pc.any(pc.equal(exts, KEY)).as_py():
        return None
    new_key = np.ones(len(keys), bool)
    new_key[1:] = pc.not_equal(keys[1:], keys[:-1]).to_numpy(zero_copy_only=False)
    row = np.cumsum(new_key) - 1
    rows = int(row[-1]) + 1
    encoded = pc.dictionary_encode(exts)
    codes = encoded.indices.to_numpy()
    index_offsets, index_sizes = {}, {}
    for code, ext in enumerate(encoded.dictionary.to_pylist()):
        members = codes == code
        where = row[members]
        if len(np.unique(where)) != len(where):  # a sample with two members of one extension
            return None
        index_offsets[ext] = np.full(rows, -1, np.int64)
        index_sizes[ext] = np.zeros(rows, np.int64)
        index_offsets[ext][where], index_sizes[ext][where] = offsets[members], lengths[members]
    return TarIndex(keys=keys.filter(new_key), offsets=index_offsets, sizes=index_sizes)


def _walk_members(local: str, size: int, url: str) -> TarIndex:
    keys: list[str] = []
    places: dict[str, dict[int, tuple[int, int]]] = {}
    try:
        for name, offset, length in tar.members(local, size):
            name = name[2:] if name.startswith("./") else name
            found = _MEMBER.match(name)
            if found is None or os.path.basename(name).startswith((".", "_")):
                continue
            key, ext = found.groups()
            if ext == KEY:
                raise DatasetFormatError(
                    f"{url}: member {name!r} has the extension {KEY!r}, the column that holds each "
                    "sample's key; rename that member's extension."
                )
            if not keys or keys[-1] != key:
                keys.append(key)
            places.setdefault(ext, {})[len(keys) - 1] = (offset, length)
    except (tarfile.TarError, EOFError, UnicodeDecodeError, ValueError) as err:
        if isinstance(err, DatasetFormatError):
            raise
        if isinstance(err, tar.NotATarError):
            raise DatasetFormatError(
                f"{url} is not a tar archive ({err}). A WebDataset shard is an uncompressed tar of each sample's "
                "files (tar -cf, webdataset.TarWriter); re-write the file as one, or move it out of the dataset."
            ) from err
        raise DatasetFormatError(f"{url} is not a readable WebDataset tar shard ({err}); is it cut short?") from err
    rows = len(keys)
    offsets, sizes = {}, {}
    for ext, where in places.items():
        offsets[ext] = np.full(rows, -1, dtype=np.int64)
        sizes[ext] = np.zeros(rows, dtype=np.int64)
        for row, (offset, length) in where.items():
            if offset + length > size:
                raise DatasetFormatError(f"{url} is cut short: member {keys[row]}.{ext} ends past the file's end.")
            offsets[ext][row], sizes[ext][row] = offset, length
    return TarIndex(keys=pa.array(keys, pa.string()), offsets=offsets, sizes=sizes)


def is_npy(ext: str) -> bool:
    """Whether members with extension ``ext`` are numpy ``.npy`` arrays (``npy``, ``ids.npy``)."""
    return ext == "npy" or ext.endswith(".npy")


_NPY_HEADER = re.compile(rb"\{'descr': '([^']+)', 'fortran_order': (True|False), 'shape': \(([0-9, ]*)\), \}\s*$")


def npy_header(data: bytes | memoryview, where: str) -> tuple[np.dtype, tuple[int, ...], int]:
    """``(dtype, shape, where the array's bytes start)`` from a ``.npy`` member's header (the
    format numpy documents: magic, version, header length, a Python-literal dict)."""
    if bytes(data[:6]) != b"\x93NUMPY" or len(data) < 10:
        raise DatasetFormatError(f"{where} is not a .npy array (no NUMPY magic).")
    major = data[6]
    at = 10 if major == 1 else 12
    length = int.from_bytes(data[8:at], "little")
    text = bytes(data[at : at + length])
    plain = _NPY_HEADER.match(text)  # numpy's own layout of the dict: read without an evaluator
    if plain is not None:
        descr, fortran, dims = plain.groups()
        shape = tuple(int(d) for d in dims.split(b",") if d.strip())
        dtype = np.dtype(descr.decode("ascii"))
    else:
        try:
            header = ast.literal_eval(text.decode("latin1"))
            dtype, shape, fortran = np.dtype(header["descr"]), tuple(header["shape"]), header.get("fortran_order")
        except (ValueError, SyntaxError, KeyError, TypeError) as err:
            raise DatasetFormatError(f"{where}: the .npy header cannot be read ({err}).") from err
    if fortran in (True, b"True") and len(shape) > 1:
        raise DatasetFormatError(f"{where}: a Fortran-ordered .npy array; save it C-ordered.")
    return dtype, shape, at + length


def npy_type(url: str, local: str, index: TarIndex, ext: str) -> pa.DataType:
    """The column type of ``ext``'s ``.npy`` members: a list of the first member's dtype (its
    header only is read); an array that is not 1-D, or of a dtype Arrow lacks, is named."""
    row = int(np.flatnonzero(index.offsets[ext] >= 0)[0])
    where = f"{url}: member {index.keys[row].as_py()}.{ext}"
    with open(local, "rb") as f:
        f.seek(int(index.offsets[ext][row]))
        head = f.read(min(int(index.sizes[ext][row]), 4096))
    dtype, shape, _ = npy_header(head, where)
    if len(shape) != 1 or dtype.hasobject or dtype.kind not in "biuf":
        raise DatasetFormatError(
            f"{where} holds a {len(shape)}-D {dtype} array; .npy members are read as 1-D numeric arrays "
            "(token ids); store other arrays under another extension to get their bytes."
        )
    return pa.list_(pa.from_numpy_dtype(dtype.newbyteorder("=")))


@dataclass(frozen=True)
class WebDatasetFormat(FileFormat):
    """``*.tar`` WebDataset shards (see the module docstring)."""

    name: ClassVar[str] = "webdataset"
    expected: ClassVar[str] = "*.tar (WebDataset shards)"

    def recognises_file(self, file_name: str, *, chosen: bool) -> bool:
        return file_name.endswith(".tar")

    @staticmethod
    def column_type(ext: str) -> pa.DataType:
        """The Arrow type of the column of members with extension ``ext`` (``npy`` members:
        see `npy_type`)."""
        return pa.string() if ext in _TEXT else pa.int64() if ext in _INT else pa.binary()

    def discover(self, name: str, files: Sequence[str]) -> Discovered:
        shards: list[ShardInfo] = []
        types: dict[str, pa.DataType] = {}
        for i, url in enumerate(files):
            size = fs.file_size(url)
            local = fs.default_shard_cache().ensure_local(url, size)
            index = scan(url, local)
            for ext in index.offsets:
                if ext not in types:
                    types[ext] = npy_type(url, local, index, ext) if is_npy(ext) else self.column_type(ext)
            shards.append(ShardInfo(shard_id=i, path=url, num_rows=len(index.keys), num_bytes=size))
        fields = [pa.field(KEY, pa.string())] + [pa.field(e, types[e]) for e in sorted(types)]
        return Discovered(format=self, shards=tuple(shards), schema=pa.schema(fields))

    def open_reader(self, dataset: Dataset, *, columns: Sequence[str] | None = None) -> ShardReader:
        return TarReader(dataset, columns=columns)


class TarReader:
    """Reads rows of a WebDataset dataset's shards: the members of each row asked for, by their
    offsets in the memory-mapped tar (one map per shard; not thread-safe)."""

    def __init__(self, dataset: Dataset, *, columns: Sequence[str] | None = None) -> None:
        self.dataset = dataset
        self.schema = project(dataset.schema, check_columns(dataset.name, dataset.schema, columns))
        self._files: dict[int, tuple[str, np.ndarray, TarIndex]] = {}
        self._maps: list[mmap.mmap] = []

    def _open(self, shard_id: int) -> tuple[str, np.ndarray, TarIndex]:
        if shard_id not in self._files:
            info = shard_info(self.dataset.shards, shard_id, dataset=self.dataset.name)
            url = info.file_path()
            local = fs.default_shard_cache().ensure_local(url, info.num_bytes or None)
            index = scan(url, local)
            with open(local, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                view = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
            if view is not None:
                self._maps.append(view)
            data = np.frombuffer(view, np.uint8) if view is not None else np.zeros(0, np.uint8)
            self._files[shard_id] = (url, data, index)
        return self._files[shard_id]

    def take(self, shard_id: int, rows: np.ndarray) -> pa.Table:
        url, data, index = self._open(shard_id)
        rows = np.asarray(rows, dtype=np.int64)
        columns = []
        for field in self.schema:
            if field.name == KEY:
                columns.append(index.keys.take(pa.array(rows)))
                continue
            offsets, sizes = index.offsets.get(field.name), index.sizes.get(field.name)
            if offsets is None or sizes is None:  # another shard's extension
                columns.append(pa.nulls(len(rows), field.type))
                continue
            members = _Members(
                data=data, offsets=offsets[rows], sizes=sizes[rows], url=url, index=index, rows=rows, ext=field.name
            )
            columns.append(_npy_column(members, field) if pa.types.is_list(field.type) else _column(members, field))
        return pa.Table.from_arrays(columns, schema=self.schema)

    def close(self) -> None:
        self._files.clear()
        for view in self._maps:
            try:
                view.close()
            except BufferError:  # an array still viewing the map keeps it alive
                pass
        self._maps.clear()


@dataclass(frozen=True, kw_only=True)
class _Members:
    """One column's members for the rows asked: their byte ``offsets`` (-1: the row has none) and
    ``sizes`` in the shard's bytes ``data``; ``url``, ``index``, ``rows`` and ``ext`` name them."""

    data: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray
    url: str
    index: TarIndex
    rows: np.ndarray
    ext: str

    @property
    def present(self) -> np.ndarray:
        return self.offsets >= 0

    def where(self, k: int) -> str:
        return f"{self.url}: member {self.index.keys[int(self.rows[k])].as_py()}.{self.ext}"

    def member(self, k: int) -> memoryview | None:
        start = int(self.offsets[k])
        return None if start < 0 else self.data.data[start : start + int(self.sizes[k])]

    def validity(self) -> pa.Buffer | None:
        """The Arrow validity bitmap of the rows (None when every row has the member)."""
        present = self.present
        return None if present.all() else pa.array(present).buffers()[1]

    def joined(self, skip: np.ndarray | int = 0, take: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Each member's bytes from ``skip`` on (``take`` of them; all when None) joined, with the
        offsets of each row's part (empty for a row without the member)."""
        present = self.present
        starts = np.where(present, self.offsets + skip, 0)
        lengths = np.where(present, self.sizes - skip if take is None else take, 0)
        return gather_spans(self.data, starts, lengths)


def _column(members: _Members, field: pa.Field) -> pa.Array:
    """The members' bytes as ``field``'s type: UTF-8 checked and integers parsed by Arrow's
    kernels over the whole column; a member that fails is then found and named."""
    joined, offsets = members.joined()
    large = offsets[-1] >= 2**31
    raw = pa.Array.from_buffers(
        pa.large_binary() if large else pa.binary(),
        len(members.rows),
        [members.validity(), pa.py_buffer(offsets if large else offsets.astype(np.int32)), pa.py_buffer(joined)],
    )
    if pa.types.is_binary(field.type):
        return raw.cast(field.type) if large else raw
    try:
        text = raw.cast(pa.large_string() if large else pa.string())
        if pa.types.is_string(field.type):
            return text.cast(field.type) if large else text
        return pc.utf8_trim_whitespace(text).cast(pa.int64())
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        pass
    kind = "UTF-8 text" if pa.types.is_string(field.type) else "an integer"
    for k in range(len(members.rows)):
        value = members.member(k)
        if value is None:
            continue
        try:
            text_value = bytes(value).decode("utf-8")
            if pa.types.is_integer(field.type):
                int(text_value)
        except (UnicodeDecodeError, ValueError) as err:
            raise DatasetFormatError(
                f"{members.where(k)} is not {kind} ({err}); WebDataset's .{field.name} members hold {kind}."
            ) from err
    raise DatasetFormatError(f"{members.url}: the .{field.name} members are not {kind}.")


def _npy_column(members: _Members, field: pa.Field) -> pa.Array:
    """1-D ``.npy`` members as one list array of the column's dtype: the headers checked as one
    array operation where they are numpy's own layout (`_npy_bodies`), one at a time where not,
    then the array bytes joined once (no Python object per element)."""
    dtype = np.dtype(field.type.value_type.to_pandas_dtype())
    bodies = _npy_bodies(members, dtype)
    if bodies is None:
        bodies = _npy_bodies_one_by_one(members, dtype)
    skip, counts = bodies
    values, _ = members.joined(skip, counts * dtype.itemsize)
    offsets = np.zeros(len(counts) + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.ListArray.from_buffers(
        field.type,
        len(counts),
        [members.validity(), pa.py_buffer(offsets)],
        children=[pa.array(values.view(dtype))],
    )


_NPY_DIGITS = 16  # a shape of up to 15 digits (a petabyte array), so counts stay far inside int64


def _npy_bodies(members: _Members, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray] | None:
    """``(where each member's array starts, its element count)`` when every present member has
    the header ``np.save`` writes for a 1-D ``dtype`` array (version 1.0, this dtype's own descr,
    C order, padded with spaces to a newline) and exactly that array after it, checked for all
    rows at once on a (rows, header bytes) matrix; None otherwise (`_npy_bodies_one_by_one` then
    reads and names each)."""
    present = members.present
    offsets, sizes = members.offsets[present], members.sizes[present]
    n = len(offsets)
    skip, counts = np.zeros(len(present), np.int64), np.zeros(len(present), np.int64)
    if n == 0:
        return skip, counts
    prefix = np.frombuffer(f"{{'descr': '{dtype.str}', 'fortran_order': False, 'shape': (".encode(), np.uint8)
    if int(sizes.min()) < 10 + len(prefix) + _NPY_DIGITS:
        return None
    head = members.data[offsets[:, None] + np.arange(10)]
    if not (head[:, :8] == np.frombuffer(b"\x93NUMPY\x01\x00", np.uint8)).all():
        return None
    length = head[:, 8].astype(np.int64) | head[:, 9].astype(np.int64) << 8
    width = int(length.max())
    if int(length.min()) < len(prefix) + _NPY_DIGITS + 6 or bool((10 + length > sizes).any()):
        return None
    text = members.data[np.minimum(offsets[:, None] + 10 + np.arange(width), offsets[:, None] + 9 + length[:, None])]
    if not (text[:, : len(prefix)] == prefix).all():
        return None
    # The shape "(N,)": digits, then ",), }", then spaces up to the newline that ends the header.
    digits = text[:, len(prefix) : len(prefix) + _NPY_DIGITS]
    is_digit = (digits >= ord("0")) & (digits <= ord("9"))
    ndigits = np.argmin(is_digit, axis=1)  # the first non-digit
    if int(ndigits.min()) == 0 or bool(is_digit.all(axis=1).any()):
        return None
    place = np.arange(_NPY_DIGITS)
    in_number = place[None, :] < ndigits[:, None]
    powers = np.where(in_number, ndigits[:, None] - 1 - place[None, :], 0)
    count = (np.where(in_number, digits.astype(np.int64) - ord("0"), 0) * 10**powers).sum(axis=1)
    after = len(prefix) + ndigits  # where ",), }" starts
    closing = text[np.arange(n)[:, None], after[:, None] + np.arange(5)]
    column = np.arange(width)[None, :]
    padding = (column >= after[:, None] + 5) & (column < length[:, None] - 1)
    if (
        not (closing == np.frombuffer(b",), }", np.uint8)).all()
        or not (text[np.arange(n), length - 1] == ord("\n")).all()
        or not ((text == ord(" ")) | ~padding).all()
    ):
        return None
    body = sizes - 10 - length
    if not (count * dtype.itemsize == body).all():
        return None
    skip[present], counts[present] = 10 + length, count
    return skip, counts


def _npy_bodies_one_by_one(members: _Members, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """`_npy_bodies` for any header numpy reads (other versions, byte orders, layouts), a
    member at a time; a member that is not a 1-D ``dtype`` array, or is cut short, is named."""
    skip, counts = np.zeros(len(members.rows), np.int64), np.zeros(len(members.rows), np.int64)
    for k in range(len(members.rows)):
        value = members.member(k)
        if value is None:
            continue
        got, shape, start = npy_header(value, members.where(k))
        if len(shape) != 1 or got.newbyteorder("=") != dtype or (got.byteorder == ">" and dtype.itemsize > 1):
            raise DatasetFormatError(
                f"{members.where(k)} holds a {len(shape)}-D {got} array; every {members.ext} member must be a "
                f"1-D {dtype} array (the first one's)."
            )
        if len(value) - start < shape[0] * dtype.itemsize:
            raise DatasetFormatError(
                f"{members.where(k)} is cut short: {len(value) - start} of {shape[0] * dtype.itemsize} bytes."
            )
        skip[k], counts[k] = start, shape[0]
    return skip, counts


WEBDATASET = WebDatasetFormat()
