"""Merging the checkpoints of the ranks of one step into one."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from zephon_columnar.engine.checkpoint.checks import check_recipe
from zephon_columnar.engine.checkpoint.codec import load_checkpoint
from zephon_columnar.engine.checkpoint.compact import expanded_recipe
from zephon_columnar.errors import CheckpointError


def merge_checkpoints(ckpts: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Merge the per-rank checkpoints of one step (each holds its own lanes) into one.

    Ranks of the same data-parallel group (tensor-parallel peers) hold the same lanes, delivered
    to the same item. Their states may still be written differently (read-ahead that differed
    between the peers is held by reference in one and as a source position in the other); any
    of them restores the same continuation, so the first is kept. Peers that delivered another
    number of items to a lane were not checkpointed at the same step: refused; so are parts
    taken with another data recipe, naming each difference.

    The lanes are taken over as they are, each with its digest: what restore checks (every
    field, then every lane against its digest) it checks on the merged checkpoint, so a damaged
    part is refused there, and a merge costs a few dict operations per lane (it runs at every
    checkpoint of a multi-rank job, on every rank).

    Example:
        >>> from zephon_columnar.engine.checkpoint.codec import FORMAT, VERSION
        >>> a = {"format": FORMAT, "version": VERSION, "recipe": {"seed": 1}, "world": {},
        ...      "lanes": {"0": {"items": 2}}}
        >>> sorted(merge_checkpoints([a, dict(a, lanes={"1": {"items": 2}})])["lanes"])
        ['0', '1']
    """
    ckpts = [load_checkpoint(ck) for ck in ckpts]
    if not ckpts:
        raise CheckpointError("merge_checkpoints: no checkpoints given.")
    first = ckpts[0]
    lanes: dict[str, Any] = {}
    for i, ck in enumerate(ckpts):
        if ck["recipe"] != first["recipe"]:  # raises, naming each difference
            check_recipe(expanded_recipe(first["recipe"]), expanded_recipe(ck["recipe"]))
        for key, lane in ck["lanes"].items():
            items = lane.get("items") if isinstance(lane, Mapping) else None
            if isinstance(items, bool) or not isinstance(items, int):
                raise CheckpointError(f"merge_checkpoints: checkpoint {i} lanes.{key}.items = {items!r}: not a count.")
            if key in lanes:
                if lanes[key]["items"] != items:
                    raise CheckpointError(
                        f"merge_checkpoints: checkpoint {i} has {items} item(s) of lane {key} "
                        f"delivered, an earlier one {lanes[key]['items']}; were they taken at the "
                        "same step?"
                    )
                continue
            lanes[key] = lane
    world = dict(first["world"], global_rank=None, dp_degree=None, dp_group_id=None, merged_from=len(ckpts))
    ordered = {key: lanes[key] for key in sorted(lanes, key=lambda k: int(k) if str(k).isdigit() else -1)}
    return {
        "format": first["format"],
        "version": first["version"],
        "recipe": first["recipe"],
        "world": world,
        "lanes": ordered,
    }
