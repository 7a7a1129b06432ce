"""Elastic resume with loader workers (issue 45): a ``to_torch_loader`` state taken on any
layout (ranks x loader workers) restores on any other, every batch once and each lane in its
own order, with no shared directory: the state carries every lane, gathered through the
``torch.distributed`` process group."""

from __future__ import annotations

import itertools
import json
import multiprocessing as mp
import warnings
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import torch.distributed as dist

from tests.engine.test_layout import free_port
from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.engine.checkpoint.loader import LOADER_STATE_KEY, loader_state_from_json
from zephon_columnar.errors import CheckpointError, ConfigurationWarning
from zephon_columnar.testing import signature

pytest.importorskip("torchdata")

LANES = 12


def build(*, endless: bool = False, lanes: int = LANES, seed: int = 3, **options: Any) -> Pipeline:
    rows = 40 * max(1, lanes // LANES)  # per shard: every lane has a few batches
    ds = Dataset.from_tables("a", [pa.table({"id": list(range(s * rows, s * rows + rows))}) for s in range(4)])
    ws = StaticMixtureWorkSource([ds], {"a": 1.0}, chunk_size=5, seed=seed, shuffle_within_shard=True,
                                 stop_after_passes=None if endless else 1)
    return Pipeline(ws).batch(2, drop_last=False).options(runner="inline", canonical_replicas=lanes, **options)


def loader_of(pipe: Pipeline, workers: int) -> Any:
    return pipe.to_torch_loader(num_workers=workers, loader="stateful", raw_batches=True,
                                multiprocessing_context="fork" if workers else None)


def sigs(batches: Any) -> list[str]:
    return [json.dumps(signature(b)) for b in batches]


def by_lane(items: list[str]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for sig in items:
        out.setdefault(json.loads(sig)[1], []).append(sig)
    return out


REFERENCE = sigs(build())  # one rank, no loader workers, uninterrupted
# Endless: lanes never run out, so every layout's loader keeps one round robin over the lanes
# (when a lane of a finite stream ends, the loader's worker turns and the lanes' differ).
TAKE = 50
ENDLESS = sigs(itertools.islice(build(endless=True), TAKE))


# ---------------------------------------------------------------------------- one rank
@pytest.mark.parametrize("saved, resumed, step", [(2, 3, 1), (0, 2, 7), (3, 1, 12), (4, 4, 7)])
def test_a_state_resumes_with_another_number_of_loader_workers_in_the_same_order(saved, resumed, step):
    loader = loader_of(build(endless=True), saved)
    it = iter(loader)
    head = sigs(next(it) for _ in range(step))
    state = json.loads(json.dumps(loader.state_dict()))  # plain types, as torch.save would keep them
    del it
    fresh = loader_of(build(endless=True), resumed)
    fresh.load_state_dict(state)
    it = iter(fresh)
    assert head + sigs(next(it) for _ in range(TAKE - step)) == ENDLESS
    del it


@pytest.mark.parametrize("saved, resumed", [(3, 2)])
def test_a_state_taken_after_a_worker_ran_out_resumes_with_other_workers(saved, resumed):
    # A finite stream: one worker's lanes end before the others' (the loader goes on with the
    # rest). The state taken then still holds every lane at its last delivered item.
    loader = loader_of(build(), saved)
    it = iter(loader)
    head = sigs(next(it) for _ in range(len(REFERENCE) - 5))
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    fresh = loader_of(build(), resumed)
    fresh.load_state_dict(state)
    assert by_lane(head + sigs(fresh)) == by_lane(REFERENCE)


def test_a_state_of_one_rank_without_a_group_or_directory_is_refused_on_another_layout():
    loader = loader_of(build(world_size=2, global_rank=1), 2)
    it = iter(loader)
    next(it)
    with pytest.warns(ConfigurationWarning, match="lanes .* of 12 only"):
        state = loader.state_dict()
    del it
    assert sorted(loader_state_from_json(state[LOADER_STATE_KEY]).lanes()) == list(range(6, 12))
    fresh = loader_of(build(), 2)
    with pytest.raises(CheckpointError, match="one rank's share"):
        fresh.load_state_dict(state)
    same = loader_of(build(world_size=2, global_rank=1), 2)  # the layout it was saved on resumes
    same.load_state_dict(state)
    assert sigs(same)


def test_a_hand_built_stateful_loader_resumed_with_other_workers_says_what_to_build():
    from torchdata.stateful_dataloader import StatefulDataLoader

    loader = StatefulDataLoader(build().to_torch_dataset(), batch_size=None, num_workers=2)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    with pytest.raises(CheckpointError, match=r"num_workers=2 over to_torch_dataset\(\).*to_torch_loader"):
        loader_of(build(), 3).load_state_dict(state)


# ---------------------------------------------------------------------------- real ranks
def whole_checkpoint(state: dict) -> dict:
    """The checkpoint a loader's state carries: its `LoaderState`'s with workers, else its dataset's."""
    if LOADER_STATE_KEY in state:
        return dict(loader_state_from_json(state[LOADER_STATE_KEY]).checkpoint)
    return state["dataset_state"]["pipeline"]


def _phase_rank(rank: int, world: int, workers: int, port: int, folder: str, phase: int, steps: int | None,
                saved_world: int, lanes: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        out: dict[str, Any] = {}
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            # The data-parallel group is the process group's rank; phase -1: rank 1 has another seed.
            pipe = build(lanes=lanes, dp_degree=world, seed=3 + (phase < 0 and rank == 1))
            loader = loader_of(pipe, workers)
            if phase > 0:  # each rank loads the state of the rank it replaces (rank r % the saving world)
                state = json.loads(Path(folder, f"state{phase - 1}-{rank % saved_world}.json").read_text())
                loader.load_state_dict(state)
            it = iter(loader)
            if steps is None:
                out["taken"] = sigs(it)
            else:
                out["taken"] = sigs(next(it) for _ in range(steps))
                try:
                    state = loader.state_dict()  # a collective: every rank, the same step
                    Path(folder, f"state{phase}-{rank}.json").write_text(json.dumps(state))
                except CheckpointError as err:
                    out["refused"] = str(err)
            del it
        out["warnings"] = [str(w.message) for w in seen if issubclass(w.category, ConfigurationWarning)]
        Path(folder, f"taken{phase}-{rank}.json").write_text(json.dumps(out))
    finally:
        dist.destroy_process_group()


def _run_phase(folder: Path, phase: int, world: int, workers: int, steps: int | None, saved_world: int,
               lanes: int = LANES) -> list[dict]:
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_phase_rank,
                         args=(r, world, workers, port, str(folder), phase, steps, saved_world, lanes))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    assert [p.exitcode for p in procs] == [0] * world
    return [json.loads((folder / f"taken{phase}-{r}.json").read_text()) for r in range(world)]


def _elastic_jobs(folder: Path, layouts: tuple[tuple[int, int], ...], lanes: int) -> list[str]:
    """Run one job per (ranks, workers per rank) layout; every job but the last takes 3 batches
    per rank and saves (no aggregate_dir: each rank's state carries every lane, gathered over
    the process group), the next loads those states; the last runs to the end. Every batch taken."""
    saved_world = 1
    taken: list[str] = []
    for phase, (world, workers) in enumerate(layouts):
        last = phase == len(layouts) - 1
        for result in _run_phase(folder, phase, world, workers, None if last else 3, saved_world, lanes):
            assert result["warnings"] == [] and "refused" not in result
            taken += result["taken"]
        if not last:
            states = [json.loads((folder / f"state{phase}-{r}.json").read_text()) for r in range(world)]
            wholes = [whole_checkpoint(s) for s in states]
            assert all(sorted(map(int, w["lanes"])) == list(range(lanes)) for w in wholes)  # on every rank
            assert all(w == wholes[0] for w in wholes)
        saved_world = world
    return taken


@pytest.mark.parametrize("layouts", [
    ((4, 2), (2, 3), (3, 1)),
    pytest.param(((3, 4), (6, 0), (2, 2)), marks=pytest.mark.slow),  # 2 cores: CI runs the first
])
def test_loader_workers_on_gloo_ranks_resume_on_other_ranks_and_workers_through_the_process_group(
        tmp_path, layouts):
    taken = _elastic_jobs(tmp_path, layouts, LANES)
    assert by_lane(taken) == by_lane(REFERENCE)  # every batch once, each lane in its own order


@pytest.mark.slow
def test_sixteen_ranks_with_loader_workers_resume_on_twelve_then_twenty_four(tmp_path):
    taken = _elastic_jobs(tmp_path, ((16, 1), (12, 2), (24, 1)), 48)
    assert by_lane(taken) == by_lane(sigs(build(lanes=48)))


def test_ranks_that_disagree_on_the_recipe_are_refused_when_the_state_is_taken(tmp_path):
    results = _run_phase(tmp_path, -1, 2, 1, 2, 1)
    for result in results:  # on every rank, naming the difference: no rank goes on with a mixed state
        assert "recipe" in result["refused"] and "seed" in result["refused"], result
