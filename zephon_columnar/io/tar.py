"""Tar archives' members, read from their 512-byte headers: each regular file's name, where its
data starts and its size, without reading the data (WebDataset shards are tars of many small
members; `zephon_columnar.io.webdataset` groups them into samples).

`members` walks the headers one at a time (POSIX ustar, GNU long names, pax ``path``/``size``
records; ``tarfile`` for the rare encodings) and raises ``tarfile.ReadError`` naming what is
wrong (`NotATarError` when the file does not start with a tar header); `members_at_once` reads
a plain archive's headers as array operations, or says None.

Example:
    >>> import io, tarfile
    >>> with tarfile.open("two.tar", "w") as archive:
    ...     for name, data in (("a.txt", b"hi"), ("dir/b.json", b"{}")):
    ...         info = tarfile.TarInfo(name)
    ...         info.size = len(data)
    ...         archive.addfile(info, io.BytesIO(data))
    >>> size = os.path.getsize("two.tar")
    >>> list(members("two.tar", size))
    [('a.txt', 512, 2), ('dir/b.json', 1536, 2)]
    >>> names, offsets, sizes = members_at_once("two.tar", size)
    >>> names.to_pylist(), offsets.tolist(), sizes.tolist()
    (['a.txt', 'dir/b.json'], [512, 1536], [2, 2])
"""

from __future__ import annotations

import mmap
import os
import tarfile
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt
import pyarrow as pa

BLOCK = 512
_ZERO_BLOCK = bytes(BLOCK)
_REGULAR = (b"0", b"\0", b"7")  # regular and contiguous files; links, folders and devices hold no data


def members(local: str, size: int) -> Iterator[tuple[str, int, int]]:
    """``(name, data offset, data size)`` of each regular file in the tar at ``local``, read from
    its 512-byte headers (POSIX ustar, GNU long names, pax ``path``/``size`` records), skipping
    the data. 8x faster than ``tarfile``'s member objects on WebDataset shards (many small
    members); a header it does not know (base-256 sizes, sparse files) hands over to ``tarfile``."""
    if size == 0:
        return
    if size < BLOCK:
        with open(local, "rb") as f:
            raise _no_header(0, f"the file is {size} bytes, shorter than one 512-byte header", f.read(6))
    with open(local, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
        at, long_name, pax = 0, None, {}
        headers, sums = [], []  # each header's block and stored checksum, checked at the end at once
        while at + BLOCK <= size:
            header = view[at : at + BLOCK]
            if header == _ZERO_BLOCK:  # the end-of-archive marker
                if any(_trailing(local, at)):
                    raise tarfile.ReadError("data after the end-of-archive marker could not be read")
                break
            stored = header[148:156].split(b"\0", 1)[0].strip()
            if not stored:
                raise _no_header(at, "it has no checksum", bytes(header[:6]))
            headers.append(at // BLOCK)
            sums.append(_octal_field(stored, "checksum", at, bytes(header[:6])))
            kind, raw_size = header[156:157], header[124:136]
            if raw_size[:1] in (b"\x80", b"\xff") or kind == b"S":
                yield from _tarfile_members(local)  # rare encodings: tarfile reads them all
                return
            length = _octal_field(raw_size.split(b"\0", 1)[0].strip() or b"0", "size", at, bytes(header[:6]))
            data = at + BLOCK
            if data + length > size:
                raise tarfile.ReadError(f"a member at byte {at} ends past the file's end")
            if kind == b"L":  # GNU: the next member's name is this member's data
                long_name = view[data : data + length].split(b"\0", 1)[0].decode("utf-8")
            elif kind == b"x":  # pax: key=value records for the next member
                pax = _pax_records(view[data : data + length])
            elif kind in _REGULAR:
                name = header[:100].split(b"\0", 1)[0]
                prefix = header[345:500].split(b"\0", 1)[0] if header[257:262] == b"ustar" else b""
                full = long_name or pax.get("path") or (prefix + b"/" + name if prefix else name).decode("utf-8")
                length = int(pax.get("size", length))
                yield full, data, length
                long_name, pax = None, {}
            elif kind != b"g":
                long_name, pax = None, {}
            at = data + -(-length // BLOCK) * BLOCK
        else:
            if at != size or long_name is not None or pax:  # no end marker: only whole members may end it
                raise tarfile.ReadError("the archive ends inside a member; is it cut short?")
        _check_sums(view, np.asarray(headers, np.int64), np.asarray(sums, np.int64))


class NotATarError(tarfile.ReadError):
    """The file does not start with a tar header: it is not a tar archive at all (another format,
    a compressed tar under a plain ``.tar`` name, random bytes)."""


_COMPRESSED = {b"\x1f\x8b": "gzip", b"\x28\xb5\x2f\xfd": "zstd", b"BZh": "bzip2", b"\xfd7zXZ": "xz"}


def _no_header(at: int, why: str, first: bytes = b"") -> tarfile.ReadError:
    """The error for the block at byte ``at`` that should be a tar header and is not (``why``);
    ``first``: the file's first bytes, to name a compressed file."""
    if at == 0:
        packed = next((kind for magic, kind in _COMPRESSED.items() if first.startswith(magic)), None)
        hint = f"; it starts as a {packed}-compressed file does: decompress it first" if packed else ""
        return NotATarError(f"no tar header at byte 0: {why}{hint}")
    return tarfile.ReadError(f"no tar header at byte {at}, where the previous member ends ({why}); is it damaged?")


def _octal_field(digits: bytes, what: str, at: int, first: bytes) -> int:
    """The octal number of a header field (``what``) of the header at byte ``at`` (``first``:
    the header's first bytes, for `_no_header`)."""
    try:
        return int(digits, 8)
    except ValueError:
        raise _no_header(at, f"the {what} field {bytes(digits[:12])!r} is not an octal number", first) from None


_USTAR = np.frombuffer(b"ustar", np.uint8)
_PLAIN_KINDS = np.frombuffer(b"0\x007x5g12", np.uint8)  # files, pax records, folders, links: no long names


def _octal(fields: np.ndarray) -> npt.NDArray[np.int64] | None:
    """The values of fixed-width octal fields, one a row (digits only; None if any is not)."""
    if not ((fields >= ord("0")) & (fields <= ord("7"))).all():
        return None
    values: npt.NDArray[np.int64] = (fields.astype(np.int64) - ord("0")) @ (
        8 ** np.arange(fields.shape[1] - 1, -1, -1, dtype=np.int64)
    )
    return values


def members_at_once(local: str, size: int) -> tuple[pa.StringArray, np.ndarray, np.ndarray] | None:
    """``(names, data offsets, data sizes)`` of the regular files of a plain tar, read from its
    header blocks as array operations: ustar headers with all-digit size and checksum fields, pax
    records that rename or resize nothing, no GNU long names or ustar name prefixes, nothing after
    the last member but zero blocks (what ``tarfile``, GNU tar and WebDataset's ``TarWriter``
    write). None for any other archive, or a damaged one: `members` reads those one at a time
    and names the fault.

    The header blocks are found without walking: every 512-byte block with the ustar magic is a
    candidate, and the candidates are the headers exactly when each one's data ends where the
    next begins (a block of data that happens to hold the magic breaks that chain).
    """
    if size < BLOCK:
        return None
    with open(local, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
        return _headers_at_once(view, size)


def _headers_at_once(view: mmap.mmap, size: int) -> tuple[pa.StringArray, np.ndarray, np.ndarray] | None:
    """`members_at_once` over the mapped archive ``view``."""
    blocks = np.frombuffer(view, np.uint8, count=size // BLOCK * BLOCK).reshape(-1, BLOCK)
    heads = np.flatnonzero(blocks[:, 257] == _USTAR[0])  # one byte of every block first: 5x fewer reads
    heads = heads[(blocks[heads, 257:262] == _USTAR).all(axis=1)]
    if len(heads) == 0 or heads[0] != 0:
        return None
    header = blocks[heads]  # a copy: (headers, 512)
    lengths, stored = _octal(header[:, 124:135]), _octal(header[:, 148:154])
    kinds = header[:, 156]
    if lengths is None or stored is None or not np.isin(kinds, _PLAIN_KINDS).all():
        return None
    after = heads + 1 + (lengths + BLOCK - 1) // BLOCK  # the block after each member's data
    end = int(after[-1]) * BLOCK
    if not (heads[1:] == after[:-1]).all() or end > size or kinds[-1] == ord("x"):
        return None
    if end < size and np.frombuffer(view, np.uint8, count=size - end, offset=end).any():
        return None  # anything after the last member but the zero end-of-archive blocks
    if not (_checksums(header) == stored).all():
        return None
    pax = kinds == ord("x")
    width = int(lengths[pax].max(initial=0))
    if width > BLOCK:
        return None
    # Each pax header's records ("<length> <key>=<value>\n", zero-padded) side by side: one that
    # renames or resizes its member sends the archive member by member.
    records = blocks[heads[pax] + 1, :width].tobytes()
    del blocks
    if b" path=" in records or b" size=" in records:
        return None
    regular = np.isin(kinds, np.frombuffer(b"0\x007", np.uint8))
    posix = (header[:, 262] == 0) & regular  # "ustar\0": a 155-byte name prefix may lead the name
    if header[posix][:, 345:500].any():
        return None
    fields = header[regular][:, :100]
    name_lengths = np.where((fields == 0).any(axis=1), np.argmax(fields == 0, axis=1), 100)
    name_offsets = np.zeros(len(fields) + 1, np.int32)
    np.cumsum(name_lengths, out=name_offsets[1:])
    packed = fields[np.arange(100)[None, :] < name_lengths[:, None]]  # row by row: the names back to back
    raw = pa.Array.from_buffers(pa.binary(), len(fields), [None, pa.py_buffer(name_offsets), pa.py_buffer(packed)])
    try:
        names = raw.cast(pa.string())
    except pa.ArrowInvalid:  # not UTF-8: named member by member
        return None
    return names, (heads[regular] + 1) * BLOCK, lengths[regular]


def _checksums(headers: np.ndarray) -> npt.NDArray[np.int64]:
    """Each header block's checksum: its bytes summed, the checksum field counted as spaces."""
    sums: npt.NDArray[np.int64] = (
        headers.sum(axis=1, dtype=np.int64) - headers[:, 148:156].sum(axis=1, dtype=np.int64) + 8 * ord(" ")
    )
    return sums


def _check_sums(view: mmap.mmap, blocks: np.ndarray, stored: np.ndarray) -> None:
    """Every header's checksum (`_checksums`) against the one it stores, in one vectorized pass
    over the header blocks."""
    matrix = np.frombuffer(view, dtype=np.uint8, count=(len(view) // BLOCK) * BLOCK).reshape(-1, BLOCK)
    bad_block = None
    for first in range(0, len(blocks), 4096):  # 2 MiB of headers a step
        bad = np.flatnonzero(_checksums(matrix[blocks[first : first + 4096]]) != stored[first : first + 4096])
        if len(bad):
            bad_block = int(blocks[first + bad[0]])
            break
    # The view of the map goes before the error does: a traceback holding it would keep the
    # map from closing (BufferError) and hide the error.
    del matrix
    if bad_block == 0:
        raise _no_header(0, "its checksum does not match its bytes", bytes(view[:6]))
    if bad_block is not None:
        raise tarfile.ReadError(f"a bad header checksum at byte {bad_block * BLOCK}")


def _pax_records(data: bytes) -> dict[str, str]:
    """The ``path`` and ``size`` of a pax extended header (``"<length> <key>=<value>\\n"`` records)."""
    out, at = {}, 0
    while at < len(data) and data[at : at + 1] != b"\0":
        space = data.index(b" ", at)
        end = at + int(data[at:space])
        key, _, value = data[space + 1 : end - 1].partition(b"=")
        if key in (b"path", b"size"):
            out[key.decode()] = value.decode("utf-8")
        at = end
    return out


def _tarfile_members(local: str) -> Iterator[tuple[str, int, int]]:
    with tarfile.open(local, mode="r:") as tar:
        for member in tar:
            if member.isfile():
                yield member.name, member.offset_data, member.size
        end = tar.offset
    if end < os.path.getsize(local) and any(_trailing(local, end)):
        raise tarfile.ReadError("data after the end-of-archive marker could not be read")


def _trailing(local: str, offset: int) -> bytes:
    """The bytes after the last header tarfile read (zeros: the end-of-archive blocks)."""
    with open(local, "rb") as f:
        f.seek(offset)
        return f.read(1 << 16).strip(b"\0")
