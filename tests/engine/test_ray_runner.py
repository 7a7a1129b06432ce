"""The Ray runner (``runner="remote"``) on a real local Ray cluster of 2 CPUs, started once for
this module: the same items as the threads runner over every operator, checkpoints that move
between runners and data-parallel layouts, an actor killed mid-run, errors that keep their
class, and ``close()`` with a user function stuck in an actor."""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import pyarrow as pa
import pytest

from tests.extras import require

ray = require("ray", "ray")

from tests.test_checkpoint_fuzz import build  # noqa: E402
from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.engine.runners.remote import MAX_TRIES
from zephon_columnar.errors import ConfigError, PipelineError
from zephon_columnar.testing import collect, take_and_checkpoint

HANG_GUARD_S = 60  # a liveness bound (the call returns at all), not a speed figure


@pytest.fixture(scope="module", autouse=True)
def local_cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(sys.path)}})  # actors import tests.*
    yield
    ray.shutdown()


def in_an_actor() -> bool:
    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


EVERY_OPERATOR = dict(before=["upper", "filter", "python"], split=True, after=["shuffle", "stateful", "columnar"],
                      ensure=True, seed=3, chunk=7, flush=2, batch=2, shuffle_seed=1)


@pytest.mark.parametrize("pack", [None, "wrap", "first_fit", "best_fit", "best_fit_wrap"])
def test_the_items_equal_the_threads_runners_over_every_operator(pack):
    recipe = {**EVERY_OPERATOR, "pack": pack, "ensure": pack is not None}
    threads = collect(build(recipe, runner="threads"))
    assert len(threads) > 10
    assert collect(build(recipe, runner="remote")) == threads
    assert collect(build(recipe, runner="ray")) == threads  # Ray's own name for it


@pytest.mark.parametrize("saved_on, restored_on, groups", [("remote", "threads", 2), ("threads", "remote", 1),
                                                          ("remote", "remote", 2)])
def test_a_checkpoint_moves_between_runners_and_data_parallel_layouts(saved_on, restored_on, groups):
    recipe = {**EVERY_OPERATOR, "pack": "best_fit"}
    full = collect(build(recipe))
    head, ckpt = take_and_checkpoint(build(recipe, runner=saved_on), len(full) // 3)
    ckpt = json.loads(json.dumps(ckpt))
    rest = []
    for g in range(groups):
        pipe = build(recipe, runner=restored_on, groups=groups, group=g)
        pipe.restore(ckpt)
        rest += collect(pipe)
    assert sorted(head + rest) == sorted(full)
    if groups == 1:
        assert head + rest == full


def numbers(rows: int) -> StaticMixtureWorkSource:
    return StaticMixtureWorkSource([Dataset.from_tables("a", [pa.table({"x": list(range(rows))})])], {"a": 1.0},
                                   seed=1, chunk_size=64)


def double(row: dict) -> dict:
    return {"x": row["x"] * 2}


def test_an_actor_killed_mid_run_is_replaced_and_its_frames_recomputed():
    def pipe(runner: str) -> Pipeline:
        return Pipeline(numbers(60_000)).map_transform(double).batch(16).options(runner=runner, max_workers=2)

    want = collect(pipe("threads"))
    it = iter(pipe("remote"))
    got = collect(x for _, x in zip(range(200), it))
    runner = it._run._runner  # noqa: SLF001
    ray.kill(runner.actors[0], no_restart=True)  # frames were in flight on it: the lanes read ahead
    got += collect(it)
    assert got == want
    assert runner.replaced >= 1


def dies_in_actors(row: dict) -> dict:
    if in_an_actor():
        os._exit(5)
    return row


def test_an_actor_that_dies_on_every_try_is_a_pipeline_error_naming_the_stage_and_sample():
    pipe = Pipeline(numbers(1000)).map_transform(dies_in_actors).options(runner="remote", max_workers=1)
    with pytest.raises(PipelineError, match=rf"Ray actors died {MAX_TRIES + 1} times computing operator\(s\) fetch "
                                            r"-> map_transform \(stage 0\) on \d+ rows of lane 0, chunk \d+ .*first "
                                            r"sample: dataset id 0, shard 0, row \d+\)"):
        sum(1 for _ in pipe)


def raises_key_error(row: dict) -> dict:
    if row["x"] == 700:
        raise KeyError("no field 'text' in row 700")
    return row


def test_an_operator_error_keeps_its_class_across_the_actor_boundary():
    pipe = Pipeline(numbers(1000)).map_transform(raises_key_error).options(runner="remote", max_workers=2)
    with pytest.raises(KeyError, match="no field 'text' in row 700") as caught:
        sum(1 for _ in pipe)
    assert isinstance(caught.value, PipelineError)  # and the library's own class too


def sleeps_in_actors(row: dict) -> dict:
    if in_an_actor() and row["x"] == 3000:
        time.sleep(10**6)
    return row


def test_close_returns_while_an_actor_is_stuck_in_a_user_function():
    pipe = Pipeline(numbers(20_000)).map_transform(sleeps_in_actors).batch(4).options(runner="remote", max_workers=2)
    it = iter(pipe)
    got = [next(it) for _ in range(100)]
    consumer = threading.Thread(target=lambda: got.extend(it), daemon=True)  # ends (StopIteration) once closed
    consumer.start()
    time.sleep(2)  # the consumer now waits on the stuck frame
    closer = threading.Thread(target=it.close, daemon=True)
    closer.start()
    closer.join(HANG_GUARD_S)
    consumer.join(HANG_GUARD_S)
    assert not closer.is_alive() and not consumer.is_alive()
    assert 100 <= len(got) <= 3000 // 4


def test_op_timeout_turns_a_stuck_actor_call_into_an_error_naming_the_operator():
    pipe = (Pipeline(numbers(20_000)).map_transform(sleeps_in_actors)
            .options(runner="remote", max_workers=2, op_timeout_s=3))
    with pytest.raises(PipelineError, match=r"map_transform \(stage 0\) on \d+ rows .* ran for more than "
                                            r"options\(op_timeout_s=3\) seconds"):
        sum(1 for _ in pipe)


def test_without_ray_installed_the_remote_runner_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as if it were not installed
    for name in ("remote", "ray"):
        with pytest.raises(ConfigError, match=r"pip install 'zephon_columnar\[ray\]'"):
            Pipeline(numbers(10)).options(runner=name)
