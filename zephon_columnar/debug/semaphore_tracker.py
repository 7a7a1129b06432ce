"""Find leaked POSIX semaphores: who registered the ones never unregistered.

``install_debug_hooks()`` (when ``ZEPHON_SEMAPHORE_LEAK_DEBUG=1``, or ``force=True``) wraps
multiprocessing's resource tracker so every semaphore registration records where it happened;
``dump_semaphore_leak_report()`` prints those still registered (also run at exit once hooks
are installed). Python warns "leaked semaphore objects" at shutdown without saying whose they
were; this says.

Example:
    >>> install_debug_hooks(force=True)
    >>> import multiprocessing
    >>> before = len(registrations())
    >>> lock = multiprocessing.get_context("spawn").Lock()
    >>> len(registrations()) == before + 1
    True
    >>> del lock  # freed: unregistered, no longer reported
    >>> len(registrations()) == before
    True
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

_ENV = "ZEPHON_SEMAPHORE_LEAK_DEBUG"
_lock = threading.Lock()
_registered: dict[str, RegistrationInfo] = {}
_installed = False


@dataclass
class RegistrationInfo:
    """Where and when one semaphore was registered."""

    name: str
    timestamp: float
    stack_trace: str
    thread_name: str
    thread_id: int


def _enabled() -> bool:
    return os.environ.get(_ENV, "").lower() in ("1", "true", "yes")


def registrations() -> dict[str, RegistrationInfo]:
    """The semaphores registered and not unregistered since the hooks were installed."""
    with _lock:
        return dict(_registered)


def _record(name: str, rtype: str) -> None:
    if rtype == "semaphore":
        info = RegistrationInfo(
            name,
            time.time(),
            "".join(traceback.format_stack()[:-2]),
            threading.current_thread().name,
            threading.get_ident(),
        )
        with _lock:
            _registered[name] = info


def _forget(name: str, rtype: str) -> None:
    if rtype == "semaphore":
        with _lock:
            _registered.pop(name, None)


def install_debug_hooks(*, force: bool = False) -> None:
    """Start recording semaphore registrations (once per process; needs the env var or ``force``)."""
    global _installed
    if _installed or not (force or _enabled()):
        return
    from multiprocessing import resource_tracker

    register, unregister = resource_tracker.register, resource_tracker.unregister

    def recording_register(name: str, rtype: str) -> Any:
        _record(name, rtype)
        return register(name, rtype)

    def recording_unregister(name: str, rtype: str) -> Any:
        _forget(name, rtype)
        return unregister(name, rtype)

    resource_tracker.register = recording_register  # type: ignore[assignment]
    resource_tracker.unregister = recording_unregister  # type: ignore[assignment]
    _installed = True
    atexit.register(dump_semaphore_leak_report)


def dump_semaphore_leak_report(*, force: bool = False) -> None:
    """Print (to stderr) every semaphore still registered, with its registration stack. Prints
    nothing when there is none, unless ``force``."""
    leaked = registrations()
    if not leaked and not force:
        return
    process = multiprocessing.current_process().name
    lines = [
        f"=== Semaphore leak report ({process}, pid {os.getpid()}) ===",
        f"registered and not unregistered: {len(leaked)}",
    ]
    for info in sorted(leaked.values(), key=lambda i: i.timestamp):
        when = time.strftime("%H:%M:%S", time.localtime(info.timestamp))
        lines += [f"{info.name} registered at {when} on thread {info.thread_name}", info.stack_trace.rstrip()]
    print("\n".join(lines), file=sys.stderr)


__all__ = ["RegistrationInfo", "dump_semaphore_leak_report", "install_debug_hooks"]
