"""File locks that the processes of a node share: who makes a cache entry, who may evict it.

A lock is a file in a ``.locks`` folder beside what it guards, held with ``flock(2)``: the kernel
drops it when its holder's file is closed or its process dies (``SIGKILL`` included), so a
dead process never leaves a lock that others must detect and break. Lock files are never
deleted (deleting one while another process waits on it would let two hold "the" lock); each is
empty, or holds the bytes its holder has been granted in a size-limited cache (`grant`).

flock is advisory and per open file: two opens of one lock file exclude each other even in one
process, which is what lets one thread hold an entry while another thread tests it. A node's
cache folder belongs on a local file system (or one whose locks are coherent across the
processes that share it); where the file system refuses locks (``ENOLCK``, ``EOPNOTSUPP``), a
lock counts as held and nothing waits: each process then behaves as if it were alone (at worst
a shard downloaded twice), as before locks existed.

Example:
    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> with held(folder, "entry") as mine:
    ...     with held(folder, "entry", wait=False) as other:  # held: another open cannot take it
    ...         other is None
    ...     grant(mine, 1024)
    ...     granted(folder, "entry")
    True
    1024
    >>> granted(folder, "entry")  # nobody holds it: a grant left there counts for nothing
    0
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager

FOLDER = ".locks"


def lock_path(root: str, name: str) -> str:
    """The lock file ``name`` of the folder ``root``."""
    return os.path.join(root, FOLDER, f"{name}.lock")


@contextmanager
def held(root: str, name: str, *, shared: bool = False, wait: bool = True) -> Iterator[int | None]:
    """Hold the lock ``name`` of ``root`` (exclusive, or ``shared`` with other shared holders)
    for the ``with`` block; yields its file descriptor, or None when ``wait`` is False and
    another holder has it."""
    path = lock_path(root, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        flags = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if wait else fcntl.LOCK_NB)
        try:
            fcntl.flock(fd, flags)
        except BlockingIOError:
            fd_or_none: int | None = None
        except OSError as err:
            if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            fd_or_none = fd  # a file system without locks: go on, as one process alone would
        else:
            fd_or_none = fd
        yield fd_or_none
    finally:
        os.close(fd)  # releases the lock


def grant(fd: int, nbytes: int) -> None:
    """Record in a held lock file that its holder may write ``nbytes`` more (0: none)."""
    os.ftruncate(fd, 0)
    if nbytes:
        os.pwrite(fd, str(nbytes).encode(), 0)


def granted(root: str, name: str) -> int:
    """The bytes granted to whoever holds the lock ``name`` now; 0 when nobody holds it (a grant
    a dead process left is cleared)."""
    path = lock_path(root, name)
    try:
        if os.path.getsize(path) == 0:
            return 0
    except FileNotFoundError:
        return 0
    with held(root, name, wait=False) as free:
        if free is not None:  # nobody holds it: whoever wrote the grant died, or just finished
            os.ftruncate(free, 0)
            return 0
        try:
            with open(path, "rb") as f:
                return int(f.read() or 0)
        except ValueError:  # being rewritten this moment
            return 0
