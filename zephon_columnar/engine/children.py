"""Starting child processes (the process runner's workers, the mtp side process) with spawn, and
ending them with their parent.

Example:
    >>> import sys
    >>> with main_module_hidden():
    ...     hasattr(sys.modules["__main__"], "__file__")
    False
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from typing import Any


@contextlib.contextmanager
def main_module_hidden() -> Any:
    """Start a spawned child without re-running the training script in it: spawn imports the
    parent's ``__main__`` (by path or module name) first, and a script without an
    ``if __name__ == "__main__"`` guard would start training again there. The child needs
    nothing from it (functions defined there travel by value, cloudpickled)."""
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if main is not None and k in main.__dict__}
    try:
        for k in saved:
            setattr(main, k, None) if k == "__spec__" else delattr(main, k)
        yield
    finally:
        for k, v in saved.items():
            setattr(main, k, v)


@contextlib.contextmanager
def worker_environment() -> Any:
    """Children started inside this block know they are a process runner's workers
    (``ZEPHON_COLUMNAR_PROCESS_WORKER=1``: they skip imports only a driver needs)."""
    old = os.environ.get("ZEPHON_COLUMNAR_PROCESS_WORKER")
    os.environ["ZEPHON_COLUMNAR_PROCESS_WORKER"] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("ZEPHON_COLUMNAR_PROCESS_WORKER", None)
        else:
            os.environ["ZEPHON_COLUMNAR_PROCESS_WORKER"] = old


def die_with_parent(parent_pid: int) -> None:
    """Make this child end when its parent does, even by SIGKILL (which runs no clean-up): the
    kernel's parent-death signal on Linux, and elsewhere a watchdog thread that sees the child
    re-parented. Without it a killed trainer leaves its workers (and multiprocessing's resource
    tracker, which they keep open) running forever."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os._exit(0)

    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(0)
            time.sleep(0.5)

    threading.Thread(target=watch, name="zephon-child-watchdog", daemon=True).start()
