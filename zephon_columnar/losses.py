"""Data a pass drops on purpose, said once: serious losses warned, routine tails logged.

Operators count every row or token they drop in their lane's counters (``metrics_snapshot()``)
and note the loss here (`Notices.note`), once per kind and pass, whichever lane meets it first.
What is said, and when:

- a stream that ends: at the end of the pass, in the process the training loop runs in (its
  ``next()`` that ends the pass, so the warning points at the loop), worded with the pass's
  totals over every lane, loader workers' included
  (`zephon_columnar.engine.pass_report.PassReport`, then `say`);
- an endless stream (a source that repeats with no pass limit): at the first loss, with the
  lane's counts so far, because the end never comes.

Serious losses (documents longer than ``max_length``, rows an exact mixture cannot place, a
starved mixture component) are warned with their own `~zephon_columnar.errors.DataDroppedWarning`
subclass, so that each can be filtered alone. Routine tails (a lane's last rows short of a batch
under ``drop_last=True``, uncapped wrap's final partial row) are logged at INFO on the logger
``"zephon_columnar"``, and warned (`~zephon_columnar.errors.PassTailWarning`) only when they are
more than `ROUTINE_SHARE` of what the pass delivered: small data, where the tail is a real part.

Example:
    >>> import warnings
    >>> from zephon_columnar.errors import OversizedDocumentWarning
    >>> notices = Notices(pass_ends=True)
    >>> big = Notice(kind="oversized", category=OversizedDocumentWarning,
    ...              text=lambda c, scope: f"dropped {c['docs']} documents {scope}")
    >>> for lane in range(3):
    ...     notices.note(big, {"docs": 1}, lane=lane)
    >>> with warnings.catch_warnings(record=True) as seen:
    ...     warnings.simplefilter("always")
    ...     say([said_of(n, {"docs": 3}, "in this pass") for n in notices.noted()])
    >>> [str(w.message) for w in seen]
    ['dropped 3 documents in this pass']
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from zephon_columnar.errors import warn

#: The logger routine tails are logged on.
LOGGER = logging.getLogger("zephon_columnar")
#: A routine tail is warned about only above this share of what its pass delivered.
ROUTINE_SHARE = 0.01


@dataclass(frozen=True, kw_only=True)
class Notice:
    """One kind of loss: ``text(counters, scope)`` words it from counters (the pass's totals, or
    a lane's so far) and a scope ("in this pass", "in lane 2 so far"); ``share(counters)``, for
    a routine tail, is its share of what the pass delivered (None: a serious loss)."""

    kind: str
    category: type[Warning]
    text: Callable[[Mapping[str, int], str], str]
    share: Callable[[Mapping[str, int]], float] | None = None


@dataclass(frozen=True, kw_only=True)
class Said:
    """A loss as it is said: warned (``category``) or, routine and small, logged. Plain values,
    so a side process can hand its pass's report to the trainer."""

    category: type[Warning]
    message: str
    logged: bool = False


class Notices:
    """The losses of one pass (an iteration of a pipeline), a kind at a time. Thread-safe.

    ``pass_ends``: whether the stream ends (the losses are then said at its end, with totals)."""

    def __init__(self, *, pass_ends: bool = True) -> None:
        self.pass_ends = pass_ends
        self._noted: dict[str, Notice] = {}  # kept for the end of the pass (or said, endless)
        self._warned: set[str] = set()  # said at once (`warn`)
        self._lock = threading.Lock()

    def note(self, notice: Notice, so_far: Mapping[str, int], *, lane: int) -> None:
        """A loss of ``notice``'s kind in ``lane`` (``so_far``: that lane's counters): kept for the
        end of the pass, or, in an endless stream, said now if it is the first of its kind."""
        with self._lock:
            if notice.kind in self._noted or notice.kind in self._warned:
                return
            self._noted[notice.kind] = notice
        if not self.pass_ends:
            scope = f"in lane {lane} so far (the stream has no end; running totals are in metrics_snapshot())"
            say([said_of(notice, so_far, scope)])

    def warn(self, kind: str, message: str, category: type[Warning]) -> bool:
        """Warn now, unless ``kind`` was noted or warned already this pass; whether this warned."""
        with self._lock:
            if kind in self._noted or kind in self._warned:
                return False
            self._warned.add(kind)
        warn(message, category)
        return True

    def given(self) -> list[str]:
        """The kinds noted or warned so far this pass."""
        with self._lock:
            return sorted(set(self._noted) | self._warned)

    def noted(self) -> tuple[Notice, ...]:
        """The notices kept for the end of the pass (none for an endless stream: said as they
        came), one per kind, to word with the pass's totals (`said_of`)."""
        if not self.pass_ends:
            return ()
        with self._lock:
            return tuple(self._noted.values())


def said_of(notice: Notice, counters: Mapping[str, int], scope: str, *, whole: bool = True) -> Said:
    """``notice`` worded from ``counters`` for ``scope``: logged when it is a routine tail of
    at most `ROUTINE_SHARE`, or of a pass that is not ``whole`` (restored from a checkpoint: its
    counters do not hold the pass's start, so the tail's share of the pass is not known), else
    warned."""
    logged = notice.share is not None and (not whole or notice.share(counters) <= ROUTINE_SHARE)
    return Said(category=notice.category, message=notice.text(counters, scope), logged=logged)


def say(report: Iterable[Said]) -> None:
    """Warn (attributed to the first frame outside the package: the training loop) or log each."""
    for said in report:
        if said.logged:
            LOGGER.info("%s", said.message)
        else:
            warn(said.message, said.category)


def share_text(part: int, whole: int) -> str:
    """``part`` of ``whole`` as a percentage for a message ("n/a" of nothing).

    Example:
        >>> share_text(3, 400), share_text(1, 0)
        ('0.75%', 'n/a')
    """
    return f"{100.0 * part / whole:.3g}%" if whole else "n/a"


def summed(counter_sets: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """Counters (a lane's, a run's) summed by name."""
    totals: dict[str, int] = {}
    for counters in counter_sets:
        for name, value in counters.items():
            totals[name] = totals.get(name, 0) + value
    return totals
