"""Where files live: local paths and fsspec URLs, directory listing, and the shard cache.

Local paths and ``file://`` URLs are handled with :mod:`os` directly (no fsspec round trip on
the hot path); every other URL (``memory://``, ``s3://``, any installed fsspec backend, chained
``simplecache::...`` URLs) goes through :func:`fsspec.core.url_to_fs`.

Readers only ever read local files: a remote shard is downloaded once into the
:class:`ShardCache` (atomically, once for all the threads and processes that share its folder)
and read from there. The
pipeline's ``prefetch()`` operator warms that cache from background threads with
:meth:`ShardCache.ensure_local`.

Every remote request (listing, sizes, small reads, downloads) is retried after transient
errors (:mod:`zephon_columnar.io.retry`); a download that breaks half way resumes where it
broke. The policies are the default cache's (``CacheOptions.open_retry_attempts`` for metadata,
``download_retry`` and ``download_timeout`` for downloads).

Example:
    >>> list_data_files("data/web")  # doctest: +ELLIPSIS
    ['/.../data/web/part-000.parquet', '/.../data/web/part-001.parquet']
    >>> local_path("memory://corpus/chat/part-000.jsonl")  # doctest: +ELLIPSIS
    '/.../shards/...-part-000.jsonl'
"""

from __future__ import annotations

import glob as globlib
import hashlib
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any, Literal, NamedTuple, TypeGuard, TypeVar

from zephon_columnar.errors import DatasetNotFoundError, ZephonError
from zephon_columnar.io import locks
from zephon_columnar.io.options import CacheOptions
from zephon_columnar.io.retry import RetryPolicy, retrying

T = TypeVar("T")

_CACHE_ENV = "ZEPHON_COLUMNAR_CACHE"
_COPY_BLOCK = 8 << 20  # bytes per range request when a download resumes
_ROOM_POLL_S = 0.02  # how often a download waiting for room in a full cache looks again
_OPEN_TRIES = 5  # ensure_local + open, again when another process evicted the copy in between
_CACHE_LOCK = "cache"  # the cache-wide lock (entry locks are named after their entries)
_REMEMBERED = ".remembered"  # small facts made once per node (Parquet footers), in the cache root
# CacheOptions' defaults, as Zephon's: 12 download retries within 180 s; 5 tries of a metadata
# request with 0.1-2 s between them.
DOWNLOAD_POLICY = CacheOptions().download_policy()
METADATA_POLICY = CacheOptions().metadata_policy()


# ---------------------------------------------------------------- unreadable files
class UnreadableFileError(ZephonError, OSError):
    """A data file or directory exists but the operating system refused or failed to read it
    (an I/O error, ...). Not a content problem: the bytes were never seen."""


class FilePermissionError(UnreadableFileError, PermissionError):
    """A data file or directory exists but this process may not read it (``except
    PermissionError`` catches it)."""


def is_read_failure(err: BaseException) -> TypeGuard[OSError]:
    """Whether ``err`` is the OS refusing or failing a read rather than bad content.

    That is a PermissionError, or an OSError that carries an errno (Arrow sets one too, e.g.
    ``PermissionError(13, "Failed to open local file ...")``), except file-not-found (a missing
    file keeps its own error). Content errors carry none: gzip's ``BadGzipFile``, Arrow's
    "Parquet magic bytes not found", ...

    Example:
        >>> is_read_failure(PermissionError(13, "Permission denied")), is_read_failure(OSError("Not a gzipped file"))
        (True, False)
    """
    if isinstance(err, FileNotFoundError) or not isinstance(err, OSError):
        return False
    return isinstance(err, PermissionError) or err.errno is not None


def unreadable_file(url: str, err: OSError) -> UnreadableFileError:
    """The error to raise (``from err``) when the OS refused or failed to read the file ``url``:
    a :class:`FilePermissionError` when permission was refused, else an
    :class:`UnreadableFileError`; the message names the file, says why it cannot be read and
    what to do.

    Example:
        >>> str(unreadable_file("/data/a.parquet", PermissionError(13, "Permission denied")))
        '/data/a.parquet: cannot be read (Permission denied). Give this process read permission on it (e.g. chmod a+r), or remove it from the dataset directory.'
    """  # noqa: E501 - a doctest's expected output is the message verbatim: it cannot wrap
    if isinstance(err, PermissionError):
        return FilePermissionError(
            f"{url}: cannot be read ({_reason(err)}). Give this process read permission "
            "on it (e.g. chmod a+r), or remove it from the dataset directory."
        )
    return UnreadableFileError(
        f"{url}: cannot be read ({_reason(err)}). The operating system failed the read; "
        "check the file and the storage it is on, or remove it from the dataset directory."
    )


def unreadable_dir(dataset: str, url: str, err: OSError) -> UnreadableFileError:
    """Like :func:`unreadable_file`, for the directory ``url`` of the dataset ``dataset``."""
    where = f"Dataset {dataset!r}: cannot list the directory {url} ({_reason(err)})."
    if isinstance(err, PermissionError):
        return FilePermissionError(
            f"{where} Give this process read and execute permission on it "
            "(e.g. chmod a+rx), or pass a directory it can read."
        )
    return UnreadableFileError(
        f"{where} The operating system failed the read; check the directory and the storage it is on."
    )


def _reason(err: OSError) -> str:
    if err.errno is not None:
        return os.strerror(err.errno)
    return str(err) or type(err).__name__


# ---------------------------------------------------------------- URL classification
def is_local(url: str) -> bool:
    """True for a plain path or a ``file://`` URL; False for any other fsspec URL.

    Example:
        >>> is_local("/data/a.parquet"), is_local("file:///data/a.parquet"), is_local("memory://a")
        (True, True, False)
    """
    url = os.fspath(url)
    if url.startswith("file://"):
        return True
    return "://" not in url and "::" not in url


def to_local(url: str) -> str:
    """The absolute OS path of a local path or ``file://`` URL (the caller checks ``is_local``)."""
    url = os.fspath(url)
    if url.startswith("file://"):
        url = url[len("file://") :]
        # file://localhost/abs/path is the RFC form; fsspec also writes file:///abs/path.
        if url.startswith("localhost/"):
            url = url[len("localhost") :]
    return os.path.abspath(os.path.expanduser(url))


def url_to_fs(url: str) -> tuple[Any, str]:
    """``(filesystem, path inside it)`` for a remote URL, via fsspec.

    An unknown protocol becomes a :class:`DatasetNotFoundError` that says which package to
    install, instead of fsspec's bare ``ValueError``.
    """
    import fsspec.core

    try:
        fs_and_path: tuple[Any, str] = fsspec.core.url_to_fs(url)
        return fs_and_path
    except (ImportError, ValueError) as err:
        raise DatasetNotFoundError(
            f"{url}: cannot open this URL with fsspec ({err}). Install the fsspec backend for "
            "its protocol (e.g. s3fs for s3://, gcsfs for gs://), or pass a local path."
        ) from err


def _unstrip(fs: Any, path: str) -> str:
    """fsspec path -> URL with its protocol, so a shard path can be opened again anywhere."""
    return str(fs.unstrip_protocol(path))


# ---------------------------------------------------------------- queries
def remote_call(url: str, what: str, call: Callable[[], T]) -> T:
    """``call()`` (a request about the remote ``url``), retried as the default cache's
    :meth:`ShardCache.remote_call` does."""
    return default_shard_cache().remote_call(url, what, call)


def exists(url: str) -> bool:
    """Whether ``url`` (a file or a directory) exists."""
    if is_local(url):
        return os.path.exists(to_local(url))
    fs, path = url_to_fs(url)
    return bool(remote_call(url, "existence check", lambda: fs.exists(path)))


def isdir(url: str) -> bool:
    """Whether ``url`` is a directory."""
    if is_local(url):
        return os.path.isdir(to_local(url))
    fs, path = url_to_fs(url)
    return bool(remote_call(url, "directory check", lambda: fs.isdir(path)))


def file_size(url: str) -> int:
    """Size of the file ``url`` in bytes."""
    if is_local(url):
        return os.path.getsize(to_local(url))
    fs, path = url_to_fs(url)
    return int(remote_call(url, "size request", lambda: fs.size(path)))


def file_info(url: str) -> tuple[int, str]:
    """``(size in bytes, a version tag)`` of a file: the tag changes when the file is rewritten.

    Locally the tag is the modification time in nanoseconds; remotely it is whatever the backend
    reports (ETag, mtime, creation time), or empty when it reports nothing.
    """
    if is_local(url):
        st = os.stat(to_local(url))
        return st.st_size, str(st.st_mtime_ns)
    fs, path = url_to_fs(url)
    info = remote_call(url, "metadata request", lambda: fs.info(path))
    tag = next(
        (
            str(info[k])
            for k in ("ETag", "etag", "mtime", "LastModified", "last_modified", "updated", "created")
            if info.get(k) is not None
        ),
        "",
    )
    return int(info["size"]), tag


def join(url: str, name: str) -> str:
    """``url/name`` for a local path or a URL."""
    if is_local(url):
        return os.path.join(to_local(url), name)
    return url.rstrip("/") + "/" + name


def basename(url: str) -> str:
    """The last path component of a local path or a URL."""
    return url.rstrip("/").rsplit("/", 1)[-1]


def list_data_files(url: str) -> list[str]:
    """Files directly inside the directory ``url``, sorted by name.

    Not recursive. Hidden files (``.foo``) and ``_``-prefixed files (``_SUCCESS``,
    ``_metadata``, ``_committed_...``) are skipped: writers such as Spark leave them beside
    the data; so is ``index.json``, the shard index ``build_index`` writes. Local directories
    give absolute paths; remote ones give full URLs.

    Example:
        >>> list_data_files("memory://corpus/chat")
        ['memory:///corpus/chat/part-000.jsonl', 'memory:///corpus/chat/part-001.jsonl']
    """
    if is_local(url):
        root = to_local(url)
        with os.scandir(root) as it:
            names = [e.name for e in it if e.is_file() and _is_data_name(e.name)]
        return [os.path.join(root, n) for n in sorted(names)]
    fs, path = url_to_fs(url)
    entries = remote_call(url, "directory listing", lambda: fs.ls(path, detail=True))
    files = [e["name"] for e in entries if e.get("type") == "file" and _is_data_name(basename(e["name"]))]
    return [_unstrip(fs, p) for p in sorted(files, key=basename)]


def list_dirs(url: str) -> list[str]:
    """Folders directly inside the directory ``url``, sorted by name (hidden and
    ``_``-prefixed ones skipped, as `list_data_files` skips such files).

    Example:
        >>> [basename(d) for d in list_dirs("data")]
        ['chat', 'web', 'wiki_train']
    """
    if is_local(url):
        root = to_local(url)
        with os.scandir(root) as it:
            names = [e.name for e in it if e.is_dir() and not e.name.startswith((".", "_"))]
        return [os.path.join(root, n) for n in sorted(names)]
    fs, path = url_to_fs(url)
    entries = remote_call(url, "directory listing", lambda: fs.ls(path, detail=True))
    dirs = [
        e["name"] for e in entries if e.get("type") == "directory" and not basename(e["name"]).startswith((".", "_"))
    ]
    return [_unstrip(fs, p) for p in sorted(dirs, key=basename)]


def glob_files(pattern: str) -> list[str]:
    """Files matching the glob ``pattern`` (``*``, ``?``, ``[...]``; ``**`` for any depth),
    sorted; local patterns give absolute paths, remote ones full URLs.

    Example:
        >>> [basename(f) for f in glob_files("data/web/*.parquet")]
        ['part-000.parquet', 'part-001.parquet']
    """
    if is_local(pattern):
        matches = globlib.glob(to_local(pattern), recursive=True)
        return sorted(os.path.abspath(m) for m in matches if os.path.isfile(m))
    fs, path = url_to_fs(pattern)
    found = remote_call(pattern, "glob", lambda: fs.glob(path, detail=True))
    return sorted(_unstrip(fs, p) for p, info in found.items() if info.get("type") == "file")


def is_glob(path: str) -> bool:
    """Whether ``path`` is a glob pattern (has ``*``, ``?`` or ``[``)."""
    return any(c in path for c in "*?[")


INDEX_FILE = "index.json"


def _is_data_name(name: str) -> bool:
    return not (name.startswith((".", "_")) or name == INDEX_FILE)


def open_binary(url: str) -> IO[bytes]:
    """Open ``url`` for binary reading (a plain file locally, an fsspec file otherwise)."""
    if is_local(url):
        return open(to_local(url), "rb")
    fs, path = url_to_fs(url)
    file: IO[bytes] = fs.open(path, "rb")
    return file


def read_range(url: str, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of a remote file (one range request where the backend allows)."""
    fs, path = url_to_fs(url)
    data: bytes = fs.cat_file(path, start=start, end=end)
    return data


def read_bytes(url: str) -> bytes:
    """The whole content of a (small) file, e.g. ``state.json``."""

    def read() -> bytes:
        with open_binary(url) as f:
            return f.read()

    return read() if is_local(url) else remote_call(url, "read", read)


def write_bytes(url: str, data: bytes) -> None:
    """Write a (small) file whole: atomically on local disk, one put to object storage."""
    if is_local(url):
        atomic_write(to_local(url), data)
        return
    fs, path = url_to_fs(url)
    remote_call(url, "write", lambda: fs.pipe_file(path, data))


def canonical(url: str) -> str:
    """A stable identity of a file: the absolute path locally, the full URL otherwise."""
    if is_local(url):
        return to_local(url)
    fs, path = url_to_fs(url)
    return _unstrip(fs, path)


# ---------------------------------------------------------------- cache roots
def cache_root() -> str:
    """The root of zephon_columnar's on-disk caches: ``$ZEPHON_COLUMNAR_CACHE`` if set, else
    ``~/.cache/zephon_columnar``. Read at call time so tests and jobs can point it elsewhere.

    Subfolders: ``shards/`` (downloaded remote shards), ``jsonl_index/`` (JSONL line indexes and
    the schema of every line).
    """
    env = os.environ.get(_CACHE_ENV)
    if env:
        return os.path.abspath(os.path.expanduser(env))
    return os.path.join(os.path.expanduser("~"), ".cache", "zephon_columnar")


def atomic_write(path: str, data: bytes | memoryview) -> None:
    """Write ``data`` to ``path`` so that readers see either nothing or the whole file.

    A unique temp file beside ``path`` is renamed over it; two writers racing on the same key
    write identical bytes, so whichever rename lands last is as good as the first.
    """
    tmp = _temp_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        _remove_quietly(tmp)
        raise


def _temp_name(path: str) -> str:
    return f"{path}.tmp-{os.getpid()}-{threading.get_ident()}-{uuid.uuid4().hex[:8]}"


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


# ---------------------------------------------------------------- shard cache
class CacheCounts(NamedTuple):
    """Cache lookups answered from a local copy, downloads, and remote requests retried."""

    hits: int
    downloads: int
    retries: int

    def since(self, before: CacheCounts) -> CacheCounts:
        return CacheCounts(*(now - then for now, then in zip(self, before)))


class ShardCache:
    """Local copies of remote shards, downloaded once, shared by threads and processes.

    Contract:
        - ``ensure_local(url)`` returns a local path holding the bytes of ``url``. Local paths
          and ``file://`` URLs are returned as-is (absolute), without copying.
        - A remote file is downloaded once into ``root`` (default ``cache_root()/shards``)
          under a name keyed by a hash of its URL and size, so a rewritten file of another size
          gets a fresh copy. Same URL and size means same content: rewrite remote data under a
          new name (or clear the cache) if you change bytes without changing the size.
        - Downloads are single-flight across the threads and processes that share ``root``
          (a node's ranks): the first caller claims the entry (an ``flock`` on its file in
          ``root/.locks``, `zephon_columnar.io.locks`), the others wait for it and then use the
          finished copy. A download writes a temp file beside the copy and renames it into place
          only once its size is checked, so a process killed half way leaves only a temp file:
          never trusted, removed by the next claim of the entry (or an eviction), and its claim
          dies with it (the kernel drops the lock), so a waiter takes over and downloads.
        - A download that fails transiently is retried (``download_policy``), resuming after
          the bytes it already has; metadata requests follow ``metadata_policy``. When the
          tries run out, :class:`~zephon_columnar.io.retry.RetriesExhaustedError` names the URL.
        - ``limit_bytes`` (None: no limit) bounds the files in ``root``, copies and downloads
          in flight together, across processes: a download first asks for room under a
          cache-wide lock, where the least recently used copies (by the time they were last
          returned) are deleted until the finished copies, the room granted to downloads in
          flight and the new one fit; then it is granted its size. When that needs a copy that
          cannot be deleted now (being opened: `open_local`), or room a download in flight
          holds, it waits for them; a shard bigger than the whole limit is let through alone.
          A reader that has a copy open keeps reading it (POSIX; its disk space comes back
          when it closes it); one that reopens it later gets a fresh download.
        - ``remember(key, make)``: small bytes (a Parquet footer) made once for all the
          processes, kept in ``root/.remembered`` (outside the limit).

    Example:
        >>> cache = ShardCache("shards")
        >>> cache.ensure_local("memory://corpus/chat/part-000.jsonl")  # doctest: +ELLIPSIS
        'shards/...-part-000.jsonl'
        >>> cache.downloads
        1
    """

    def __init__(
        self,
        root: str | None = None,
        *,
        limit_bytes: int | None = None,
        download_policy: RetryPolicy = DOWNLOAD_POLICY,
        metadata_policy: RetryPolicy = METADATA_POLICY,
    ) -> None:
        self._root = root
        self.limit_bytes = limit_bytes
        self.download_policy = download_policy
        self.metadata_policy = metadata_policy
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._count_guard = threading.Lock()
        # what this instance did (for tests and fetch statistics)
        self.downloads = 0
        self.hits = 0
        self.evictions = 0
        self.retries = 0  # remote requests tried again after a transient error (downloads and metadata)
        self._by_thread = threading.local()  # the same counts per thread: a fetch group's share

    def thread_counts(self) -> CacheCounts:
        """What this thread has asked of the cache so far; the difference over one read is that
        read's share (`FetchOp` reports it per shard group)."""
        mine = self._by_thread
        return CacheCounts(
            hits=getattr(mine, "hits", 0), downloads=getattr(mine, "downloads", 0), retries=getattr(mine, "retries", 0)
        )

    def _count(self, name: Literal["hits", "downloads", "retries"]) -> None:
        with self._count_guard:
            setattr(self, name, getattr(self, name) + 1)
        setattr(self._by_thread, name, getattr(self._by_thread, name, 0) + 1)

    def remote_call(self, url: str, what: str, call: Callable[[], T]) -> T:
        """``call()`` (a metadata request about the remote ``url``), retried after transient
        errors with ``metadata_policy``; ``what`` names the request in the final error."""
        return retrying(call, url=url, what=what, policy=self.metadata_policy, on_retry=self._count_retry)

    def _count_retry(self, err: BaseException) -> None:
        self._count("retries")

    @property
    def root(self) -> str:
        return self._root if self._root is not None else os.path.join(cache_root(), "shards")

    @property
    def configured_root(self) -> str | None:
        """The root this cache was made with (None: the default, ``cache_root()/shards``)."""
        return self._root

    def cached_path(self, url: str, size: int) -> str:
        """Where ``url`` of ``size`` bytes is (or will be) stored in this cache."""
        key = hashlib.sha256(f"{canonical(url)}\0{size}".encode()).hexdigest()[:32]
        # Keep the file name (sanitized) so readers can still tell `.jsonl.gz` from `.jsonl`.
        name = re.sub(r"[^A-Za-z0-9._-]", "_", basename(url))[-100:]
        return os.path.join(self.root, f"{key}-{name}")

    def ensure_local(self, url: str, size: int | None = None) -> str:
        """A local path with the content of ``url``; downloads it on first use.

        ``size`` (bytes, when the caller knows it from discovery) saves one metadata request.
        """
        if is_local(url):
            return to_local(url)
        try:
            return self._ensure_remote(url, size)
        except FileNotFoundError as err:
            if isinstance(err, DatasetNotFoundError):
                raise
            raise DatasetNotFoundError(
                f"{url}: the file does not exist (any more): {err}. It was there when the dataset was "
                "discovered; restore it, or discover the dataset again."
            ) from err

    def _ensure_remote(self, url: str, size: int | None) -> str:
        fs, path = url_to_fs(url)
        if size is None:
            size = int(self.remote_call(url, "size request", lambda: fs.size(path)))
        target = self.cached_path(url, size)

        def download(claim: int) -> None:
            self._make_room(size, claim)
            self._download(fs, path, url, target, size)

        return self._find_or_make(target, lambda: _has_size(target, size), download)

    def derived(self, url: str, size: int, make: Callable[[], bytes], *, made_size: int | None = None) -> str:
        """A local copy of ``make()``'s bytes (made from ``url``: a shard's decompressed bytes),
        where `cached_path` puts ``url`` of ``size`` bytes: made once, found there after (when
        ``made_size`` is given, only a copy of that size counts), kept within ``limit_bytes`` as
        downloads are, and made again once evicted. Within one process, callers for the same
        copy, here and in other processes, wait for one ``make``."""
        target = self.cached_path(url, size)

        def ready() -> bool:
            return _has_size(target, made_size) if made_size is not None else os.path.exists(target)

        def keep(claim: int) -> None:
            data = make()
            self._make_room(len(data), claim)
            atomic_write(target, data)

        return self._find_or_make(target, ready, keep)

    def open_local(self, url: str, size: int | None, opener: Callable[[str], T]) -> T:
        """``opener(path)`` on the local copy of ``url`` (as `ensure_local` gives it), opened
        while no process may evict it: once open, it stays readable (POSIX) whatever the cache
        does. A copy that another process evicted between the two is fetched again."""
        for _ in range(_OPEN_TRIES):
            path = self.ensure_local(url, size)
            if is_local(url) or self.limit_bytes is None:  # nothing is ever evicted
                return opener(path)
            with locks.held(self.root, os.path.basename(path), shared=True):
                if os.path.exists(path):
                    return opener(path)
        return opener(self.ensure_local(url, size))

    def remember(self, key: str, make: Callable[[], bytes]) -> bytes:
        """``make()``'s bytes (small: a Parquet footer), made once for every thread and process
        sharing this cache, keyed by ``key`` (which names the source's version: URL, size and
        ETag), and read from ``root/.remembered`` after. A cache folder this process cannot
        write only costs the sharing: ``make()`` is called each time."""
        digest = hashlib.sha256(key.encode()).hexdigest()[:32]
        folder = os.path.join(self.root, _REMEMBERED)
        target = os.path.join(folder, digest)
        try:
            with open(target, "rb") as f:
                return f.read()
        except FileNotFoundError:
            pass
        try:
            os.makedirs(os.path.join(folder, locks.FOLDER), exist_ok=True)
        except OSError:  # read-only, or not ours
            return make()
        with self._lock_for(target), locks.held(folder, digest):
            try:
                with open(target, "rb") as f:  # another thread or process made it meanwhile
                    return f.read()
            except FileNotFoundError:
                pass
            data = make()
            try:
                atomic_write(target, data)
            except OSError:  # a full or read-only disk: remembered next time, perhaps
                pass
            return data

    def _find_or_make(self, target: str, ready: Callable[[], bool], make: Callable[[int], None]) -> str:
        """``target`` when ``ready()``, else after ``make(claim)`` (which makes room, then writes
        it), made by one thread of one process at a time: the others wait for the claim (the
        entry's lock, its file descriptor ``claim``) and find it made."""
        if ready():
            self._touch(target)
            return target
        with self._lock_for(target):
            if ready():  # another thread made it meanwhile
                self._touch(target)
                return target
            os.makedirs(self.root, exist_ok=True)
            with locks.held(self.root, os.path.basename(target)) as claim:
                assert claim is not None  # a waiting hold always gets the lock
                if ready():  # another process made it meanwhile
                    self._touch(target)
                    return target
                for stale in globlib.glob(globlib.escape(target) + ".tmp-*"):  # a dead claimant's
                    _remove_quietly(stale)
                try:
                    make(claim)
                finally:
                    locks.grant(claim, 0)  # the copy (or nothing) is on disk now: no room held
        return target

    def _make_room(self, incoming: int, claim: int) -> None:
        """Evict until ``incoming`` more bytes fit, then grant them to ``claim`` (waiting while
        the room is held by downloads in flight or copies being opened)."""
        if self.limit_bytes is None:
            return
        while True:
            with locks.held(self.root, _CACHE_LOCK):
                if self._evict(incoming):
                    locks.grant(claim, incoming)
                    return
            time.sleep(_ROOM_POLL_S)

    def _touch(self, target: str) -> None:
        """Mark a copy as just used (its mtime orders the evictions)."""
        self._count("hits")
        if self.limit_bytes is not None:
            try:
                os.utime(target)
            except OSError:
                pass

    def _evict(self, incoming: int) -> bool:
        """With the cache-wide lock held: delete the least recently used copies until they, the
        room granted to downloads in flight and ``incoming`` more bytes fit ``limit_bytes``;
        whether they fit now (or never will by waiting: nothing is in flight or being opened).
        Temp files nobody is writing (a killed download's) are removed on the way."""
        limit = self.limit_bytes
        assert limit is not None
        # The grants first, the copies after: a download that finishes between the two (its temp
        # file renamed, then its grant cleared) is still counted, by its grant (read the other way
        # round, it was missed: three shards on disk under a limit of two and a half).
        grants: dict[str, int] = {}
        with os.scandir(os.path.join(self.root, locks.FOLDER)) as it:
            for e in it:
                if e.name.endswith(".lock") and e.name != f"{_CACHE_LOCK}.lock":
                    name = e.name[: -len(".lock")]
                    grants[name] = locks.granted(self.root, name)
        in_flight = sum(grants.values())
        entries = []
        with os.scandir(self.root) as it:
            for e in it:
                if not e.is_file() or grants.get(e.name):  # a copy just made: counted by its grant
                    continue
                if ".tmp-" in e.name:  # a download in flight (counted by its grant), or a dead one's
                    owner = e.name.split(".tmp-", 1)[0]
                    with locks.held(self.root, owner, wait=False) as free:
                        if free is not None:
                            _remove_quietly(e.path)
                    continue
                try:
                    st = e.stat()
                except FileNotFoundError:  # evicted by another process meanwhile
                    continue
                entries.append((st.st_mtime_ns, e.path, st.st_size))
        total = sum(size for _, _, size in entries) + in_flight + incoming
        busy = in_flight > 0
        for _, path, size in sorted(entries):
            if total <= limit:
                break
            with locks.held(self.root, os.path.basename(path), wait=False) as free:
                if free is None:  # being opened (or made) right now: not this one
                    busy = True
                    continue
                _remove_quietly(path)
            total -= size
            self.evictions += 1
        return total <= limit or not busy

    # Alias that reads better at call sites that only want the path.
    local_path = ensure_local

    def _lock_for(self, key: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(key, threading.Lock())

    def _download(self, fs: Any, path: str, url: str, target: str, size: int) -> None:
        tmp = _temp_name(target)
        try:
            retrying(
                lambda: _copy_remaining(fs, path, url, tmp, size),
                url=url,
                what="download",
                policy=self.download_policy,
                on_retry=self._count_retry,
            )
            os.replace(tmp, target)
            self._count("downloads")
        except BaseException:
            _remove_quietly(tmp)
            raise

    def prefetch(self, urls: Iterable[str], parallelism: int = 4) -> list[str]:
        """``ensure_local`` for many URLs on ``parallelism`` threads; local paths, in order.

        The first error (after all downloads were tried) is raised in the caller.
        """
        urls = list(urls)
        if parallelism <= 1 or len(urls) <= 1:
            return [self.ensure_local(u) for u in urls]
        with ThreadPoolExecutor(
            max_workers=min(parallelism, len(urls)), thread_name_prefix="zephon-shard-prefetch"
        ) as pool:
            return list(pool.map(self.ensure_local, urls))


class _ShortRead(ConnectionError):
    """The remote stream ended before the file's size: a dropped connection (retried)."""


def _copy_remaining(fs: Any, path: str, url: str, tmp: str, size: int) -> None:
    """Download the remote file into ``tmp``, or, when an earlier try left a part of it there,
    only the rest: a retried download resumes where the last try broke.

    The first try is the backend's own streaming download (``get_file``: for s3fs half the CPU
    of reading through a file object); a resumed one reads ranges (``cat_file``).
    """
    have = os.path.getsize(tmp) if os.path.exists(tmp) else 0
    if have == 0:
        fs.get_file(path, tmp)
    else:
        with open(tmp, "ab") as dst:
            while have < size:
                block = fs.cat_file(path, start=have, end=min(have + _COPY_BLOCK, size))
                if not block:
                    break
                dst.write(block)
                have += len(block)
    have = os.path.getsize(tmp)
    if have != size:
        fs.invalidate_cache(path)  # the size the backend remembers may be the old one
        now = int(fs.size(path))
        if now == size and have < size:  # same file, the stream was cut short: a dropped connection
            raise _ShortRead(f"the stream ended after {have} of {size} bytes")
        raise DatasetNotFoundError(
            f"{url}: the file has {now} bytes, not the {size} it had when the dataset was discovered; "
            "it changed while being read. Retry once the writer has finished, or rediscover the dataset."
        )


def _has_size(path: str, size: int) -> bool:
    try:
        return os.path.getsize(path) == size
    except OSError:
        return False


_default_cache: ShardCache | None = None
_default_cache_guard = threading.Lock()


def default_shard_cache() -> ShardCache:
    """The process-wide :class:`ShardCache` (root follows ``$ZEPHON_COLUMNAR_CACHE``)."""
    global _default_cache
    with _default_cache_guard:
        if _default_cache is None:
            _default_cache = ShardCache()
        return _default_cache


def configure_shard_cache(
    *,
    root: str | None = None,
    limit_bytes: int | None = None,
    download_policy: RetryPolicy = DOWNLOAD_POLICY,
    metadata_policy: RetryPolicy = METADATA_POLICY,
) -> ShardCache:
    """Point this process's default cache at ``root`` (None: ``cache_root()/shards``) with at
    most ``limit_bytes`` and the given retry policies (``options(io_options=...)`` calls it
    before readers open). A root given here is created at once, as Zephon does: a path that
    cannot be written fails now, not at the first remote file."""
    global _default_cache
    with _default_cache_guard:
        if _default_cache is None or _default_cache.configured_root != root:
            if root is not None:
                os.makedirs(root, exist_ok=True)
            _default_cache = ShardCache(root, limit_bytes=limit_bytes)
        _default_cache.limit_bytes = limit_bytes
        _default_cache.download_policy = download_policy
        _default_cache.metadata_policy = metadata_policy
        return _default_cache


def local_path(url: str, size: int | None = None) -> str:
    """A local path with the content of ``url`` (downloaded once into the default cache).

    Example:
        >>> local_path("/data/a.parquet")
        '/data/a.parquet'
    """
    return default_shard_cache().ensure_local(url, size)


def prefetch(urls: Iterable[str], parallelism: int = 4) -> list[str]:
    """Warm the default shard cache with ``urls`` on ``parallelism`` threads; local paths."""
    return default_shard_cache().prefetch(urls, parallelism)
