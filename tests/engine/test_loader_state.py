"""Loader-worker and loader states (engine/checkpoint/loader.py) get the lanes' treatment: one
versioned JSON form each, every field checked, a damaged or foreign state refused with a
`CheckpointError` before any work, as `test_checkpoint_damage` does for the lanes."""

from __future__ import annotations

import copy
import json
from typing import Any

import pyarrow as pa
import pytest

from tests.engine.test_checkpoint_damage import MALFORMED, _damaged, _damages, _leaves
from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.engine.checkpoint.loader import (
    LOADER_STATE_KEY,
    LOADER_VERSION,
    loader_state_from_json,
    loader_state_to_json,
    with_state_digest,
    worker_state_from_json,
    worker_state_to_json,
)
from zephon_columnar.errors import CheckpointError, ConfigError

pytest.importorskip("torchdata")


def _states() -> tuple[list[dict], dict]:
    """The worker states and the loader state of a real loader with 2 workers, after 3 batches."""
    ds = Dataset.from_tables("a", [pa.table({"id": list(range(s * 20, s * 20 + 20))}) for s in range(3)])
    ws = StaticMixtureWorkSource([ds], {"a": 1.0}, chunk_size=4, seed=3)
    pipe = Pipeline(ws).batch(2).options(canonical_replicas=4)
    loader = pipe.to_torch_loader(num_workers=2, loader="stateful", multiprocessing_context="fork", raw_batches=True)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    workers = [snap["dataset_state"] for snap in state["_snapshot"]["_worker_snapshots"].values()]
    return workers, state[LOADER_STATE_KEY]


WORKERS, LOADER = _states()


def test_real_states_read_back_as_they_were_written():
    for value in WORKERS:
        state = worker_state_from_json(value)
        assert state.phase is not None and state.pipeline is not None
        assert worker_state_to_json(state) == value
    loader = loader_state_from_json(LOADER)
    assert loader.lanes() == frozenset(range(4)) and loader.layout.workers == 2
    assert loader_state_to_json(loader) == LOADER


def _cases(value: dict, skip: str) -> list[tuple[tuple, str, Any]]:
    """Every field outside the embedded checkpoint (its lanes are `test_checkpoint_damage`'s):
    removed, and each damage of its kind."""
    cases = []
    for at, leaf in _leaves(value):
        if not at or at[0] in (skip, "digest"):
            continue
        if isinstance(at[-1], str):
            cases.append((at, "removed", None))
        cases += [(at, damage, new) for damage, new in _damages(leaf)]
    return cases


#: Forged edits that leave a state a loader could have written, and what they do.
VALID_WHEN_FORGED = {
    (("run_id",), "cut"): "another run id (free text): where a resume from worker snapshots looks for them",
    (("layout", "rank_lanes"), "cut"): "another saving layout: the state resumes from its whole checkpoint, as "
                                       "on any layout but its own",
}


@pytest.mark.parametrize("kind", ["worker", "loader"])
@pytest.mark.parametrize("forged", [False, True])
def test_every_damaged_field_is_refused(kind, forged):
    # Unforged, the digest refuses every change; forged (the digest computed again, as a tool
    # that edits states would), the field checks refuse every malformed value.
    value, skip, read = (WORKERS[0], "pipeline", worker_state_from_json) if kind == "worker" else (
        LOADER, "checkpoint", loader_state_from_json)
    cases = _cases(value, skip)
    assert len(cases) > 25
    wrong = []
    for at, damage, new in cases:
        damaged = _damaged(value, at, damage, new)
        if forged:
            damaged = with_state_digest(damaged)
        try:
            read(damaged)
        except CheckpointError:
            continue
        if not forged or (damage in MALFORMED and (at, damage) not in VALID_WHEN_FORGED):
            wrong.append((at, damage))
    assert not wrong, wrong


@pytest.mark.parametrize("state, match", [
    (dict(WORKERS[0], format="zephon.worker"), "format 'zephon.worker' is not"),
    (dict(WORKERS[0], version=LOADER_VERSION + 1), "version 2 is not supported"),
    (dict(WORKERS[0], pipeline={"format": "other"}), "pipeline: not a zephon_columnar checkpoint"),
    ({k: v for k, v in WORKERS[0].items() if k != "format"}, "format None is not"),
])
def test_a_foreign_worker_state_is_refused_naming_what(state, match):
    with pytest.raises(CheckpointError, match=match):
        worker_state_from_json(state)


def test_a_state_of_another_loader_is_refused_by_the_dataset():
    ds = Pipeline(StaticMixtureWorkSource([Dataset.from_tables("a", [pa.table({"id": [1, 2]})])], {"a": 1.0}))
    with pytest.raises(ConfigError, match="expected a dict from state_dict\\(\\) with key 'pipeline'"):
        ds.to_torch_dataset().load_state_dict({"engine": {"progress": {}}})  # Zephon's layout


def test_a_damaged_loader_state_is_refused_by_the_loader_before_any_work():
    ds = Dataset.from_tables("a", [pa.table({"id": list(range(s * 20, s * 20 + 20))}) for s in range(3)])
    pipe = Pipeline(StaticMixtureWorkSource([ds], {"a": 1.0}, chunk_size=4, seed=3)).batch(2).options(
        canonical_replicas=4)
    loader = pipe.to_torch_loader(num_workers=3, loader="stateful", multiprocessing_context="fork")
    damaged = copy.deepcopy(LOADER)
    damaged["layout"]["rank_lanes"] = [0, 1]
    with pytest.raises(CheckpointError, match="does not match its digest"):
        loader.load_state_dict({LOADER_STATE_KEY: damaged, "_snapshot": {"_main_snapshot": {"_num_workers": 2}}})
