"""The Ray runner (``runner="remote"``) on clusters of several nodes, simulated on this host with
``ray.cluster_utils.Cluster`` (one raylet per node, each with its own CPUs, all on loopback):
the stream equals the threads runner's; a node lost at a seeded random point mid-run (or while
a checkpoint is taken) is survived exactly on what is left; a checkpoint taken before the loss
restores exactly after it; and when nothing is left to run an actor, ``next()`` raises a
`PipelineError` within ``ACTOR_START_TIMEOUT_S`` instead of hanging.

Every test builds its own cluster (a node loss changes it) and shuts it down."""

from __future__ import annotations

import itertools
import json
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pyarrow as pa
import pytest

from tests.extras import require

ray = require("ray", "ray")

from ray.cluster_utils import Cluster  # noqa: E402

from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource  # noqa: E402
from zephon_columnar.engine.runners import remote as ray_runner  # noqa: E402
from zephon_columnar.errors import PipelineError  # noqa: E402
from zephon_columnar.testing import collect, signature  # noqa: E402

#: A liveness bound (the pass ends at all), not a speed figure: Ray's own node-death detection
#: plus ACTOR_START_TIMEOUT_S fit in it many times over on the patched code.
HANG_GUARD_S = 120
#: Ray notices a killed node through its health checks: made fast here so the tests are short.
FAST_HEALTH_CHECKS = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500,
                      "health_check_failure_threshold": 3}


@pytest.fixture
def make_cluster(monkeypatch) -> Iterator[Callable[..., tuple[Cluster, list]]]:
    """``make_cluster(head_cpus, *node_cpus)``: a head and one worker node per entry, with the
    driver connected; shut down (Ray, then the nodes) after the test. The cluster's address is
    not published in /tmp/ray (nor that file removed after): a plain ``ray.init()`` elsewhere on
    this host, another test run's, starts its own cluster instead of joining this one."""
    monkeypatch.setattr(ray._private.utils, "write_ray_address", lambda *a, **k: None)  # noqa: SLF001
    monkeypatch.setattr(ray._common.utils, "reset_ray_address", lambda *a, **k: None)  # noqa: SLF001
    made: list[Cluster] = []

    def make(head_cpus: int, *node_cpus: int) -> tuple[Cluster, list]:
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": head_cpus,
                                                                "_system_config": FAST_HEALTH_CHECKS})
        made.append(cluster)
        nodes = [cluster.add_node(num_cpus=n) for n in node_cpus]
        ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(sys.path)}})  # actors import tests.*
        cluster.wait_for_nodes()
        return cluster, nodes

    yield make
    ray.shutdown()
    for cluster in made:
        cluster.shutdown()


def numbers(rows: int) -> StaticMixtureWorkSource:
    return StaticMixtureWorkSource([Dataset.from_tables("a", [pa.table({"x": list(range(rows))})])], {"a": 1.0},
                                   seed=1, chunk_size=64)


def double(row: dict) -> dict:
    return {"x": row["x"] * 2}


def pipeline(runner: str, rows: int = 12_000, workers: int = 3) -> Pipeline:
    """About 190 frames of 64 rows (many in flight on every actor), 750 batches."""
    return (Pipeline(numbers(rows)).fetch(max_batch=64).map_transform(double, parallelism=workers).batch(16)
            .options(runner=runner, max_workers=workers, canonical_replicas=2))


def bounded(fn: Callable[[], object], what: str, limit_s: float = HANG_GUARD_S) -> object:
    """``fn()`` on a daemon thread: its result, or a failure (not a hang) after ``limit_s``."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as err:  # noqa: BLE001 - re-raised in the test
            box["error"] = err

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit_s)
    assert not t.is_alive(), f"{what}: no result after {limit_s} s (hung)"
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]


def rest_of(it: Iterator) -> list[tuple]:
    return [signature(x) for x in it]


def wait_until_dead(node) -> None:
    """Returns once the cluster's control store lists ``node`` as dead (bounded by HANG_GUARD_S)."""
    deadline = time.monotonic() + HANG_GUARD_S
    while any(n["NodeID"] == node.node_id and n["Alive"] for n in ray.nodes()):
        assert time.monotonic() < deadline, f"node {node.node_id} still alive after {HANG_GUARD_S} s"
        time.sleep(0.1)


def nodes_of(actors: list) -> set[str]:
    return {ray.get(a.__ray_call__.remote(lambda _: ray.get_runtime_context().get_node_id())) for a in actors}


@pytest.mark.slow  # the node-loss tests below check it too, up to the loss
def test_the_stream_on_two_nodes_equals_the_threads_runners(make_cluster):
    want = collect(pipeline("threads"))
    make_cluster(1, 2)
    it = iter(pipeline("remote"))
    got = [signature(x) for x in itertools.islice(it, 50)]
    runner = it._run._runner  # noqa: SLF001
    assert len(runner.actors) == 3 and len(nodes_of(runner.actors)) == 2  # the work runs on both nodes
    got += bounded(lambda: rest_of(it), "the remote pass")
    assert got == want


def run_losing_a_node(make_cluster, seed: int, *, graceful: bool) -> None:
    """Head of 1 CPU, a node of 2; the node is removed after a seeded random number of batches."""
    want = collect(pipeline("threads"))
    cluster, (node,) = make_cluster(1, 2)
    k = random.Random(seed).randrange(1, len(want) // 2)
    it = iter(pipeline("remote"))
    got = [signature(x) for x in itertools.islice(it, k)]
    runner = it._run._runner  # noqa: SLF001
    assert len(runner.actors) == 3 and len(nodes_of(runner.actors)) == 2  # the work runs on both nodes
    cluster.remove_node(node, allow_graceful=graceful)  # frames were in flight on it: the lanes read ahead
    # The node's actor processes may live on until Ray marks the node dead (Ray 2.60 on this
    # host: the whole pass ran on them): the loss this test is about is the one Ray reports.
    wait_until_dead(node)
    almost = len(want) - k - 1
    got += bounded(lambda: [signature(x) for x in itertools.islice(it, almost)], f"the pass after batch {k}")
    assert (len(runner.actors), runner.dropped) == (1, 2)  # the pool shrank to what the head can place
    got += rest_of(it)
    assert got == want


def test_a_node_lost_mid_run_is_survived_exactly(make_cluster):
    run_losing_a_node(make_cluster, seed=0, graceful=False)


@pytest.mark.slow
@pytest.mark.parametrize("seed, graceful", [(1, True), (2, False), (3, True), (4, False)])
def test_a_node_lost_at_random_points_is_survived_exactly(make_cluster, seed, graceful):
    run_losing_a_node(make_cluster, seed, graceful=graceful)


@pytest.mark.slow
def test_a_checkpoint_taken_before_the_loss_restores_exactly_on_what_is_left(make_cluster):
    want = collect(pipeline("threads"))
    cluster, (a, b) = make_cluster(1, 1, 2)  # three nodes; two are lost
    k = random.Random(5).randrange(1, len(want) // 2)
    pipe = pipeline("remote")
    it = iter(pipe)
    head = [signature(x) for x in itertools.islice(it, k)]
    ckpt = json.loads(json.dumps(pipe.checkpoint()))
    head += [signature(x) for x in itertools.islice(it, 5)]  # delivered after the checkpoint: replayed
    cluster.remove_node(b, allow_graceful=False)
    cluster.remove_node(a, allow_graceful=True)
    wait_until_dead(a)
    wait_until_dead(b)
    it.close()
    resumed = pipeline("remote")
    resumed.restore(ckpt)
    rit = iter(resumed)
    rest = [signature(next(rit))]
    assert len(rit._run._runner.actors) == 1  # noqa: SLF001 - the head's one CPU
    rest += bounded(lambda: rest_of(rit), "the restored pass on the head alone")
    assert head[:k] + rest == want


@pytest.mark.slow
@pytest.mark.parametrize("seed", [6, 7])
def test_a_node_lost_while_a_checkpoint_is_taken_leaves_the_stream_and_the_checkpoint_exact(make_cluster, seed):
    want = collect(pipeline("threads"))
    cluster, (node,) = make_cluster(1, 2)
    k = random.Random(seed).randrange(1, len(want) // 2)
    pipe = pipeline("remote")
    it = iter(pipe)
    got = [signature(x) for x in itertools.islice(it, k)]
    killer = threading.Thread(target=lambda: cluster.remove_node(node, allow_graceful=False))
    killer.start()
    ckpt = json.loads(json.dumps(pipe.checkpoint()))  # while the node goes
    got += bounded(lambda: rest_of(it), "the pass after the checkpoint")
    killer.join(HANG_GUARD_S)
    assert got == want
    resumed = pipeline("remote")
    resumed.restore(ckpt)
    rit = iter(resumed)
    assert got[:k] + bounded(lambda: rest_of(rit), "the restored pass") == want


def test_with_no_cpu_left_next_raises_a_pipeline_error_within_the_bound(make_cluster, monkeypatch):
    bound = 5
    monkeypatch.setattr(ray_runner, "ACTOR_START_TIMEOUT_S", bound, raising=False)  # (older code: a hang)
    cluster, (node,) = make_cluster(0, 1)  # the head runs no actor: only the worker node can
    it = iter(pipeline("remote", workers=1))
    next(it)
    cluster.remove_node(node, allow_graceful=False)
    # Until Ray marks the node dead its actor process may live on and finish every frame (it did on
    # a slow CI host, and the pass ended well): the loss this test is about is the one Ray reports.
    wait_until_dead(node)
    start = time.monotonic()
    with pytest.raises(PipelineError, match=r"no node can start an actor: .*ACTOR_START_TIMEOUT_S=5"):
        bounded(lambda: rest_of(it), "the pass with no CPU left")
    # Ray's own node-death detection (fast here: FAST_HEALTH_CHECKS) comes before the bound starts.
    assert time.monotonic() - start < bound + 30
