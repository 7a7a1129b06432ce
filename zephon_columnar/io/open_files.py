"""`OpenFiles`: how many shard files the readers of a process hold open together, against one
limit derived from the process's file-descriptor limit.

Each dataset's reader keeps a few shards open between takes (``max_open_files``: a footer and a
file handle saved on the next take). A mixture of thousands of datasets would hold thousands
of descriptors: past ``ulimit -n`` (often 1,024) the next open fails with "Too many open files".
Readers count their open shards here and, when the process is over the limit after a take,
close theirs (each reader only its own, in the thread that uses it): a wide mixture then reopens
a shard when it comes back to it (a local open and a footer parse, ~0.1-0.3 ms) instead of
failing.

Example:
    >>> files = OpenFiles(limit=2)
    >>> files.opened(); files.opened(); files.over()
    False
    >>> files.opened(); files.over()
    True
    >>> files.closed(2); files.held
    1
"""

from __future__ import annotations

import os
import resource
import threading


def default_limit() -> int:
    """Half the process's soft descriptor limit (the other half for everything else the process
    opens: sockets, pipes, the trainer's files), at least 16."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 16
    return max(16, soft // 2)


class OpenFiles:
    """A count of open shard files shared by a process's readers (thread-safe)."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = default_limit() if limit is None else int(limit)
        self.held = 0
        self._lock = threading.Lock()

    def opened(self, n: int = 1) -> None:
        with self._lock:
            self.held += n

    def closed(self, n: int = 1) -> None:
        with self._lock:
            self.held -= n

    def over(self) -> bool:
        """Whether the readers together hold more than ``limit`` files now."""
        return self.held > self.limit

    def after_fork(self) -> None:
        """In a forked child: a new lock (a parent's thread inside `opened` at the fork held
        the old one, which nothing in the child would release). The count stays: the parent's
        descriptors are the child's too until its readers close them."""
        self._lock = threading.Lock()


#: The process's count (readers made in a forked child count their own from the parent's: the
#: parent's readers are not used there, so their files count until the child's readers close).
OPEN_FILES = OpenFiles()
os.register_at_fork(after_in_child=OPEN_FILES.after_fork)
