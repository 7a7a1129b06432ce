"""Checkpoint state and restore by replay.

Per lane, a checkpoint holds the position of the last item handed to the caller as
``(epoch, rows)``: the flush epoch it belongs to, the work-source state at that epoch's
start, and how many of the epoch's rows were already delivered. Restore loads that source
state, replays the epoch (a few chunks at most) and skips the delivered rows; since every
accumulator is fresh at an epoch start, the continuation equals the uninterrupted stream.
The state is O(lanes x components): it does not grow with the samples consumed.

A checkpoint also records the data recipe (work-source identity, lanes, flush cadence,
operators); restoring into a pipeline with another recipe raises, naming each difference.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.errors import CheckpointError
from zephon_columnar.recipes import recipe_differences

FORMAT = "zephon_columnar.checkpoint"
VERSION = 1


@dataclass(frozen=True, kw_only=True)
class LaneCursor:
    """Where one lane's delivered stream ends, after ``items`` items: in flush epoch ``epoch``
    (whose work-source state at its start is ``source_state``), past the first ``inputs``
    sample pointers of the epoch and then ``rows`` output rows.

    Plans whose operators give at most one row per input row and keep no state resume by
    ``inputs`` (nothing before the cursor is read again); the others replay the epoch and skip
    ``rows`` delivered rows.
    """

    epoch: int
    rows: int
    source_state: Mapping[str, Any]
    items: int = 0
    inputs: int = 0
    #: Rows ordered stages kept across the epoch's flush point (uncapped wrap's partial row):
    #: ``{stage index: frame}``; restore primes the fresh stages with them.
    carries: Mapping[int, pa.Table] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = {"epoch": self.epoch, "inputs": self.inputs, "rows": self.rows, "items": self.items,
               "source_state": self.source_state}
        if self.carries:
            out["carries"] = {str(k): F.frame_to_text(v) for k, v in sorted(self.carries.items())}
        return out

    @classmethod
    def from_json(cls, lane: str, d: Any) -> "LaneCursor":
        if not isinstance(d, Mapping):
            raise CheckpointError(f"checkpoint lane {lane}: expected an object, got {type(d).__name__}.")
        missing = [k for k in ("epoch", "rows", "items", "source_state") if k not in d]
        if missing:
            raise CheckpointError(f"checkpoint lane {lane}: missing field(s) {missing}; was it produced by "
                                  "Pipeline.checkpoint() of zephon_columnar?")
        for k in ("epoch", "inputs", "rows", "items"):
            v = d.get(k, 0)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise CheckpointError(f"checkpoint lane {lane}: field {k!r} = {v!r}, expected an int >= 0.")
        if not isinstance(d["source_state"], Mapping):
            raise CheckpointError(f"checkpoint lane {lane}: field 'source_state' is not an object.")
        carries = {}
        raw = d.get("carries", {})
        if not isinstance(raw, Mapping):
            raise CheckpointError(f"checkpoint lane {lane}: field 'carries' is not an object.")
        for k, v in raw.items():
            try:
                carries[int(k)] = F.frame_from_text(v)
            except (TypeError, ValueError) as err:
                raise CheckpointError(f"checkpoint lane {lane}: carries[{k!r}] is not an encoded frame "
                                      f"({err}).") from err
        return cls(epoch=d["epoch"], inputs=d.get("inputs", 0), rows=d["rows"], items=d["items"],
                   source_state=d["source_state"], carries=carries)


def build_checkpoint(*, recipe: Mapping[str, Any], world: Mapping[str, Any],
                     lanes: Mapping[int, LaneCursor]) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "recipe": dict(recipe),
        "world": dict(world),
        "lanes": {str(lane): cur.to_json() for lane, cur in sorted(lanes.items())},
    }


def parse_checkpoint(ckpt: Any) -> tuple[dict[str, Any], dict[int, LaneCursor]]:
    """Validate a checkpoint's shape; return (recipe, {lane: cursor})."""
    if isinstance(ckpt, (str, bytes)):
        try:
            ckpt = json.loads(ckpt)
        except ValueError as err:
            raise CheckpointError(f"checkpoint is not valid JSON: {err}") from err
    if not isinstance(ckpt, Mapping):
        raise CheckpointError(f"checkpoint must be a dict (from Pipeline.checkpoint()), got {type(ckpt).__name__}.")
    if ckpt.get("format") != FORMAT:
        raise CheckpointError(
            f"not a zephon_columnar checkpoint (format={ckpt.get('format')!r}, keys={sorted(ckpt)[:8]}). "
            "Pass the dict returned by Pipeline.checkpoint(); Zephon 0.2.0 checkpoints cannot be restored here."
        )
    if ckpt.get("version") != VERSION:
        raise CheckpointError(f"checkpoint version {ckpt.get('version')!r} is not supported (expected {VERSION}).")
    for key in ("recipe", "world", "lanes"):
        if not isinstance(ckpt.get(key), Mapping):
            raise CheckpointError(f"checkpoint field {key!r} is missing or not an object.")
    lanes = {}
    for k, v in ckpt["lanes"].items():
        try:
            lane = int(k)
        except (TypeError, ValueError) as err:
            raise CheckpointError(f"checkpoint lane key {k!r} is not an integer.") from err
        lanes[lane] = LaneCursor.from_json(str(k), v)
    return dict(ckpt["recipe"]), lanes


def check_recipe(saved: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    diffs = recipe_differences(saved, current)
    if diffs:
        raise CheckpointError(
            "checkpoint was taken with a different data recipe; restoring it would continue another data "
            "order:\n  - " + "\n  - ".join(diffs) + "\nBuild the pipeline with the checkpoint's settings, or "
            "start without restore()."
        )


def merge_checkpoints(ckpts: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Merge the per-rank checkpoints of one step (each holds its own lanes) into one.

    Ranks of the same data-parallel group hold the same lanes; their states must agree.
    """
    ckpts = list(ckpts)
    if not ckpts:
        raise CheckpointError("merge_checkpoints: no checkpoints given.")
    recipe, _ = parse_checkpoint(ckpts[0])
    lanes: dict[int, LaneCursor] = {}
    for i, ck in enumerate(ckpts):
        r, ls = parse_checkpoint(ck)
        check_recipe(recipe, r)
        for lane, cur in ls.items():
            if lane in lanes and lanes[lane] != cur:
                raise CheckpointError(f"merge_checkpoints: checkpoint {i} disagrees with an earlier one on lane "
                                      f"{lane}; were they taken at the same step?")
            lanes[lane] = cur
    world = dict(ckpts[0]["world"])
    world.update(dp_degree=None, dp_group_id=None, merged_from=len(ckpts))
    return build_checkpoint(recipe=recipe, world=world, lanes=lanes)
