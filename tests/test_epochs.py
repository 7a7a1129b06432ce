"""Epochs (`Pipeline.set_epoch`): iterating again repeats the order; each epoch has its own
order over the same rows, the same on every run, runner and loader worker count; a checkpoint
records its epoch and resumes only there; a source with no seed has no other epoch."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.errors import CheckpointError, ConfigError
from zephon_columnar.work.base import WorkSource
from zephon_columnar.work.chunk import WorkChunk

A = Dataset.from_tables("a", [pa.table({"x": list(range(s * 30, s * 30 + 30))}) for s in range(3)])
B = Dataset.from_tables("b", [pa.table({"x": list(range(1000, 1030))})])  # a pass of each ends together


def build(runner: str = "inline") -> Pipeline:
    ws = StaticMixtureWorkSource([A, B], {"a": 0.75, "b": 0.25}, chunk_size=8, seed=4, shuffle_within_shard=True)
    return Pipeline(ws).shuffle(buffer_size=16, seed=2).batch(4).options(runner=runner, canonical_replicas=2)


def order(pipe: Pipeline) -> list[list[int]]:
    return [b.table["x"].to_pylist() for b in pipe]


def test_iterating_again_repeats_the_order_and_each_epoch_has_its_own():
    pipe = build()
    first, again = order(pipe), order(pipe)
    assert first == again
    epochs = [order(build().set_epoch(e)) for e in range(4)]
    assert epochs[0] == first
    assert len({tuple(map(tuple, e)) for e in epochs}) == 4  # four different orders
    for e in epochs:  # over the same rows
        assert sorted(sum(e, [])) == sorted(sum(first, []))
    assert order(pipe.set_epoch(2)) == epochs[2] and order(pipe.set_epoch(0)) == first


@pytest.mark.parametrize("runner", ["threads", "process"])
def test_an_epochs_order_is_the_same_on_every_runner(runner):
    assert order(build(runner).set_epoch(3)) == order(build().set_epoch(3))


def test_a_checkpoint_resumes_in_its_epoch_and_is_refused_in_another():
    whole = order(build().set_epoch(1))
    pipe = build().set_epoch(1)
    it = iter(pipe)
    head = [next(it).table["x"].to_pylist() for _ in range(5)]
    ckpt = pipe.checkpoint()
    it.close()
    resumed = build().set_epoch(1)
    resumed.restore(ckpt)
    assert head + order(resumed) == whole
    with pytest.raises(CheckpointError, match=r"work_source\.epoch: 1 in the checkpoint, 2 here"):
        build().set_epoch(2).restore(ckpt)


def test_the_loader_takes_the_epoch_for_its_workers():
    expected = order(build().set_epoch(1))
    loader = build().to_torch_loader(num_workers=2, timeout=120, raw_batches=True)
    loader.dataset.set_epoch(1)
    got = [b.table["x"].to_pylist() for b in loader]
    assert got == expected


@pytest.mark.parametrize("epoch", [-1, 1.0, "1", True])
def test_an_epoch_that_is_not_a_count_is_refused(epoch):
    with pytest.raises(ConfigError, match=r"set_epoch\(.*\): pass an int >= 0"):
        build().set_epoch(epoch)


def test_set_epoch_is_refused_while_iterating():
    pipe = build()
    it = iter(pipe)
    next(it)
    with pytest.raises(RuntimeError, match=r"set_epoch\(\) while the pipeline is being iterated"):
        pipe.set_epoch(1)
    it.close()


class Fixed(WorkSource):
    """A work source of one chunk whose order no seed sets."""

    def __init__(self) -> None:
        self.done = False

    def next_chunk(self) -> WorkChunk | None:
        if self.done:
            return None
        self.done = True
        return WorkChunk({"a": np.array([[0, 0, i] for i in range(4)])})

    def state_dict(self) -> dict:
        return {"done": self.done}

    def load_state_dict(self, state) -> None:
        self.done = state["done"]

    def component_ids(self) -> dict[str, int]:
        return {"a": 0}

    @property
    def datasets_by_id(self) -> dict:
        return {0: A}


def test_a_source_without_a_seed_has_only_epoch_zero():
    pipe = Pipeline(Fixed())
    assert pipe.set_epoch(0) is pipe
    with pytest.raises(ConfigError, match=r"set_epoch\(1\): Fixed has no epochs \(its order is not set by a seed\)"):
        pipe.set_epoch(1)


def test_explain_and_repr_say_the_epoch():
    pipe = build().set_epoch(3)
    assert "seed=4, epoch 3," in pipe.explain() and "seed=4, epoch 3," in repr(pipe)


def test_a_sources_state_loaded_into_another_recipe_rebuilds_its_epoch():
    import warnings

    ds = Dataset.from_tables("a", [pa.table({"x": list(range(40))})])
    saved = StaticMixtureWorkSource([ds], {"a": 1.0}, chunk_size=8, seed=4, shuffle_within_shard=True).for_epoch(2)
    saved.next_chunk()
    state = saved.state_dict()
    expected = [saved.next_chunk().ordered()[0][:, 2].tolist() for _ in range(2)]
    other = StaticMixtureWorkSource([ds], {"a": 1.0}, chunk_size=16, seed=9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # it names each difference from the state's recipe
        other.load_state_dict(state)
    assert [other.next_chunk().ordered()[0][:, 2].tolist() for _ in range(2)] == expected
