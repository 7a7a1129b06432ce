"""`Pipeline.set_mixture`: the training loop changes the mixture between steps. The change
point follows from the delivered stream alone (the same on every runner, with prefetch and
``mtp_mode``), the pass goes on from the delivered position, checkpoints before and after the
change restore exactly in fresh processes, and ranks asked different weights are refused
(two gloo ranks)."""

from __future__ import annotations

import itertools
import json
import multiprocessing
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from tests._mixtures import NAMES, PLANS, SCHEDULE, large_source, source
from zephon_columnar import Pipeline, StaticMixtureWorkSource
from zephon_columnar.testing import signature

NEW = {"code": 1.0, "math": 3.0}  # the trainer's reweighting


def build(plan: str, **options: Any) -> Pipeline:
    if plan == "rows-large":  # stateless: a flush epoch is a frame of rows, more than the small data
        return Pipeline(large_source()).batch(64).options(canonical_replicas=2, **options)
    return PLANS[plan](Pipeline(source())).options(canonical_replicas=2, **options)


def run_with_change(pipe: Pipeline, at_item: int, *, checkpoints: tuple[int, ...] = ()) -> dict[str, Any]:
    """Every item of the pass, with set_mixture(NEW) after item ``at_item`` and checkpoints
    after the items in ``checkpoints``."""
    it = iter(pipe)
    items, ckpts, change = [], {}, None
    for n in itertools.count():
        if n in checkpoints:
            ckpts[n] = json.loads(json.dumps(pipe.checkpoint()))
        if n == at_item:
            change = pipe.set_mixture(NEW)
        item = next(it, None)
        if item is None:
            break
        items.append(json.loads(json.dumps(signature(item))))
    return {"items": items, "change": change, "checkpoints": ckpts}


RUNNERS = {
    "inline": {"runner": "inline"},
    "threads-prefetch": {"runner": "threads", "prefetch_batches": 4},
    "process": {"runner": "process", "max_workers": 2},
    "mtp": {"mtp_mode": True, "prefetch_batches": 2},
}


@pytest.mark.parametrize("plan", ["rows-large", "shuffle", "tokens-packed"])
def test_the_change_point_and_the_stream_are_the_same_on_every_runner(plan) -> None:
    reference = run_with_change(build(plan, runner="inline"), at_item=5)
    plain = run_with_change(build(plan, runner="inline"), at_item=-1)
    assert reference["change"].at > 0 and reference["items"][:5] == plain["items"][:5]
    assert reference["items"] != plain["items"]  # the change took effect
    for name in ("threads-prefetch", "process") + (("mtp",) if plan == "tokens-packed" else ()):
        got = run_with_change(build(plan, **RUNNERS[name]), at_item=5)
        assert got["change"] == reference["change"], name
        assert got["items"] == reference["items"], name


def test_chunks_from_the_change_point_follow_the_new_weights() -> None:
    # one lane, records: a record's chunk_id is its global chunk; flush epochs of 2 chunks
    pipe = (
        Pipeline(source(chunk_size=5))
        .shuffle(4, seed=3)
        .options(runner="threads", prefetch_batches=8, flush_every_k_chunks=2)
    )
    it = iter(pipe)
    head = [next(it) for _ in range(12)]
    change = pipe.set_mixture(NEW)
    rest = list(it)
    assert change.at == (head[-1].meta.chunk_id // 2 + 1) * 2  # the flush epoch after the last item's
    by_chunk: dict[int, set[str]] = {}
    for r in head + rest:
        by_chunk.setdefault(r.meta.chunk_id, set()).add(NAMES[r.meta.sample_id[0]])
    until = min(p.at for p in SCHEDULE if p.at > change.at)  # a change holds until the schedule's next point
    assert change.at < until and all(
        names <= {"code", "math"} for g, names in by_chunk.items() if change.at <= g < until
    )
    assert {"web", "code", "math"} <= set().union(*(by_chunk[g] for g in range(until, until + 3)))
    assert all(names == {"web"} for g, names in by_chunk.items() if g < min(change.at, 4))


def _resume_main(path: str) -> None:
    """A fresh process: restore a checkpoint, call set_mixture after ``then`` items if asked,
    and write every item it delivers."""
    job = json.loads(Path(path).read_text())
    pipe = build(job["plan"], **RUNNERS[job["runner"]])
    pipe.restore(job["checkpoint"])
    got = run_with_change(pipe, at_item=job["then"] if job["then"] is not None else -1)
    Path(path).write_text(
        json.dumps({"items": got["items"], "at": None if got["change"] is None else got["change"].at})
    )


@pytest.mark.parametrize("plan", ["shuffle", "tokens-packed"])
def test_checkpoints_before_and_after_the_change_restore_in_fresh_processes(plan, tmp_path) -> None:
    change_at_item = 9
    reference = run_with_change(build(plan, runner="inline"), at_item=change_at_item, checkpoints=(0, 4, 9, 10, 17))
    items, change = reference["items"], reference["change"]
    context = multiprocessing.get_context("spawn")
    for n, ckpt in reference["checkpoints"].items():
        # a checkpoint before the change: the restored loop calls set_mixture at the same step again
        then = change_at_item - n if n <= change_at_item and n != change_at_item else None
        if n == change_at_item:
            then = 0  # taken at the very step of the call, before it
        job = tmp_path / f"job{n}.json"
        job.write_text(
            json.dumps(
                {"plan": plan, "runner": ["threads-prefetch", "inline"][n % 2], "checkpoint": ckpt, "then": then}
            )
        )
        child = context.Process(target=_resume_main, args=(str(job),))
        child.start()
        child.join(120)
        assert child.exitcode == 0, f"checkpoint after item {n}: the child failed"
        got = json.loads(job.read_text())
        assert got["items"] == items[n:], f"checkpoint after item {n}"
        if then is not None:
            assert got["at"] == change.at


def test_a_static_mixture_cannot_change_and_bad_weights_name_the_problem() -> None:
    from tests._mixtures import DATASETS

    static = Pipeline(StaticMixtureWorkSource(DATASETS, dict.fromkeys(NAMES, 1.0), chunk_size=10))
    with pytest.raises(TypeError, match="build the pipeline over a ScheduledMixtureWorkSource"):
        static.set_mixture({"web": 1})
    pipe = build("rows")
    with pytest.raises(KeyError, match=r"unknown component\(s\) \['wiki'\]"):
        pipe.set_mixture({"wiki": 1})
    with pytest.raises(ValueError, match="weight of 'web' is -1"):
        pipe.set_mixture({"web": -1})
    one_of_two = build("rows", world_size=2, global_rank=1)  # no torch.distributed group to agree through
    with pytest.raises(RuntimeError, match=r"this rank reads lanes \[1\] of 2.*Initialize torch.distributed"):
        one_of_two.set_mixture({"web": 1})
    before = pipe.set_mixture({"code": 1.0})  # before the pass: from its first chunk
    assert before.at == 0
    # the first 4 batches (2 lanes, 3 of a lane's first 10-row chunk each): global chunks 0 and 1
    first = {d for batch in itertools.islice(pipe, 4) for d in batch.table["__dataset"].to_pylist()}
    assert first == {NAMES.index("code")}  # instead of the warm-up's web, until the schedule's next point


def _ranks_main(rank: int, store: str, out: str, same: bool) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        pipe = build("shuffle", runner="inline", world_size=2, global_rank=rank)
        it = iter(pipe)
        for _ in range(3 + rank):  # ranks at different depths: the change point is the furthest
            next(it)
        weights = NEW if same or rank == 0 else {"web": 1.0}
        try:
            result: Any = {"at": pipe.set_mixture(weights).at, "next": json.loads(json.dumps(signature(next(it))))}
        except RuntimeError as err:
            result = {"error": str(err)}
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("same", [True, False], ids=["agree", "disagree"])
def test_ranks_agree_on_the_change_or_are_refused(tmp_path, same) -> None:
    mp.spawn(_ranks_main, args=(str(tmp_path / "store"), str(tmp_path), same), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    if same:
        assert results[0]["at"] == results[1]["at"] > 0
    else:
        for r in results:
            assert "ranks were asked different mixtures" in r["error"]
            assert "rank 0: {'code': '1/4', 'math': '3/4'}" in r["error"] and "rank 1: {'web': '1'}" in r["error"]


def test_loader_workers_restart_at_the_change_point() -> None:
    # the rank's stream through two spawned loader workers equals the in-process one, change included
    reference = run_with_change(build("shuffle", runner="inline"), at_item=5)
    loader = build("shuffle", runner="inline").to_torch_loader(num_workers=2, raw_batches=True, timeout=120)
    it = iter(loader)
    items = [json.loads(json.dumps(signature(next(it)))) for _ in range(5)]
    change = loader.set_mixture(NEW)  # between two batches of the open iteration
    items += [json.loads(json.dumps(signature(batch))) for batch in it]
    assert change == reference["change"]
    assert items == reference["items"]



def test_two_calls_in_one_flush_epoch_the_later_governs_and_checkpoints_restore() -> None:
    def loop(pipe: Pipeline, start: int = 0, stop: int | None = None) -> tuple[list, Any, list]:
        it, items, changes, ckpt = iter(pipe), [], [], None
        for n in itertools.count(start):
            if n == stop:
                ckpt = json.loads(json.dumps(pipe.checkpoint()))
                break
            if n in (6, 7):  # one flush epoch: both land on the same chunk
                changes.append(pipe.set_mixture(NEW if n == 6 else {"web": 1.0}))
            item = next(it, None)
            if item is None:
                break
            items.append(json.loads(json.dumps(signature(item))))
        it.close()
        return items, ckpt, changes

    full, _, changes = loop(build("shuffle", runner="threads"))
    assert changes[0].at == changes[1].at
    head, ckpt, _ = loop(build("shuffle", runner="inline"), stop=11)
    resumed = build("shuffle", runner="inline")
    resumed.restore(ckpt)
    assert head + loop(resumed, start=11)[0] == full


def test_a_checkpoint_after_a_change_restores_on_other_numbers_of_groups() -> None:
    # one group changes the mixture and checkpoints; 2 and 4 groups continue: each lane's items
    # are those of the uninterrupted one-group run (the change is in every lane's state)
    def make(groups: int = 1, group: int = 0) -> Pipeline:
        return PLANS["shuffle"](Pipeline(source())).options(
            runner="inline", canonical_replicas=4, world_size=groups, global_rank=group
        )

    reference = run_with_change(make(), at_item=6, checkpoints=(14,))
    full, ckpt = reference["items"], reference["checkpoints"][14]
    by_lane: dict[int, list] = {}
    for item in full:
        by_lane.setdefault(item[1], []).append(item)
    head = full[:14]
    for groups in (2, 4):
        rest = []
        for g in range(groups):
            pipe = make(groups, g)
            pipe.restore(ckpt)
            rest += [json.loads(json.dumps(signature(x))) for x in pipe]
        got: dict[int, list] = {}
        for item in head + rest:
            got.setdefault(item[1], []).append(item)
        assert got == by_lane, f"{groups} groups"


def test_a_scheduled_loader_with_workers_resumes_from_its_state() -> None:
    full = [json.loads(json.dumps(signature(b))) for b in build("shuffle", runner="inline")]
    loader = build("shuffle", runner="inline").to_torch_loader(num_workers=2, raw_batches=True, timeout=120)
    it = iter(loader)
    head = [json.loads(json.dumps(signature(next(it)))) for _ in range(9)]
    state = loader.state_dict()
    del it
    again = build("shuffle", runner="inline").to_torch_loader(num_workers=2, raw_batches=True, timeout=120)
    again.load_state_dict(state)
    assert head + [json.loads(json.dumps(signature(b))) for b in again] == full


def test_restoring_an_earlier_checkpoint_leaves_later_changes_behind() -> None:
    pipe = build("shuffle", runner="inline")
    got = run_with_change(pipe, at_item=5, checkpoints=(2,))
    assert got["change"].at > 0
    pipe.restore(got["checkpoints"][2])  # the same pipeline object, which has seen the change
    plain = run_with_change(build("shuffle", runner="inline"), at_item=-1)["items"]
    assert run_with_change(pipe, at_item=-1)["items"] == plain[2:]  # as a fresh restore: no change


@pytest.mark.parametrize("workers", [0, 2])
def test_a_device_loader_changes_at_the_trainers_step_not_at_the_batches_crossing_ahead(workers) -> None:
    def ids(batch: Any) -> list:
        return batch.to_training(return_labels=True)["input_ids"].tolist()

    pipe = PLANS["tokens-packed"](Pipeline(source())).options(canonical_replicas=2, runner="inline")
    it = iter(pipe)
    reference = [ids(next(it)) for _ in range(5)]
    reference_change = pipe.set_mixture(NEW)
    reference += [ids(b) for b in it]
    device = PLANS["tokens-packed"](Pipeline(source())).options(canonical_replicas=2, runner="inline")
    timeout = 120 if workers else 0  # (a single-process loader takes none)
    loader = device.to_torch_loader(device="cpu", prefetch=3, num_workers=workers, timeout=timeout, return_labels=True)
    batches = iter(loader)
    got = [next(batches)["input_ids"].tolist() for _ in range(5)]  # 3 more are crossing ahead meanwhile
    change = loader.set_mixture(NEW)
    got += [b["input_ids"].tolist() for b in batches]
    assert change == reference_change
    assert got == reference
