"""Debugging aids: read a dataset's raw rows (`DatasetInspector`) and find leaked semaphores."""

from zephon_columnar.debug.inspector import DatasetInspector
from zephon_columnar.debug.semaphore_registry import dump_semaphore_registry
from zephon_columnar.debug.semaphore_tracker import dump_semaphore_leak_report, install_debug_hooks

__all__ = ["DatasetInspector", "dump_semaphore_leak_report", "dump_semaphore_registry", "install_debug_hooks"]
