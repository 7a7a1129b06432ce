"""Polars frames from Arrow tables, refused (not deadlocked) in a process forked after Polars ran.

Polars runs its work on a process-wide thread pool. A child made by ``fork`` inherits the pool's
state but none of its threads, so its first Polars call waits forever. The default torch
``DataLoader`` on Linux forks its workers, and a training script has usually run the pipeline
(or validated it, or primed a token mixture) in the parent first. Every Polars call the engine
makes goes through `polars_frame`, which turns that silent hang into an error saying what to do.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pyarrow as pa

from zephon_columnar.errors import PipelineError

if TYPE_CHECKING:
    import polars as pl

# pid of the process in which the engine first ran Polars; a fork copies it unchanged
_polars_ran_in_pid: int | None = None


def polars_frame(table: pa.Table, *, rechunk: bool = False) -> pl.DataFrame:
    """``polars.from_arrow(table)``, or `PipelineError` in a child forked after Polars ran.

    Example:
        >>> import pyarrow as pa
        >>> polars_frame(pa.table({"n": [1, 2]})).shape
        (2, 1)
    """
    global _polars_ran_in_pid
    pid = os.getpid()
    if _polars_ran_in_pid is None:
        _polars_ran_in_pid = pid
    elif _polars_ran_in_pid != pid:
        raise PipelineError(
            f"Polars cannot run in process {pid}: it was forked from process {_polars_ran_in_pid} "
            "after that one ran Polars, and Polars' thread pool does not survive a fork (the call "
            "would hang). Start worker processes with spawn or forkserver, e.g. "
            "torch.utils.data.DataLoader(..., multiprocessing_context='spawn'), or create them "
            "before the pipeline first runs."
        )
    import polars as pl

    frame = pl.from_arrow(table, rechunk=rechunk)
    assert isinstance(frame, pl.DataFrame)  # a table gives a frame (a bare array would give a Series)
    return frame
