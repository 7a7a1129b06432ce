"""The runners by ``options(runner=...)`` name: the only place a runner name is looked up.

Example:
    >>> sorted(RUNNERS)
    ['inline', 'process', 'remote', 'threads']
    >>> runner_traits("remote").place, runner_traits("threads").place
    ('remote', 'local')
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

from zephon_columnar.engine.metrics import Metrics
from zephon_columnar.engine.runners.base import Runner, RunnerBase, RunnerTraits
from zephon_columnar.engine.runners.inline import InlineRunner
from zephon_columnar.engine.runners.process import ProcessRunner
from zephon_columnar.engine.runners.remote import RayRunner  # imports Ray only when it starts
from zephon_columnar.engine.runners.threads import ThreadRunner
from zephon_columnar.ops.base import BaseOp
from zephon_columnar.options import RunnerName

#: Every runner, by the name its traits declare.
RUNNERS: MappingProxyType[RunnerName, type[RunnerBase]] = MappingProxyType(
    {cls.traits.name: cls for cls in (InlineRunner, ThreadRunner, ProcessRunner, RayRunner)}
)

#: What runs the stages where the chosen runner would start processes but may not: inside a
#: daemon process (a ``DataLoader`` worker). The rows are the same: a runner never changes them.
DAEMON_STAND_IN: RunnerName = "threads"


def runner_traits(name: RunnerName) -> RunnerTraits:
    """The traits of runner ``name`` (a resolved name: `RuntimeOptions.resolved_runner`)."""
    return RUNNERS[name].traits


def start_runner(
    name: RunnerName,
    stages: Sequence[Sequence[BaseOp]],
    services: dict[str, Any],
    workers: int,
    *,
    metrics: Metrics | None = None,
    time_limit_s: float | None = None,
) -> Runner:
    """Runner ``name`` started on ``stages`` (see `RunnerBase` for the arguments)."""
    return RUNNERS[name](stages, services, workers, metrics, time_limit_s)
