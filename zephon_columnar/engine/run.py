"""`Run`: one pass over a pipeline's stream, what a pipeline iterates and checkpoints.

Two classes implement it: `EngineRun` runs the engine in this process, `MtpRun` in a side
process (``options(mtp_mode=True)``) and reads its items from shared memory. Whoever holds a
run reads it through this protocol only, so both are interchangeable.

Example:
    >>> from zephon_columnar.engine.engine import EngineRun
    >>> from zephon_columnar.engine.mtp import MtpRun
    >>> all(callable(getattr(cls, "snapshot", None)) for cls in (EngineRun, MtpRun))
    True
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from zephon_columnar.engine.checkpoint import LaneState
    from zephon_columnar.engine.pass_report import PassReport
    from zephon_columnar.observability.stats import PrefetchTimingTotals


class Run(Protocol):
    """An iterator of items plus what a checkpoint and the metrics read of the pass.

    ``closed``: no more items (asked to stop, finished, or failed). ``snapshot()``: every lane's
    state after the last item delivered to the caller. The counters (``stats``,
    ``tracked_records``, ``fetch_groups``, ``in_flight_by_stage``, ``prefetch_timing``) are
    those of the pass so far (where it runs: the side process's for `MtpRun`), or of its end
    once closed; ``queue_stats()`` is the side process's ring (None in
    process); ``pass_report()`` what the pass dropped on purpose, once it ended (None before;
    `zephon_columnar.engine.pass_report`). ``close()`` stops it promptly and may be called from
    any thread.
    """

    @property
    def closed(self) -> bool: ...

    def __iter__(self) -> Iterator[Any]: ...

    def __next__(self) -> Any: ...

    def snapshot(self) -> dict[int, LaneState]: ...

    def stats(self) -> dict[int, dict[str, int]]: ...

    def tracked_records(self) -> list[dict[str, Any]]: ...

    def fetch_groups(self) -> dict[tuple[int, int, int], dict[str, float]]: ...

    def prefetch_timing(self) -> PrefetchTimingTotals | None: ...

    def in_flight_by_stage(self) -> dict[int, dict[int, int]] | None: ...

    def queue_stats(self) -> dict[str, int] | None: ...

    def pass_report(self) -> PassReport | None: ...

    def close(self) -> None: ...
