"""JSON Lines file names and compressions: which names are JSON Lines, and the decompressed
bytes of a local file.

Contract: ``*.jsonl``, ``*.json`` and ``*.ndjson``, each plain, ``.gz`` (gzip) or ``.zst`` /
``.zstd`` (zstd, frames read across). A file that fails to open or decompress is reported by
`_read_error`: a missing file as it is, an OS read failure as
:class:`~zephon_columnar.io.fs.UnreadableFileError`, anything else as a truncated or corrupt file
(DatasetFormatError naming it).
"""

from __future__ import annotations

import gzip
from typing import IO, Literal, cast

from zephon_columnar.errors import DatasetFormatError
from zephon_columnar.io import fs

Compression = Literal["gzip", "zstd"] | None


_BASES = (".jsonl", ".json", ".ndjson")
_COMPRESSIONS: dict[str, Compression] = {"": None, ".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
JSONL_SUFFIXES = tuple(b + c for b in _BASES for c in _COMPRESSIONS)


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


def _read_exactly(stream: IO[bytes], n: int) -> bytes:
    parts, got = [], 0
    while got < n:
        block = stream.read(n - got)
        if not block:
            break
        parts.append(block)
        got += len(block)
    return b"".join(parts)


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
