"""Merging the checkpoints of the ranks of one step into one."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from zephon_columnar.engine.checkpoint.checks import check_recipe
from zephon_columnar.engine.checkpoint.codec import build_checkpoint, parse_checkpoint, verify_digests
from zephon_columnar.engine.checkpoint.state import LaneState, PipelineState
from zephon_columnar.errors import CheckpointError


def merge_checkpoints(ckpts: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Merge the per-rank checkpoints of one step (each holds its own lanes) into one.

    Ranks of the same data-parallel group (tensor-parallel peers) hold the same lanes, delivered
    to the same item. Their states may still be written differently (read-ahead that differed
    between the peers is held by reference in one and as a source position in the other); any
    of them restores the same continuation, so the first is kept. Peers that delivered another
    number of items to a lane were not checkpointed at the same step: refused.
    """
    ckpts = list(ckpts)
    if not ckpts:
        raise CheckpointError("merge_checkpoints: no checkpoints given.")
    first = parse_checkpoint(ckpts[0])
    lanes: dict[int, LaneState] = {}
    for i, ck in enumerate(ckpts):
        state = parse_checkpoint(ck)
        verify_digests(ck)
        check_recipe(first.recipe, state.recipe)
        for lane, cur in state.lanes.items():
            if lane in lanes:
                if lanes[lane].items != cur.items:
                    raise CheckpointError(
                        f"merge_checkpoints: checkpoint {i} has {cur.items} item(s) of lane {lane} "
                        f"delivered, an earlier one {lanes[lane].items}; were they taken at the "
                        "same step?"
                    )
                continue
            lanes[lane] = cur
    world = dict(first.world, global_rank=None, dp_degree=None, dp_group_id=None, merged_from=len(ckpts))
    return build_checkpoint(PipelineState(recipe=first.recipe, world=world, lanes=lanes))
