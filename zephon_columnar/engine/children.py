"""Starting child processes (the process runner's workers, the mtp side process) with spawn.

Example:
    >>> import sys
    >>> with main_module_hidden():
    ...     hasattr(sys.modules["__main__"], "__file__")
    False
"""

from __future__ import annotations

import contextlib
import os
import sys
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
