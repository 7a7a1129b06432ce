"""The Ray runner (``options(runner="remote")``, or ``"ray"``): the stateless stages run in Ray
actors, on the cluster ``ray.init`` connected to (a local one is started when Ray is not
initialized yet).

- Each actor sets up its own copy of the operators once (cloudpickled, as for the process
  runner), and takes one CPU of the cluster; ``max_workers`` actors are started.
- Frames go to the actors and back as Arrow tables through Ray's object store (Ray serializes
  an Arrow table's buffers out of band: no pickled rows).
- The lanes keep the ordered stages on the driver and read results in submission order
  (`engine.lane.ParallelStep`), so the output equals the threads runner's, batch for batch.
- An actor that dies (its process killed, a node lost) is replaced and the frame sent again:
  stateless work gives the same rows however often it runs. After ``MAX_TRIES`` deaths on
  one frame the error reaches ``next()`` naming the stage and the frame's first sample.
- ``close()`` kills the actors: a call stuck in a user function does not outlive the pass.

Ray is an optional extra: ``pip install 'zephon_columnar[ray]'``. On a cluster of several
machines, every node needs zephon_columnar and the user's operators importable (install it in
the nodes' environment, or pass a ``runtime_env`` to ``ray.init``).
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from collections.abc import Sequence
from typing import Any

import cloudpickle
import pyarrow as pa

from zephon_columnar.engine.metrics import DeltaSink, Metrics
from zephon_columnar.engine.runners import (
    _WorkerFailure,
    _WorkerWaits,
    raise_worker_failure,
    run_stage,
    setup_stages,
    worker_failure,
)
from zephon_columnar.errors import PipelineError
from zephon_columnar.ops.base import BaseOp
from zephon_columnar.options import import_ray

#: How many times one frame is sent again after its actor died, before the error is raised.
MAX_TRIES = 3


class StageWorker:
    """The body of one actor: the operators set up once, a frame in, a frame (or the operator's
    failure, as the process runner sends it) out."""

    def __init__(self, payload: bytes) -> None:
        stages, services, track = cloudpickle.loads(payload)
        self.ops = setup_stages(stages, services)
        self.sink = DeltaSink() if track else None

    def run(self, stage: int, frame: pa.Table) -> Any:
        try:
            out = run_stage(self.ops[stage], frame, stage, self.sink)
        except BaseException as err:  # noqa: BLE001 - re-raised in the driver with its class
            return worker_failure(err)
        return out if self.sink is None else (out, self.sink.take())


class _RemoteFuture(cf.Future):
    """One frame's call: a Ray object reference, sent again to a fresh actor when its actor
    died (up to `MAX_TRIES`)."""

    def __init__(self, runner: RayRunner, stage: int, frame: pa.Table) -> None:
        super().__init__()
        self.runner, self.stage, self.frame = runner, stage, frame
        self.deaths = 0
        self.started_at = time.monotonic()  # the time limit counts from when the frame was sent
        self._send()

    def _send(self) -> None:
        self.slot, self.actor = self.runner.next_actor()
        self._inner = self.actor.run.remote(self.stage, self.frame).future()

    def done(self) -> bool:
        return self._inner.done()

    def running(self) -> bool:
        return not self._inner.done()

    def result(self, timeout: float | None = None) -> pa.Table:
        ray = self.runner.ray
        try:
            out = self._inner.result(timeout)
        except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as err:
            self.deaths += 1
            if self.deaths > MAX_TRIES or self.runner.cancelled.is_set():
                raise PipelineError(
                    f"Ray actors died {self.deaths} times computing {self.runner.describe(self.stage, self.frame)} "
                    f"(last: {type(err).__name__}); see the actors' logs. Rerun with options(runner='threads') to "
                    "see an error in-process."
                ) from err
            self.runner.replace(self.slot, self.actor)
            self._send()
            raise cf.TimeoutError() from None  # the caller waits again, on the new call
        if isinstance(out, _WorkerFailure):
            raise_worker_failure(out)
        if isinstance(out, BaseException):
            raise out
        if isinstance(out, tuple):
            out, deltas = out
            if self.runner.metrics is not None:
                self.runner.metrics.merge(deltas)
        return out

    def cancel(self) -> bool:
        return self._inner.cancel()


class RayRunner(_WorkerWaits):
    """``max_workers`` Ray actors, each with its own copy of the operators; frames are sent to
    them in turn."""

    kind = "remote"

    def __init__(
        self,
        stages: Sequence[Sequence[BaseOp]],
        services: dict[str, Any],
        workers: int,
        metrics: Metrics | None = None,
        time_limit_s: float | None = None,
    ) -> None:
        self.ray = ray = import_ray()
        if not ray.is_initialized():
            ray.init(include_dashboard=False, log_to_driver=True)
        self._init_waits(stages, time_limit_s)
        self.metrics = metrics
        self.workers = workers
        self._payload = cloudpickle.dumps((list(stages), services, metrics is not None))
        self._actor_class = ray.remote(num_cpus=1, max_restarts=0)(StageWorker)
        self._lock = threading.Lock()
        self._turn = 0
        self.actors = [self._start() for _ in range(workers)]
        self.replaced = 0  # actors started again after one died (tests and metrics read it)

    def _start(self) -> Any:
        return self._actor_class.remote(self._payload)

    def next_actor(self) -> tuple[int, Any]:
        with self._lock:
            slot = self._turn % len(self.actors)
            self._turn += 1
            return slot, self.actors[slot]

    def replace(self, slot: int, dead: Any) -> None:
        """A fresh actor in ``slot`` if ``dead`` (an actor that died) is still there: calls that
        saw the same actor die replace it once."""
        with self._lock:
            if self.actors[slot] is not dead:
                return
            try:
                self.ray.kill(dead, no_restart=True)
            except Exception:  # noqa: BLE001, S110 - gone already
                pass
            self.actors[slot] = self._start()
            self.replaced += 1

    def submit(self, stage: int, frame: pa.Table) -> cf.Future:
        if self.cancelled.is_set():
            raise PipelineError("the pipeline iterator was closed: no more work is taken.")
        return self._mark(_RemoteFuture(self, stage, frame), stage, frame)

    def cancel(self) -> None:
        self.cancelled.set()

    def close(self) -> None:
        """Kill the actors (a call still running is abandoned: the work is stateless)."""
        self.cancel()
        for actor in self.actors:
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001, S110 - already gone, or the cluster is down
                pass
        self.actors = []
