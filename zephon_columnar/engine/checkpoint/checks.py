"""What restore checks against the pipeline before any work: the recipe, and each lane's state
against the data (positions the work source could have reached, row references into it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from zephon_columnar.engine.checkpoint.state import EpochMarker, LaneCursor, LaneSnapshot, LaneState
from zephon_columnar.errors import CheckpointError
from zephon_columnar.recipes import recipe_differences


def check_recipe(saved: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    diffs = recipe_differences(saved, current)
    if diffs:
        raise CheckpointError(
            "checkpoint was taken with a different data recipe; restoring it would continue another data "
            "order:\n  - " + "\n  - ".join(diffs) + "\nBuild the pipeline with the checkpoint's settings, or "
            "start without restore()."
        )


def check_lane_state(
    lane: int, cur: LaneState, datasets_by_id: Mapping[int, Any], flush_every: int, ordered_stages: int
) -> None:
    """`CheckpointError` unless a lane's state is one this pipeline could have written: it starts
    no chunk the work source has not handed out (``global_chunk_index``: chunks of every lane so far),
    a by-reference state has one entry per ordered stage of the plan, and every row reference
    points into this pipeline's data (its lane, a chunk the lane has started, a known dataset,
    one of its shards, a row of that shard)."""
    if isinstance(cur, LaneCursor):
        started = cur.source_state.get("global_chunk_index")
        if isinstance(started, int) and cur.epoch * flush_every > started:
            raise CheckpointError(
                f"checkpoint lane {lane}: flush epoch {cur.epoch} starts at chunk "
                f"{cur.epoch * flush_every}, past the chunks the work source has handed out "
                f"(global_chunk_index = {started}); the checkpoint is corrupt."
            )
        return
    if len(cur.stages) != ordered_stages:
        raise CheckpointError(
            f"checkpoint lanes.{lane}.stages has {len(cur.stages)} entries, but this pipeline has "
            f"{ordered_stages} ordered stage(s); the checkpoint is damaged."
        )
    _check_references(lane, cur, datasets_by_id)


def _tables_of(snapshot: LaneSnapshot) -> list[tuple[str, pa.Table | None]]:
    tables: list[tuple[str, pa.Table | None]] = []
    if snapshot.pending is not None:
        tables.append(("pending.rows", snapshot.pending.refs))
    for i, stage in enumerate(snapshot.stages):
        tables += [(f"stages[{i}].rows", stage.rows), (f"stages[{i}].inbox", stage.inbox)]
        tables += [
            (f"stages[{i}].queue[{j}].rows", e.refs)
            for j, e in enumerate(stage.queue)
            if not isinstance(e, EpochMarker)
        ]
    return tables


def _check_references(lane: int, snapshot: LaneSnapshot, datasets_by_id: Mapping[int, Any]) -> None:
    shard_rows = {d: _shard_rows(ds) for d, ds in datasets_by_id.items()}
    last_chunk = snapshot.resume.chunk
    started = snapshot.resume.source_state.get("global_chunk_index")  # chunks of every lane so far
    if isinstance(started, int) and last_chunk > started:
        raise CheckpointError(
            f"checkpoint lane {lane}: resume.chunk = {last_chunk} is past the chunks the work "
            f"source has handed out (global_chunk_index = {started}); the checkpoint is corrupt."
        )
    for where, refs in _tables_of(snapshot):
        if refs is None or refs.num_rows == 0:
            continue
        cols = {
            n: refs.column(n).to_numpy()
            for n in ("__lane", "__chunk", "__dataset", "__shard", "__row")
            if n in refs.column_names
        }
        bad = None
        if "__lane" in cols and (cols["__lane"] != lane).any():
            bad = f"a row of lane {int(cols['__lane'][cols['__lane'] != lane][0])}"
        elif "__chunk" in cols and (cols["__chunk"] > last_chunk).any():
            bad = f"chunk {int(cols['__chunk'].max())}, after the lane's resume chunk {last_chunk}"
        elif "__dataset" in cols:
            for d in np.unique(cols["__dataset"]).tolist():
                if d not in shard_rows:
                    bad = f"dataset id {d}, not one of {sorted(shard_rows)}"
                    break
                at = cols["__dataset"] == d
                ids, counts = shard_rows[d]
                pos = np.searchsorted(ids, cols["__shard"][at])
                known = (pos < len(ids)) & (ids[np.minimum(pos, len(ids) - 1)] == cols["__shard"][at])
                if not known.all():
                    bad = (
                        f"shard {int(cols['__shard'][at][~known][0])} of {_dataset_label(datasets_by_id[d], d)}, "
                        "which has no such shard"
                    )
                    break
                over = cols["__row"][at] >= counts[pos]
                if over.any():
                    k = int(np.flatnonzero(over)[0])
                    shard = _shard_label(datasets_by_id[d], int(cols["__shard"][at][k]))
                    bad = (
                        f"row {int(cols['__row'][at][k])} of {shard} of {_dataset_label(datasets_by_id[d], d)}, "
                        f"which has {int(counts[pos][k])} rows"
                    )
                    break
        if bad is not None:
            raise CheckpointError(
                f"checkpoint lane {lane}: {where} refers to {bad}; the checkpoint is corrupt or belongs to other data."
            )


def _dataset_label(ds: Any, dataset_id: int) -> str:
    """``dataset 'web' (id 0)``; ``dataset id 0`` for one without a name."""
    name = getattr(ds, "name", None)
    return f"dataset id {dataset_id}" if name is None else f"dataset {name!r} (id {dataset_id})"


def _shard_label(ds: Any, shard_id: int) -> str:
    """``shard <path> (<id>)`` where the dataset knows the shard's path, else ``shard <id>``."""
    label = getattr(ds, "shard_label", None)
    return str(label(shard_id)) if callable(label) else f"shard {shard_id}"


def _shard_rows(ds: Any) -> tuple[np.ndarray, np.ndarray]:
    """(shard ids sorted, their row counts) of a dataset (ids are positions without ``ids()``)."""
    counts = np.asarray(ds.counts(), dtype=np.int64)
    ids = np.asarray(ds.ids(), dtype=np.int64) if hasattr(ds, "ids") else np.arange(len(counts))
    order = np.argsort(ids, kind="stable")
    return ids[order], counts[order]
