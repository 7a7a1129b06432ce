"""What a pass lost, gathered from the runs that made it, said once in the training process.

A pass may be made by one run (this process), by an mtp-mode side process, or by a rank's loader
workers, each running the lanes it was given. Each run ends with a `PassReport`: the losses its
lanes noted (`zephon_columnar.losses.Notice`), its counters summed over its lanes, and those of
the lanes that started the pass (a restored lane delivers rows read before the checkpoint, so
its mixture counts do not compare). The process the training loop runs in merges the reports of
the pass (`merged`) and says them once (`said`, then `zephon_columnar.losses.say`): one warning
per kind with the totals of every lane, whatever the number of workers. Reports cross processes
with cloudpickle (a notice words its message with a function).

Example:
    >>> from zephon_columnar.errors import PassTailWarning
    >>> from zephon_columnar.losses import Notice
    >>> tail = Notice(kind="tail", category=PassTailWarning, text=lambda c, scope: f"{c['dropped']} rows {scope}",
    ...               share=lambda c: c["dropped"] / c["rows"])
    >>> one = PassReport(notices=(tail,), totals={"dropped": 3, "rows": 100}, lanes=(0,), fresh_lanes=(0,))
    >>> two = PassReport(notices=(tail,), totals={"dropped": 2, "rows": 100}, lanes=(1,), fresh_lanes=(1,))
    >>> [s.message for s in PassReport.merged([one, two]).said()]
    ['5 rows in this pass (lanes 0, 1)']
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from zephon_columnar.engine.realized import starved_components, starved_message
from zephon_columnar.errors import SkippedRecordWarning, StarvedComponentWarning
from zephon_columnar.io.dataset import Dataset
from zephon_columnar.losses import Notice, Said, said_of, summed


@dataclass(frozen=True, kw_only=True)
class PassReport:
    """The losses one run (or several, `merged`) noted in a pass that ended, with its counters.

    ``notices``: one per kind, the first noted; ``totals``: the counters summed over ``lanes``;
    ``fresh_totals``: over the lanes that started the pass (``fresh_lanes``)."""

    notices: tuple[Notice, ...] = ()
    totals: Mapping[str, int] = field(default_factory=dict)
    lanes: tuple[int, ...] = ()
    fresh_totals: Mapping[str, int] = field(default_factory=dict)
    fresh_lanes: tuple[int, ...] = ()

    @classmethod
    def merged(cls, reports: Iterable[PassReport]) -> PassReport:
        """One report of the runs that made one pass (a rank's loader workers)."""
        reports = list(reports)
        notices: dict[str, Notice] = {}
        for report in reports:
            for notice in report.notices:
                notices.setdefault(notice.kind, notice)
        return cls(
            notices=tuple(notices.values()),
            totals=summed(r.totals for r in reports),
            lanes=tuple(sorted(lane for r in reports for lane in r.lanes)),
            fresh_totals=summed(r.fresh_totals for r in reports),
            fresh_lanes=tuple(sorted(lane for r in reports for lane in r.fresh_lanes)),
        )

    def said(self) -> list[Said]:
        """What to say of the pass: each notice worded with the totals, and the mixture
        components the fresh lanes starved."""
        scope = f"in this pass (lanes {_lanes_text(self.lanes)})"
        whole = self.fresh_lanes == self.lanes  # no lane restored from a checkpoint
        out = [said_of(notice, self.totals, scope, whole=whole) for notice in self.notices]
        starved = starved_components(self.fresh_totals)
        if starved:
            out.append(Said(category=StarvedComponentWarning, message=starved_message(starved, list(self.fresh_lanes))))
        return out


def skipped_record_notices(datasets: Mapping[int, Any]) -> list[Notice]:
    """A notice per dataset of the work source that left bad records out of its rows
    (``on_bad_record="skip"``): a pass reads without them, so every pass says so once.

    Example:
        >>> skipped_record_notices({0: Dataset.from_path("chat", "data/chat", on_bad_record="skip")})
        []
    """
    notices = []
    for dataset in datasets.values():
        message = dataset.skipped_records().message(dataset.name) if isinstance(dataset, Dataset) else ""
        if message:
            notices.append(
                Notice(
                    kind=f"skipped_records.{dataset.name}",
                    category=SkippedRecordWarning,
                    text=partial(_said_as_is, message),
                )
            )
    return notices


def _said_as_is(message: str, counters: Mapping[str, int], scope: str) -> str:
    return message


def _lanes_text(lanes: tuple[int, ...]) -> str:
    """``0-3`` for more than two consecutive lanes, else the list.

    Example:
        >>> _lanes_text((0, 1, 2, 3)), _lanes_text((1, 3))
        ('0-3', '1, 3')
    """
    if len(lanes) > 2 and list(lanes) == list(range(lanes[0], lanes[-1] + 1)):
        return f"{lanes[0]}-{lanes[-1]}"
    return ", ".join(map(str, lanes))
