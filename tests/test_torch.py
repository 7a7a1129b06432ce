"""Torch adapter: DataLoader(batch_size=None) iteration and state_dict under a plain DataLoader."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pytest
import torch
from torch.utils.data import DataLoader

from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.errors import CheckpointError, ConfigError

DS = Dataset.from_tables("a", [pa.table({"input_ids": [[i, i + 1, i + 2] for i in range(s * 20, s * 20 + 20)]})
                               for s in range(3)])


def build(lanes: int = 1, **source: object) -> Pipeline:
    ws = StaticMixtureWorkSource([DS], {"a": 1.0}, chunk_size=8, seed=3, shuffle_within_shard=True, **source)
    return Pipeline(ws).batch(4).options(canonical_replicas=lanes)


def training(batch) -> dict[str, torch.Tensor]:  # module level: spawned workers import it
    return batch.to_training()


def rows(loader) -> list[list[list[int]]]:
    return [t["input_ids"].tolist() for t in loader]


def test_dataloader_yields_training_tensors():
    ds = build().to_torch_dataset(return_labels=True)
    out = list(DataLoader(ds, batch_size=None))
    assert len(out) == 15
    assert out[0]["input_ids"].shape == (4, 2) and out[0]["labels"].dtype == torch.int64


def test_state_dict_under_plain_dataloader_resumes_exactly():
    full = rows(DataLoader(build().to_torch_dataset(), batch_size=None, collate_fn=lambda b: b.to_training()))
    ds = build().to_torch_dataset()
    loader = DataLoader(ds, batch_size=None, collate_fn=lambda b: b.to_training())
    head = []
    for i, t in enumerate(loader):
        head.append(t["input_ids"].tolist())
        if i == 5:
            state = json.loads(json.dumps(ds.state_dict()))
            break
    ds2 = build().to_torch_dataset()
    ds2.load_state_dict(state)
    rest = rows(DataLoader(ds2, batch_size=None, collate_fn=lambda b: b.to_training()))
    assert head + rest == full


def test_worker_processes_split_lanes_and_cover_everything():
    single = sorted(map(str, rows(DataLoader(build(lanes=2).to_torch_dataset(return_padding_mask=True),
                                             batch_size=None))))
    multi = sorted(map(str, rows(DataLoader(build(lanes=2).to_torch_dataset(return_padding_mask=True),
                                            batch_size=None, num_workers=2))))
    assert multi == single



def test_spawned_workers_get_lambdas_and_polars_maps_after_the_parent_ran_polars():
    import polars as pl

    def pipe() -> Pipeline:
        ws = StaticMixtureWorkSource([DS], {"a": 1.0}, chunk_size=8, seed=3, shuffle_within_shard=True)
        return (Pipeline(ws).map_transform(pl.col("input_ids").list.eval(pl.element() * 2))
                .map_transform(lambda p: {**p, "input_ids": [t + 1 for t in p["input_ids"]]})
                .batch(4).options(canonical_replicas=2))

    single = rows(DataLoader(pipe().to_torch_dataset(), batch_size=None, collate_fn=training))  # Polars ran here
    tokens = [t for batch in single for row in batch for t in row]
    assert len(tokens) == 3 * 60 and all(t % 2 == 1 for t in tokens)  # both maps ran on every row
    spawned = DataLoader(pipe().to_torch_dataset(), batch_size=None, collate_fn=training, num_workers=2,
                         multiprocessing_context="spawn", timeout=120)
    assert sorted(map(str, rows(spawned))) == sorted(map(str, single))
    forked = DataLoader(pipe().to_torch_dataset(), batch_size=None, collate_fn=training, num_workers=1,
                        multiprocessing_context="fork", timeout=120)
    with pytest.raises(RuntimeError, match="forked from process .* after that one ran Polars"):
        list(forked)

def test_load_state_dict_rejects_foreign_state():
    with pytest.raises(ConfigError, match="pipeline"):
        build().to_torch_dataset().load_state_dict({"engine": {}})


def test_state_dict_after_worker_iteration_refuses_instead_of_restarting():
    ds = build(lanes=2).to_torch_dataset()
    batches = list(DataLoader(ds, batch_size=None, num_workers=1))
    assert len(batches) == 15
    with pytest.raises(ConfigError, match="num_workers=0"):
        ds.state_dict()


def ids_of(loader) -> list[list[list[int]]]:
    return [b["input_ids"].tolist() for b in loader]


@pytest.mark.parametrize("lanes, workers, step", [(2, 2, 3), (2, 2, 4), (4, 2, 5), (4, 4, 7), (4, 3, 2), (6, 4, 9)])
def test_loader_workers_continue_a_checkpoint_in_the_uninterrupted_order(lanes, workers, step):
    # An endless source: the order holds while every lane is live (when lanes run dry at
    # different times the loader's round robin skips the finished workers instead).
    def dataset():
        return build(lanes, exhausted_policy="repeat").to_torch_dataset(return_labels=True)

    n = 24
    full = [b["input_ids"].tolist() for _, b in zip(range(n), DataLoader(dataset(), batch_size=None))]
    ds = dataset()
    head = []
    for i, t in enumerate(DataLoader(ds, batch_size=None)):
        head.append(t["input_ids"].tolist())
        if i + 1 == step:
            state = ds.state_dict()
            break
    resumed = dataset()
    resumed.load_state_dict(state)
    loader = DataLoader(resumed, batch_size=None, num_workers=workers)
    rest = [b["input_ids"].tolist() for _, b in zip(range(n - step), loader)]
    assert head + rest == full  # exact order, also after an odd step


def test_loader_workers_deliver_every_batch_of_a_finite_stream_once_after_a_restore():
    full = ids_of(DataLoader(build(3).to_torch_dataset(), batch_size=None, collate_fn=lambda b: b.to_training()))
    ds = build(3).to_torch_dataset()
    it = iter(DataLoader(ds, batch_size=None, collate_fn=lambda b: b.to_training()))
    head = [next(it)["input_ids"].tolist() for _ in range(4)]
    resumed = build(3).to_torch_dataset()
    resumed.load_state_dict(ds.state_dict())
    rest = ids_of(DataLoader(resumed, batch_size=None, num_workers=2, collate_fn=lambda b: b.to_training()))
    assert sorted(map(str, head + rest)) == sorted(map(str, full))  # 3 lanes over 2 workers: one serves them


def test_a_worker_pass_refuses_state_dict_only_until_the_next_main_process_pass():
    ds = build(lanes=2).to_torch_dataset()
    assert len(list(DataLoader(ds, batch_size=None, num_workers=2))) == 15
    with pytest.raises(ConfigError, match="StatefulDataLoader"):
        ds.state_dict()
    it = iter(DataLoader(ds, batch_size=None))
    next(it)
    assert set(ds.state_dict()) == {"pipeline"}


def test_worker_iteration_leaves_no_file_and_exits_cleanly(tmp_path):
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
        from torch.utils.data import DataLoader
        from tests.test_torch import build
        ds = build(lanes=2).to_torch_dataset()
        print(len(list(DataLoader(ds, batch_size=None, num_workers=2))))
    """)
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "15", done.stderr
    assert "Error" not in done.stderr and "Exception" not in done.stderr, done.stderr
    assert not [p for p in tmp_path.iterdir() if "zephon" in p.name]


def test_a_stopping_worker_waits_for_its_queue_feeder_within_the_bound():
    # A loader worker told to stop mid-stream exits while its result queue's feeder thread may
    # still be moving a batch to shared memory; ending the interpreter then aborts the worker
    # (seen by the option oracle, seed 38). Its exit waits for the feeder, but never past the bound.
    import threading

    from zephon_columnar.torch import await_queue_feeders

    release = threading.Event()
    sending = threading.Thread(target=lambda: release.wait(0.3), name="QueueFeederThread")
    stuck = threading.Thread(target=release.wait, name="QueueFeederThread")
    unrelated = threading.Thread(target=release.wait, name="other")
    for thread in (sending, stuck, unrelated):
        thread.start()
    try:
        await_queue_feeders(1.0)  # waits out `sending` (0.3 s), then gives `stuck` what is left
        assert not sending.is_alive()
        assert stuck.is_alive() and unrelated.is_alive()  # returned at the bound, not when stuck ended
    finally:
        release.set()
        for thread in (sending, stuck, unrelated):
            thread.join()


def test_a_process_exiting_while_its_queue_sends_a_tensor_exits_cleanly(tmp_path):
    # What a loader worker does when stopped mid-stream: put a batch, close the queue without
    # waiting, exit. A large tensor keeps the feeder thread in torch's C++ (moving it to shared
    # memory) as the interpreter ends; without the exit wait torch 2.x aborts the process there.
    import subprocess
    import sys

    script = tmp_path / "put_and_exit.py"
    script.write_text(
        "import torch, torch.multiprocessing as mp\n"
        "from zephon_columnar.torch import exit_after_queue_feeders\n"
        "exit_after_queue_feeders()\n"
        "q = mp.get_context('spawn').Queue()\n"
        "q.put(torch.ones(20_000_000))\n"
        "q.cancel_join_thread()\n"
        "q.close()\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert "terminate called" not in done.stderr, done.stderr


def test_iterating_in_a_loader_worker_registers_the_exit_wait(monkeypatch):
    import types

    import zephon_columnar.torch as adapter

    monkeypatch.setattr(adapter, "_feeder_wait_registered", False)
    ds = build(lanes=2).to_torch_dataset()
    next(iter(ds))
    assert not adapter._feeder_wait_registered  # the main process's own exit is the user's
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: types.SimpleNamespace(id=0, num_workers=1))
    next(iter(ds))
    assert adapter._feeder_wait_registered


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("step", [1, 4, 7])
def test_stateful_dataloader_resumes_mid_epoch_exactly(workers, step):
    from torchdata.stateful_dataloader import StatefulDataLoader

    def loader_of(ds):  # the same loader uninterrupted is the reference
        return StatefulDataLoader(ds, batch_size=None, num_workers=workers)

    full = ids_of(loader_of(build(4).to_torch_dataset(return_labels=True)))
    single = ids_of(DataLoader(build(4).to_torch_dataset(return_labels=True), batch_size=None))
    assert sorted(map(str, full)) == sorted(map(str, single))
    loader = StatefulDataLoader(build(4).to_torch_dataset(return_labels=True), batch_size=None, num_workers=workers)
    head = []
    for i, t in enumerate(loader):
        head.append(t["input_ids"].tolist())
        if i + 1 == step:
            state = json.loads(json.dumps(loader.state_dict()))  # plain types
            break
    fresh = StatefulDataLoader(build(4).to_torch_dataset(return_labels=True), batch_size=None, num_workers=workers)
    fresh.load_state_dict(state)
    assert head + ids_of(fresh) == full


@pytest.mark.parametrize("resume_world, resume_rank", [(1, 0), (2, 1), (4, 0)])
def test_a_worker_state_resumed_on_another_data_parallel_layout_is_refused(resume_world, resume_rank):
    # A StatefulDataLoader state with loader workers holds its rank's lanes only: resumed by a
    # rank owning other lanes it would deliver another rank's data, or stop early (Zephon's
    # elasticity test saw the early stop). It is refused, naming both layouts.
    from torchdata.stateful_dataloader import StatefulDataLoader

    def loader(world: int, rank: int) -> StatefulDataLoader:
        ds = build(4).options(world_size=world, global_rank=rank).to_torch_dataset()
        return StatefulDataLoader(ds, batch_size=None, num_workers=2)

    it = iter(loader(2, 0))  # lanes [0, 1]
    next(it), next(it)
    state = json.loads(json.dumps(it.state_dict()))
    del it
    fresh = loader(resume_world, resume_rank)
    fresh.load_state_dict(state)
    with pytest.raises(CheckpointError, match=r"saved by a rank owning lanes \[0, 1\].*num_workers=0"):
        next(iter(fresh))
    same = loader(2, 0)  # the layout it was saved on resumes
    same.load_state_dict(state)
    assert next(iter(same)) is not None


@pytest.mark.parametrize("worlds, workers, steps", [
    ((2, 1), 2, 3), ((2, 4), 2, 2), ((1, 2), 2, 3), ((1, 4), 2, 4), ((2, 4), 3, 1), ((4, 2), 2, 2), ((2, 1), 2, 0),
    ((4, 2, 4), 2, 1), ((2, 1, 2), 3, 2), ((1, 2, 2), 2, 1)])
@pytest.mark.parametrize("state_from", ["rank0", "own"])
def test_stateful_dataloader_with_workers_resumes_on_another_layout(tmp_path, worlds, workers, steps, state_from):
    # Elastic: every rank takes `steps` batches through a StatefulDataLoader with loader workers
    # and saves its state; the job goes on with another number of ranks (each loading rank 0's
    # state, or the state of the rank it replaces, under a run_id of its own), and so on; the
    # last job runs to the end. Every lane's batches come out exactly once and in the lane's own
    # order, as in one uninterrupted single-rank run.
    from torchdata.stateful_dataloader import StatefulDataLoader

    def loader(world: int, rank: int, job: int) -> StatefulDataLoader:
        pipe = build(4).options(world_size=world, global_rank=rank, aggregate_dir=str(tmp_path), run_id=f"job{job}")
        return StatefulDataLoader(pipe.to_torch_dataset(return_labels=True), batch_size=None, num_workers=workers)

    lane_of, order = {}, {}
    for item in build(4):  # the lanes' own streams
        key = tuple(map(tuple, item.to_training(return_labels=True)["input_ids"].tolist()))
        lane_of[key] = item.lane_ids[0]
        order.setdefault(item.lane_ids[0], []).append(key)

    delivered: dict[int, list[tuple]] = {lane: [] for lane in order}

    def take(batches) -> None:
        for b in batches:
            key = tuple(map(tuple, b["input_ids"].tolist()))
            delivered[lane_of[key]].append(key)

    states: list = []
    for job, world in enumerate(worlds):
        saved, states = states, []
        for rank in range(world):
            dl = loader(world, rank, job)
            if saved:
                dl.load_state_dict(saved[0 if state_from == "rank0" else rank % len(saved)])
            if job == len(worlds) - 1:
                take(dl)
                continue
            it = iter(dl)
            take(next(it) for _ in range(steps))
            states.append(json.loads(json.dumps(it.state_dict())))
            del it
    assert delivered == order


def test_an_elastic_worker_resume_names_a_missing_snapshot(tmp_path):
    from torchdata.stateful_dataloader import StatefulDataLoader

    def loader(world: int, rank: int) -> StatefulDataLoader:
        pipe = build(4).options(world_size=world, global_rank=rank, aggregate_dir=str(tmp_path), run_id="r")
        return StatefulDataLoader(pipe.to_torch_dataset(), batch_size=None, num_workers=2)

    it = iter(loader(2, 0))
    next(it), next(it)
    state = it.state_dict()
    del it  # rank 1 never ran: its snapshots are missing
    fresh = loader(1, 0)
    fresh.load_state_dict(state)
    with pytest.raises(CheckpointError, match=r"needs .*g00001-w000-k000000001\.json.*missing"):
        next(iter(fresh))


@pytest.mark.parametrize("lanes", [1, 2])
@pytest.mark.parametrize("k, more", [(1, 0), (2, 1), (3, 2), (5, 0), (6, 2)])
def test_state_dict_soon_after_a_restore_that_held_prefetched_rows(lanes, k, more):
    """A restore under the threads runner with prefetch reads ahead at once; a state_dict taken
    0-2 batches later must still describe what was delivered. It raised 'no work-source state
    for chunk N' (the read-ahead's chunks had no source state yet)."""
    def loader():  # a stateless plan (batch only): the prefetched rows are all the state there is
        ds = build(lanes).options(prefetch_batches=4, runner="threads").to_torch_dataset()
        return ds, DataLoader(ds, batch_size=None, collate_fn=lambda b: (b.ids, b.to_training()["input_ids"].tolist()))

    full = list(loader()[1])
    first, it = loader()
    it = iter(it)
    head = [next(it) for _ in range(k)]
    state = json.loads(json.dumps(first.state_dict()))
    second, it = loader()
    second.load_state_dict(state)
    it = iter(it)
    middle = [next(it) for _ in range(more)]
    state = json.loads(json.dumps(second.state_dict()))  # soon after the restore: prefetch still filling
    third, rest = loader()
    third.load_state_dict(state)
    assert head + middle + list(rest) == full


def test_process_runner_inside_loader_workers_runs_on_threads_with_a_warning():
    """Found by the option oracle: DataLoader workers are daemons, which may not start processes;
    options(runner='process') crashed in them ('daemonic processes are not allowed to have
    children'). The worker's stages run on threads instead, the data unchanged."""
    pipe = build(lanes=2).options(runner="process")
    loader = DataLoader(pipe.to_torch_dataset(return_labels=True), batch_size=None, num_workers=2,
                        multiprocessing_context="spawn")
    got = sorted(map(str, rows(loader)))
    want = sorted(map(str, rows(DataLoader(build(lanes=2).to_torch_dataset(return_labels=True), batch_size=None))))
    assert got == want and len(got) == 15
