"""``dump_semaphore_registry()``: print the semaphores this process has registered and still holds.

Needs the tracker's hooks (`zephon_columnar.debug.semaphore_tracker.install_debug_hooks`);
prints nothing unless ``ZEPHON_SEMAPHORE_DEBUG=1`` (or ``force=True``).

Example:
    >>> dump_semaphore_registry()  # without ZEPHON_SEMAPHORE_DEBUG=1: prints nothing
"""

from __future__ import annotations

import os
import sys

from zephon_columnar.debug.semaphore_tracker import registrations


def dump_semaphore_registry(*, force: bool = False) -> None:
    """One line per semaphore registered and not yet unregistered (name, thread)."""
    if not force and os.environ.get("ZEPHON_SEMAPHORE_DEBUG", "").lower() not in ("1", "true", "yes"):
        return
    held = registrations()
    print(f"=== Semaphore registry: {len(held)} held ===", file=sys.stderr)
    for info in held.values():
        print(f"  {info.name} (thread {info.thread_name})", file=sys.stderr)


__all__ = ["dump_semaphore_registry"]
