"""The Ray runner (``options(runner="remote")``, or ``"ray"``): the stateless stages run in Ray
actors, on the cluster ``ray.init`` connected to (a local one is started when Ray is not
initialized yet).

- Each actor sets up its own copy of the operators once (cloudpickled, as for the process
  runner), and takes one CPU of the cluster; ``max_workers`` actors are started, or as many as
  the cluster has CPUs when there are fewer (at least one): an actor no node can place would
  never run the frames sent to it.
- Frames go to the actors and back as Arrow tables through Ray's object store (Ray serializes
  an Arrow table's buffers out of band: no pickled rows). They go to the actors in turn, to
  those that have started once any has.
- The lanes keep the ordered stages on the driver and read results in submission order
  (`engine.lane.steps.ParallelStep`), so the output equals the threads runner's, batch for batch.
- An actor that dies (its process killed) is replaced and the frame sent again: stateless work
  gives the same rows however often it runs. After ``MAX_TRIES`` deaths on one frame the error
  reaches ``next()`` naming the stage and the frame's first sample.
- ``close()`` kills the actors: a call stuck in a user function does not outlive the pass.

Node loss. Ray reports the actors of a lost node dead once its GCS has marked the node dead:
at once for a node shut down cleanly, after its health checks fail for one that crashed or
stopped answering (with Ray's defaults, ``health_check_period_ms=3000`` times
``health_check_failure_threshold=5``: about 15 s for a crashed node, up to about a minute for
one that does not answer; until then its calls simply wait). Then every actor of that node
leaves the pool together, results lost with the node's object store are computed again, and
the pool is refilled only up to the CPUs of the nodes that are left: it shrinks when they have
fewer, and never asks for an actor no node can place. The frames of the lost actors go to live
ones, so the stream is exactly the one the threads runner gives, and a checkpoint taken before
the loss restores exactly on what is left. A node loss is not counted against ``MAX_TRIES``
(which stops a frame that kills its actor's process on a node that lives). An actor that has
not started leaves the pool too, and its frames go to the others: within a second once the
pool is larger than the CPUs of the nodes alive (a pool sized before Ray marked a node dead),
else after ``ACTOR_START_TIMEOUT_S`` (no CPU free for it, its ``runtime_env`` or its operators'
``setup()`` too slow); when it was the last one, ``next()`` raises a `PipelineError` ("no node
can start an actor: ..."). So a loss that leaves no CPU for any actor is refused within Ray's
detection time plus ``ACTOR_START_TIMEOUT_S`` (75 s to about 2 minutes with the defaults),
never by a hang. The pool does not grow back when nodes join.

Ray is an optional extra: ``pip install 'zephon_columnar[ray]'``. On a cluster of several
machines, every node needs zephon_columnar and the user's operators importable (install it in
the nodes' environment, or pass a ``runtime_env`` to ``ray.init``).
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from dataclasses import dataclass
from typing import Any, Literal

import cloudpickle
import pyarrow as pa

from zephon_columnar.engine.metrics import DeltaSink
from zephon_columnar.engine.runners.base import RunnerTraits
from zephon_columnar.engine.runners.failures import WorkerFailure, raise_worker_failure, worker_failure
from zephon_columnar.engine.runners.stages import run_stage, setup_stages
from zephon_columnar.engine.runners.waits import WorkerWaits
from zephon_columnar.errors import PipelineError
from zephon_columnar.options import import_ray

#: How many times one frame is sent again after its actor's process died on a node that lives,
#: before the error is raised (a frame that kills its actor would otherwise be retried forever).
MAX_TRIES = 3
#: How long an actor may take from being asked for to running (placed on a node, its process
#: and ``runtime_env`` up, the operators set up) before it leaves the pool; with no other actor
#: left, ``next()`` raises. A minute is far above a normal start (a few seconds: a worker
#: process, imports, ``setup()``), and far below the timeouts a training job's collectives wait
#: out (NCCL's default is 10 minutes or more), so the loader's error names the cause first.
#: Raise it on an autoscaling cluster whose new nodes take longer to join.
ACTOR_START_TIMEOUT_S = 60.0

#: How often a call waiting on an actor that has not started looks whether the cluster can still
#: place it (a GCS request).
_RECHECK_S = 1.0

Gone = Literal["died", "node lost", "never started"]


class StageWorker:
    """The body of one actor: the operators set up once, a frame in, a frame (or the operator's
    failure, as the process runner sends it) out."""

    def __init__(self, payload: bytes) -> None:
        stages, services, track = cloudpickle.loads(payload)
        self.ops = setup_stages(stages, services)
        self.sink = DeltaSink() if track else None

    def node_id(self) -> str:
        """The node this actor runs on (its first call: done once the actor has started)."""
        return str(import_ray().get_runtime_context().get_node_id())

    def run(self, stage: int, frame: pa.Table) -> Any:
        try:
            out = run_stage(self.ops[stage], frame, stage, self.sink)
        except BaseException as err:  # noqa: BLE001 - re-raised in the driver with its class
            return worker_failure(err)
        return out if self.sink is None else (out, self.sink.take())


@dataclass(eq=False)
class _Slot:
    """One actor of the pool, and what the driver knows of it."""

    actor: Any
    started: Any  # the reference of its node_id() call: ready once the actor runs
    asked_at: float  # time.monotonic() when the actor was asked for
    node: str | None = None  # the node it runs on, once it has started
    gone: Gone | None = None  # why it left the pool, once it has
    died_first: bool = False  # it died before it started
    checked_at: float = 0.0  # time.monotonic() when the driver last looked whether it can start


class _RemoteFuture(cf.Future[Any]):
    """One frame's call: a Ray object reference, sent again to a live actor when its actor died,
    its result was lost with its node, or its actor did not start in time."""

    def __init__(self, runner: RayRunner, stage: int, frame: pa.Table) -> None:
        super().__init__()
        self.runner, self.stage, self.frame = runner, stage, frame
        self.deaths = 0
        self.started_at = time.monotonic()  # the time limit counts from when the frame was sent
        self._send()

    def _send(self) -> None:
        self.slot = self.runner.next_slot(self.stage, self.frame)
        self._inner = self.slot.actor.run.remote(self.stage, self.frame).future()

    def done(self) -> bool:
        return bool(self._inner.done())

    def running(self) -> bool:
        return not self._inner.done()

    def result(self, timeout: float | None = None) -> pa.Table:
        ray = self.runner.ray
        try:
            out = self._inner.result(timeout)
        except cf.TimeoutError:
            if self.runner.dropped_unstarted(self.slot, self.stage, self.frame):
                self._send()
            raise
        except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError, ray.exceptions.ObjectLostError) as err:
            if self.runner.lost(self.slot) == "died":
                self.deaths += 1
            if self.deaths > MAX_TRIES or self.runner.cancelled.is_set():
                raise PipelineError(
                    f"Ray actors died {self.deaths} times computing {self.runner.describe(self.stage, self.frame)} "
                    f"(last: {type(err).__name__}); see the actors' logs. Rerun with options(runner='threads') to "
                    "see an error in-process."
                ) from err
            self._send()
            raise cf.TimeoutError() from None  # the caller waits again, on the new call
        if isinstance(out, WorkerFailure):
            raise_worker_failure(out)
        if isinstance(out, BaseException):
            raise out
        if isinstance(out, tuple):
            out, deltas = out
            if self.runner.metrics is not None:
                self.runner.metrics.merge(deltas)
        return out

    def cancel(self) -> bool:
        return bool(self._inner.cancel())


class RayRunner(WorkerWaits):
    """Up to ``max_workers`` Ray actors, each with its own copy of the operators; frames are
    sent to them in turn. The pool shrinks to what the cluster can place when nodes are lost."""

    traits = RunnerTraits(
        name="remote", place="remote", computes_at_submit=False, own_readers=True, starts_processes=False
    )

    def start_workers(self) -> None:
        self.ray = ray = import_ray()
        if not ray.is_initialized():
            ray.init(include_dashboard=False, log_to_driver=True)
        self._payload = cloudpickle.dumps((list(self.stages), self.services, self.metrics is not None))
        self._actor_class = ray.remote(num_cpus=1, max_restarts=0)(StageWorker)
        self._lock = threading.Lock()
        self._turn = 0
        self.replaced = 0  # actors started again after one died (tests and metrics read it)
        self.dropped = 0  # actors that left the pool for good (lost, or never started)
        self.slots = [self._new_slot() for _ in range(max(1, min(self.workers, self._cpus())))]

    @property
    def actors(self) -> list[Any]:
        """The actors of the pool now."""
        return [s.actor for s in self.slots]

    def _new_slot(self) -> _Slot:
        actor = self._actor_class.remote(self._payload)
        return _Slot(actor, actor.node_id.remote(), time.monotonic())

    def _cpus(self) -> int:
        """The CPUs of the nodes alive now: at most that many actors can run at once."""
        return int(self.ray.cluster_resources().get("CPU", 0))

    def _node_of(self, slot: _Slot) -> str | None:
        """The node ``slot``'s actor runs on, None while it has not started (or if it died first:
        then ``slot.died_first``)."""
        if slot.node is None and not slot.died_first and self.ray.wait([slot.started], timeout=0, fetch_local=False)[0]:
            try:
                slot.node = self.ray.get(slot.started)
            except Exception:  # noqa: BLE001 - its calls fail too, and say why
                slot.died_first = True
        return slot.node

    def next_slot(self, stage: int, frame: pa.Table) -> _Slot:
        """The actor for the next frame: the pool's in turn, the started ones when any is."""
        with self._lock:
            if not self.slots:
                raise self._cannot_start(stage, frame)
            started = [s for s in self.slots if self._node_of(s) is not None] or self.slots
            slot = started[self._turn % len(started)]
            self._turn += 1
            return slot

    def _drop(self, slot: _Slot, why: Gone) -> None:
        slot.gone = why
        self.slots.remove(slot)
        try:
            self.ray.kill(slot.actor, no_restart=True)
        except Exception:  # noqa: BLE001, S110 - gone already
            pass

    def lost(self, slot: _Slot) -> Gone:
        """``slot``'s actor died, or its result was lost: why (``"node lost"`` when its node is
        gone). Every actor of a lost node leaves the pool at once; the pool is refilled to what
        the nodes alive can place (one actor at least, which then has `ACTOR_START_TIMEOUT_S` to
        start). Calls that saw the same actor fail handle it once."""
        with self._lock:
            if slot.gone is not None:
                return slot.gone
            node = self._node_of(slot)
            alive = {n["NodeID"] for n in self.ray.nodes() if n.get("Alive")}
            self._drop(slot, "node lost" if node is not None and node not in alive else "died")
            gone = 1
            for other in list(self.slots):
                if other.died_first or self._node_of(other) not in alive | {None}:
                    self._drop(other, "node lost")
                    gone += 1
            cpus = self._cpus()
            for other in [s for s in self.slots if s.node is None][::-1]:
                if len(self.slots) <= max(1, cpus):
                    break
                self._drop(other, "never started")  # more actors than the nodes left can place
                gone += 1
            refill = min(gone, max(0, min(self.workers, cpus) - len(self.slots)))
            refill = max(refill, 0 if self.slots else 1)
            for _ in range(refill):
                self.slots.append(self._new_slot())
            self.replaced += refill
            self.dropped += gone - refill
            assert slot.gone is not None
            return slot.gone

    def dropped_unstarted(self, slot: _Slot, stage: int, frame: pa.Table) -> bool:
        """Whether ``slot`` left the pool before its actor started (the frame goes to another
        actor then): once the pool is larger than the nodes alive can place (the CPUs are looked
        at every `_RECHECK_S`), or after `ACTOR_START_TIMEOUT_S`. A `PipelineError` when no other
        actor is left."""
        if slot.node is not None:
            return False
        now = time.monotonic()
        if slot.gone is None and (now - slot.asked_at <= _RECHECK_S or now - slot.checked_at <= _RECHECK_S):
            return False
        with self._lock:
            if slot.gone is None:
                slot.checked_at = now
                if self._node_of(slot) is not None:
                    return False
                too_many = len(self.slots) > max(1, self._cpus())
                if not too_many and now - slot.asked_at <= ACTOR_START_TIMEOUT_S:
                    return False
                self._drop(slot, "never started")
                self.dropped += 1
            if slot.gone != "never started":
                return False  # its call fails and says why
            if not self.slots:
                raise self._cannot_start(stage, frame)
            return True

    def _cannot_start(self, stage: int, frame: pa.Table) -> PipelineError:
        resources = self.ray.cluster_resources()
        nodes = sum(1 for n in self.ray.nodes() if n.get("Alive"))
        return PipelineError(
            f"no node can start an actor: the Ray actor (1 CPU) for {self.describe(stage, frame)} did not start "
            f"within ACTOR_START_TIMEOUT_S={ACTOR_START_TIMEOUT_S} s, and no other actor of the runner is left "
            f"(the cluster has {nodes} node(s) alive with {resources.get('CPU', 0)} CPU(s); {self.replaced} "
            f"actor(s) replaced and {self.dropped} dropped after nodes or actors were lost). Add a node with a free "
            "CPU, or run on this machine with options(runner='threads'); restore the last checkpoint to go on "
            "exactly where it was taken."
        )

    def submit(self, stage: int, frame: pa.Table) -> cf.Future[Any]:
        if self.cancelled.is_set():
            raise PipelineError("the pipeline iterator was closed: no more work is taken.")
        return self._mark(_RemoteFuture(self, stage, frame), stage, frame)

    def cancel(self) -> None:
        self.cancelled.set()

    def close(self) -> None:
        """Kill the actors (a call still running is abandoned: the work is stateless)."""
        self.cancel()
        with self._lock:
            slots, self.slots = self.slots, []
        for slot in slots:
            try:
                self.ray.kill(slot.actor, no_restart=True)
            except Exception:  # noqa: BLE001, S110 - already gone, or the cluster is down
                pass
