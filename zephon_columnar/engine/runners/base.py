"""What a runner is: the `Runner` protocol the engine holds, the `RunnerTraits` it reads, and
`RunnerBase`, the constructor every runner shares.

The engine reads nothing else about a runner: no runner name is compared outside the registry
(`zephon_columnar.engine.runners.registry`); a difference in behaviour is a trait.

Example:
    >>> from zephon_columnar.engine.runners.registry import runner_traits
    >>> runner_traits("inline").computes_at_submit, runner_traits("process").starts_processes
    (True, True)
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

import pyarrow as pa

from zephon_columnar.engine.metrics import Metrics
from zephon_columnar.ops.base import BaseOp
from zephon_columnar.options import RunnerName


@dataclass(frozen=True, kw_only=True)
class RunnerTraits:
    """What the engine may rely on about a runner, declared by its class.

    Attributes:
        name: the ``options(runner=...)`` name it answers to (`RunnerName`).
        place: where a stage runs, in Zephon's words for ``explain()``: ``"local"`` (this
            machine) or ``"remote"`` (a cluster).
        computes_at_submit: ``submit()`` runs the call before it returns: frames submitted ahead
            would only delay the one asked for (no look-ahead window), and a prefetch thread
            has no background work to overlap.
        own_readers: its workers read shards with readers of their own, not the driver's
            `ReaderPool`: what the driver reads ahead (a restore's warm-up) does not reach them.
        starts_processes: it starts child processes with ``multiprocessing``, which a daemon
            process (a ``DataLoader`` worker) may not; there the engine runs the stages on
            `DAEMON_STAND_IN` instead. (Ray's actors are not such children: its workers are
            started by its own daemons.)
    """

    name: RunnerName
    place: Literal["local", "remote"]
    computes_at_submit: bool
    own_readers: bool
    starts_processes: bool


class Runner(Protocol):
    """Runs ``stage_index, frame -> frame`` for the parallel stages of a plan.

    Contract:
        - ``submit(stage, frame)`` returns a future of the stage's output for ``frame``; the
          output depends only on the stage and the frame, never on where or when it ran.
        - ``result(future)`` waits for it; a runner whose calls run elsewhere wakes so that
          ``cancel()`` from another thread releases the wait, and ``time_limit_s`` (when set)
          turns a call that never returns into a `PipelineError` naming its operators.
        - ``cancel()`` takes no more work and releases waits; ``close()`` also ends the workers
          and tears the operators down (a call stuck in user code is left behind, never waited
          for without bound).
    """

    traits: ClassVar[RunnerTraits]
    workers: int
    metrics: Metrics | None

    def submit(self, stage: int, frame: pa.Table) -> cf.Future[Any]: ...

    def result(self, fut: cf.Future[Any]) -> pa.Table: ...

    def cancel(self) -> None: ...

    def close(self) -> None: ...


class RunnerBase(ABC):
    """The constructor every runner shares (a runner starts its workers in `start_workers`),
    and the `Runner` methods each one implements.

    Args:
        stages: each parallel stage's operators (set up by the runner, once per worker).
        services: what the operators' ``setup`` receives (`OpContext.services`).
        workers: how many workers to run (a runner may use fewer: inline uses one).
        metrics: execution tracking's counters, or None when tracking is off.
        time_limit_s: ``options(op_timeout_s=...)``, for runners whose calls run elsewhere.
    """

    traits: ClassVar[RunnerTraits]

    def __init__(
        self,
        stages: Sequence[Sequence[BaseOp]],
        services: dict[str, Any],
        workers: int,
        metrics: Metrics | None = None,
        time_limit_s: float | None = None,
    ) -> None:
        self.stages = stages
        self.services = services
        self.workers = workers
        self.metrics = metrics
        self.time_limit_s = time_limit_s
        # each operator's counts, when tracking (see engine.metrics.run_tracked)
        self.sink: Callable[..., None] | None = metrics.add_op if metrics is not None else None
        self.cancelled = threading.Event()  # set by cancel(): no more work, waits released
        self.stage_names = [" -> ".join(op.op_name() for op in ops) for ops in stages]  # for messages
        self.start_workers()

    def start_workers(self) -> None:  # noqa: B027 - a hook, empty unless a runner has workers to start
        """Start what runs the calls (the constructor's last step; the arguments are attributes
        by then). An operator's ``setup`` failing here fails the runner's start."""

    @abstractmethod
    def submit(self, stage: int, frame: pa.Table) -> cf.Future[Any]: ...

    @abstractmethod
    def result(self, fut: cf.Future[Any]) -> pa.Table: ...

    @abstractmethod
    def cancel(self) -> None: ...

    @abstractmethod
    def close(self) -> None: ...
