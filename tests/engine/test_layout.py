"""The data-parallel layout under a real torch.distributed world (gloo ranks): every way of
naming it reads disjoint data on each group and checkpoints whole, or is refused.

Found by a new-user probe: ``options(dp_degree=2)`` without ``dp_group_id`` gave both ranks of
a 2-rank group the same batches in silence, and ``options(dp_degree=W, dp_group_id=rank)``
returned only the rank's own lanes from ``checkpoint()``, which no other number of ranks could
restore.
"""

from __future__ import annotations

import json
import socket
import warnings
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.engine.layout import ProcessWorld, settle_layout, unsettled_share
from zephon_columnar.errors import CheckpointError, ConfigError, ConfigurationWarning
from zephon_columnar.options import RuntimeOptions
from zephon_columnar.testing import collect, signature

LANES = 12


def build(**options: Any) -> Pipeline:
    return build_with(LANES, **options)


def build_with(lanes: int, **options: Any) -> Pipeline:
    ds = Dataset.from_tables("a", [pa.table({"id": list(range(s * 60, s * 60 + 60))}) for s in range(4)])
    ws = StaticMixtureWorkSource([ds], {"a": 1.0}, chunk_size=5, seed=3, shuffle_within_shard=True)
    return Pipeline(ws).batch(2).options(runner="inline", canonical_replicas=lanes, **options)


def by_lane(sigs: list[str]) -> dict[int, list[str]]:
    """Each lane's items (signatures as JSON text), in delivery order."""
    out: dict[int, list[str]] = {}
    for sig in sigs:
        out.setdefault(json.loads(sig)[1], []).append(sig)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------- the rules, no processes
WORLD = ProcessWorld(size=4, rank=3, source="torch.distributed")


@pytest.mark.parametrize(
    ("given", "settled"),
    [
        ({"dp_degree": 4}, (4, 3)),  # half-given: the group is the rank
        ({"dp_degree": 2, "dp_group_id": 1}, (2, 1)),  # given: kept
        ({"dp_degree": 1}, (1, 0)),  # every rank reads everything, on purpose
        ({"world_size": 4, "global_rank": 3}, (4, 3)),
        ({"world_size": 4, "global_rank": 3, "dp_degree": 2}, (2, 1)),  # two tensor-parallel peers a group
        ({"world_size": 2, "global_rank": 1}, (2, 1)),  # the job's own data-parallel world (Megatron)
    ],
)
def test_a_layout_the_world_decides_is_completed(given, settled):
    o = settle_layout(RuntimeOptions(**given), WORLD)
    assert (o.resolved_dp_degree(), o.resolved_dp_group_id()) == settled
    assert settle_layout(o, WORLD) == o  # settling settled options changes nothing


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ({}, ["no data-parallel options", "4 ranks", "world_size=4", "dp_degree=1"]),
        ({"dp_degree": 2}, ["dp_degree=2", "without dp_group_id", "rank 3", "get_data_parallel_rank"]),
        ({"world_size": 4}, ["global_rank=0", "not this rank", "get_rank()", "(3 here)"]),
        ({"world_size": 4, "global_rank": 1}, ["global_rank=1", "not this rank"]),
    ],
)
def test_a_layout_that_would_repeat_data_is_refused(given, words):
    with pytest.raises(ConfigError) as caught:
        settle_layout(RuntimeOptions(**given), WORLD)
    assert all(w in str(caught.value) for w in words), str(caught.value)


def test_without_a_world_nothing_is_guessed_and_a_half_given_layout_is_warned():
    o = RuntimeOptions(dp_degree=2)
    assert settle_layout(o, None) is o
    said = unsettled_share(o)
    assert said is not None and "group 0's share of 2" in said and "dp_group_id" in said
    assert unsettled_share(RuntimeOptions(dp_degree=2, dp_group_id=1)) is None
    assert unsettled_share(RuntimeOptions(world_size=2, global_rank=1)) is None
    with pytest.warns(ConfigurationWarning, match="group 0's share"):
        next(iter(build(dp_degree=2)))


def test_the_launchers_environment_is_a_world(monkeypatch):
    from zephon_columnar.engine.layout import current_world

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert current_world() == ProcessWorld(size=2, rank=1, source="environment")
    with pytest.raises(ConfigError, match="RANK/WORLD_SIZE's 2 ranks"):
        next(iter(build()))
    assert build(dp_degree=2).session.rank_lanes() == list(range(6, 12))  # the rank's group's lanes


def test_a_partial_checkpoint_is_warned_and_its_refusal_says_why():
    pipe = build(world_size=2, global_rank=1)
    it = iter(pipe)
    next(it)
    with pytest.warns(ConfigurationWarning, match=r"lanes \[6, 7, 8, 9, 10, 11\] of 12 only"):
        part = pipe.checkpoint()
    it.close()
    with pytest.raises(CheckpointError, match="one rank's share"):
        build().restore(part)


# ---------------------------------------------------------------------------- real ranks
def _rank(rank: int, world: int, port: int, out: str, steps: int, lanes: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)

    def build(**options: Any) -> Pipeline:
        return build_with(lanes, **options)

    try:
        result: dict[str, Any] = {}
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            # Half-given: the group is taken from torch.distributed.
            pipe = build(dp_degree=world)
            it = iter(pipe)
            result["half"] = [signature(next(it)) for _ in range(steps)]
            result["half_ckpt"] = pipe.checkpoint()  # collective: merged over the group
            it.close()
            # The pair a tensor-parallel job passes, with loader workers' own process: merged too.
            pipe = build(dp_degree=world, dp_group_id=rank)
            it = iter(pipe)
            result["pair"] = [signature(next(it)) for _ in range(steps + rank % 3)]  # ranks at different depths
            result["pair_ckpt"] = pipe.checkpoint()
            it.close()
            # Every rank reading everything, said on purpose (tensor-parallel peers): no warning, no
            # collective needed, and every rank's checkpoint is the same one.
            pipe = build(dp_degree=1)
            it = iter(pipe)
            result["same"] = signature(next(it))
            result["same_ckpt"] = pipe.checkpoint()
            it.close()
        result["warnings"] = [str(w.message) for w in seen if issubclass(w.category, ConfigurationWarning)]
        for name, options in (("none", {}), ("world_only", {"world_size": world})):
            try:
                next(iter(build(**options)))
                result[name] = "read"
            except ConfigError as err:
                result[name] = str(err)
        # Two ranks naming the same group: the merged checkpoint would not cover every lane.
        pipe = build(dp_degree=world, dp_group_id=rank // 2 * 2)
        it = iter(pipe)
        next(it)
        try:
            pipe.checkpoint()
            result["overlap"] = "merged"
        except CheckpointError as err:
            result["overlap"] = str(err)
        it.close()
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def _check_world(tmp_path: Path, world: int, lanes: int, resume_on: tuple[int, ...]) -> None:
    steps = 3
    mp.spawn(_rank, args=(world, free_port(), str(tmp_path), steps, lanes), nprocs=world, join=True)
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    single = by_lane([json.dumps(sig) for sig in collect(build_with(lanes))])
    for r, result in enumerate(got):
        assert result["warnings"] == [], result["warnings"]
        assert "no data-parallel options" in result["none"]
        # an unset global_rank is 0: right on rank 0 only, refused on every other
        assert result["world_only"] == "read" if r == 0 else "not this rank" in result["world_only"]
        assert "cover lanes" in result["overlap"] and "same data-parallel group" in result["overlap"]
        assert result["same"] == got[0]["same"] and result["same_ckpt"] == got[0]["same_ckpt"]
        assert result["half_ckpt"] == got[0]["half_ckpt"] and result["pair_ckpt"] == got[0]["pair_ckpt"]
    for kind in ("half", "pair"):
        heads = [json.dumps(sig) for result in got for sig in result[kind]]
        assert len(set(heads)) == len(heads)  # no two ranks read the same batch
        ckpt = got[0][f"{kind}_ckpt"]
        assert sorted(int(lane) for lane in ckpt["lanes"]) == list(range(lanes))
        for groups in resume_on:  # restored on another number of ranks: every lane continues exactly
            rest: list[str] = []
            for g in range(groups):
                resumed = build_with(lanes, dp_degree=groups, dp_group_id=g)
                resumed.restore(ckpt)
                rest += [json.dumps(sig) for sig in collect(resumed)]
            delivered, after = by_lane(heads), by_lane(rest)
            assert {lane: delivered.get(lane, []) + after.get(lane, []) for lane in single} == single


def test_four_gloo_ranks_each_layout_reads_disjoint_data_and_checkpoints_whole(tmp_path):
    _check_world(tmp_path, 4, LANES, resume_on=(3, 6))


@pytest.mark.slow
def test_sixteen_gloo_ranks_checkpoint_whole_and_restore_on_twelve_and_five(tmp_path):
    _check_world(tmp_path, 16, 48, resume_on=(12, 5))
