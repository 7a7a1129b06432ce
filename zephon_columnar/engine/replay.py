"""Checkpoint state: per lane, by reference (`LaneSnapshot`) or by replay (`LaneCursor`).

*By reference* (every built-in operator): a snapshot of the lane's chain between two
deliveries (`engine.lane`): where the source resumes (a chunk, an offset in it, and the
work-source state before that chunk), each ordered stage's state (small scalars and the rows
it holds as references), and the rows in transit as references. Restore recomputes only the
rows that are needed, when they are needed; nothing delivered is read again.

*By replay* (plans with user state that cannot be described): the position of the last item
handed to the caller as ``(epoch, rows)``: the flush epoch it belongs to, the work-source
state at that epoch's start, and how many of the epoch's rows were already delivered. Restore
loads that source state, replays the epoch (a few chunks at most) and skips the delivered
rows; since every accumulator is fresh at an epoch start (but for what it carries across, kept
in the checkpoint), the continuation equals the uninterrupted stream.

Both are O(lanes x (components + rows held)): they do not grow with the samples consumed.

A checkpoint also records the data recipe (work-source identity, lanes, flush cadence,
operators); restoring into a pipeline with another recipe raises, naming each difference.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np
import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar import references as codec
from zephon_columnar.errors import CheckpointError
from zephon_columnar.recipes import recipe_differences

FORMAT = "zephon_columnar.checkpoint"
VERSION = 2


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
        out = {"mode": "replay", "epoch": self.epoch, "inputs": self.inputs, "rows": self.rows,
               "items": self.items, "source_state": self.source_state}
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


def _rows_from(lane: str, where: str, value: Any) -> pa.Table | None:
    try:
        return codec.rows_from_json(value)
    except (TypeError, ValueError, pa.ArrowInvalid) as err:
        raise CheckpointError(f"checkpoint lane {lane}: {where} is not an encoded table of references ({err}).") \
            from err


def _schema_from(lane: str, where: str, value: Any) -> pa.Schema | None:
    try:
        return codec.schema_from_json(value)
    except (TypeError, ValueError, KeyError, pa.ArrowInvalid) as err:
        raise CheckpointError(f"checkpoint lane {lane}: {where} is not an encoded schema ({err}).") from err


@dataclass(frozen=True, kw_only=True)
class LaneSnapshot:
    """A lane's state by reference (see the module docstring).

    ``resume``: ``{"chunk", "offset", "marker", "source_state"}``: continue with that chunk's
    pointers from ``offset`` (after its epoch marker, unless ``marker``), the work source
    being in ``source_state`` before the chunk. ``stages``: per ordered stage, ``(state,
    rows)``. ``queues``: per ordered stage, what it emitted that the next one has not consumed:
    ``("epoch", e, None)`` markers and ``("rows", refs, payload schema)``. ``inboxes``: per
    ordered stage, the references of input rows it has taken from upstream and not pushed yet.
    ``pending``: the collector's rows not yet in a batch, ``(refs, payload schema)`` or None.
    """

    items: int
    resume: Mapping[str, Any]
    stages: tuple[tuple[dict[str, Any], pa.Table | None], ...]
    queues: tuple[list[tuple[str, Any, Any]], ...]
    inboxes: tuple[pa.Table | None, ...]
    pending: tuple[pa.Table, pa.Schema] | None
    #: Target mixtures of the chunks rows in the lane still come from, for stages that read them
    #: (ensure_mixture): ``{chunk_id: {component: weight}}``.
    targets: Mapping[int, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        def item(it: tuple[str, Any, Any]) -> dict[str, Any]:
            if it[0] == "epoch":
                return {"epoch": it[1]}
            return {"rows": codec.rows_to_json(it[1]), "schema": codec.schema_to_json(it[2])}

        stages = []
        for (state, rows), inbox in zip(self.stages, self.inboxes):
            entry = {"state": state, "rows": codec.rows_to_json(rows)}
            if inbox is not None:
                entry["inbox"] = codec.rows_to_json(inbox)
            stages.append(entry)
        return {
            "mode": "reference", "items": self.items, "resume": dict(self.resume), "stages": stages,
            "queues": [[item(it) for it in q] for q in self.queues],
            "pending": None if self.pending is None else {"rows": codec.rows_to_json(self.pending[0]),
                                                          "schema": codec.schema_to_json(self.pending[1])},
            **({"targets": [[c, t] for c, t in sorted(self.targets.items())]} if self.targets else {}),
        }

    @classmethod
    def from_json(cls, lane: str, d: Mapping[str, Any]) -> "LaneSnapshot":
        try:
            items, resume = d["items"], d["resume"]
            if not isinstance(items, int) or isinstance(items, bool) or items < 0:
                raise CheckpointError(f"checkpoint lane {lane}: field 'items' = {items!r}, expected an int >= 0.")
            for k in ("chunk", "offset"):
                v = resume[k]
                if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                    raise CheckpointError(f"checkpoint lane {lane}: resume.{k} = {v!r}, expected an int >= 0.")
            if not isinstance(resume["marker"], bool) or not isinstance(resume["source_state"], Mapping):
                raise CheckpointError(f"checkpoint lane {lane}: resume.marker must be a bool and "
                                      "resume.source_state an object.")
            stages = tuple((dict(st["state"]), _rows_from(lane, f"stages[{i}].rows", st["rows"]))
                           for i, st in enumerate(d["stages"]))
            inboxes = tuple(_rows_from(lane, f"stages[{i}].inbox", st.get("inbox"))
                            for i, st in enumerate(d["stages"]))
            queues = []
            for i, q in enumerate(d["queues"]):
                items_i = []
                for it in q:
                    if "epoch" in it:
                        items_i.append(("epoch", int(it["epoch"]), None))
                    else:
                        items_i.append(("rows", _rows_from(lane, f"queues[{i}].rows", it["rows"]),
                                        _schema_from(lane, f"queues[{i}].schema", it["schema"])))
                queues.append(items_i)
            pending = d["pending"]
            if pending is not None:
                pending = (_rows_from(lane, "pending.rows", pending["rows"]),
                           _schema_from(lane, "pending.schema", pending["schema"]))
            targets = {int(c): dict(t) for c, t in d.get("targets", [])}
        except CheckpointError:
            raise
        except (KeyError, TypeError, AttributeError, ValueError) as err:
            raise CheckpointError(f"checkpoint lane {lane}: malformed by-reference state ({type(err).__name__}: "
                                  f"{err}); was it produced by Pipeline.checkpoint() of zephon_columnar?") from err
        return cls(items=items, resume=dict(resume), stages=stages, queues=tuple(queues), inboxes=inboxes,
                   pending=pending, targets=targets)


def lane_from_json(lane: str, d: Any) -> "LaneCursor | LaneSnapshot":
    if isinstance(d, Mapping) and d.get("mode") == "reference":
        return LaneSnapshot.from_json(lane, d)
    return LaneCursor.from_json(lane, d)


#: Stands for the checkpoint's ``recipe.work_source`` in a lane's work-source state (the same
#: dict in every lane: kept once).
_SAME_RECIPE = "<recipe.work_source>"


def _source_state_of(lane: Mapping[str, Any]) -> Any:
    if lane.get("mode") == "reference":
        resume = lane.get("resume")
        return resume.get("source_state") if isinstance(resume, Mapping) else None
    return lane.get("source_state")


def build_checkpoint(*, recipe: Mapping[str, Any], world: Mapping[str, Any],
                     lanes: Mapping[int, "LaneCursor | LaneSnapshot"]) -> dict[str, Any]:
    out = {}
    for lane, cur in sorted(lanes.items()):
        d = cur.to_json()
        state = _source_state_of(d)
        if isinstance(state, Mapping) and state.get("recipe") == recipe.get("work_source"):
            state = dict(state, recipe=_SAME_RECIPE)
            if d.get("mode") == "reference":
                d["resume"] = dict(d["resume"], source_state=state)
            else:
                d["source_state"] = state
        out[str(lane)] = d
    return {"format": FORMAT, "version": VERSION, "recipe": dict(recipe), "world": dict(world), "lanes": out}


#: The first bytes of a zstandard frame (`checkpoint_bytes` output).
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def checkpoint_bytes(ckpt: Mapping[str, Any]) -> bytes:
    """A checkpoint as compact bytes (zstandard-compressed JSON) that `parse_checkpoint` reads."""
    import zstandard

    return zstandard.ZstdCompressor(level=3).compress(json.dumps(ckpt, separators=(",", ":")).encode())


def parse_checkpoint(ckpt: Any) -> tuple[dict[str, Any], dict[int, "LaneCursor | LaneSnapshot"]]:
    """Validate a checkpoint's shape; return (recipe, {lane: cursor}).

    ``ckpt``: the dict of ``Pipeline.checkpoint()``, its JSON text, or the bytes of
    ``checkpoint(as_bytes=True)``."""
    if isinstance(ckpt, (bytearray, memoryview)):
        ckpt = bytes(ckpt)
    if isinstance(ckpt, bytes) and ckpt.startswith(_ZSTD_MAGIC):
        import zstandard

        try:
            ckpt = zstandard.ZstdDecompressor().decompress(ckpt, max_output_size=1 << 30)
        except zstandard.ZstdError as err:
            raise CheckpointError(f"checkpoint bytes are corrupt (zstandard: {err}); pass the bytes of "
                                  "Pipeline.checkpoint(as_bytes=True) unchanged.") from err
    elif isinstance(ckpt, bytes) and ckpt[:1] == b"\x80":
        raise CheckpointError("checkpoint bytes are a pickle: restore(pickle.loads(data)) (this library never "
                              "unpickles what it is given), or store checkpoint(as_bytes=True) instead.")
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
    check_numbers(ckpt["lanes"], "lanes")
    lanes = {}
    for k, v in ckpt["lanes"].items():
        try:
            lane = int(k)
        except (TypeError, ValueError) as err:
            raise CheckpointError(f"checkpoint lane key {k!r} is not an integer.") from err
        if isinstance(v, Mapping):
            state = _source_state_of(v)
            if isinstance(state, Mapping) and state.get("recipe") == _SAME_RECIPE:
                state = dict(state, recipe=ckpt["recipe"].get("work_source"))
                v = dict(v)
                if v.get("mode") == "reference":
                    v["resume"] = dict(v["resume"], source_state=state)
                else:
                    v["source_state"] = state
        lanes[lane] = lane_from_json(str(k), v)
    return dict(ckpt["recipe"]), lanes


#: Every count, index and position in a checkpoint fits a signed 64-bit int (what the engine's
#: numpy columns hold); a number past it is corruption, not a long run.
_NUMBER_LIMIT = 2 ** 63


def check_numbers(value: Any, where: str) -> None:
    """`CheckpointError` naming the first number in ``value`` (nested dicts and lists) that is
    not finite or whose magnitude is 2**63 or more: restore checks this before any work, so a
    hostile ``1e30`` is refused at once instead of overflowing (or allocating) later.

    Example:
        >>> check_numbers({"a": [1, 2.5, {"b": 3}]}, "lanes")
        >>> check_numbers({"a": [1, {"b": 1e30}]}, "lanes")
        Traceback (most recent call last):
        ...
        zephon_columnar.errors.CheckpointError: checkpoint lanes.a[1].b = 1e+30: not a count or position this engine writes (finite, magnitude under 2**63); the checkpoint is corrupt or was edited.
    """
    stack = [(value, where)]
    while stack:
        v, at = stack.pop()
        if isinstance(v, Mapping):
            stack.extend((x, f"{at}.{k}") for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((x, f"{at}[{i}]") for i, x in enumerate(v))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and not abs(v) < _NUMBER_LIMIT:
            raise CheckpointError(f"checkpoint {at} = {v!r}: not a count or position this engine writes (finite, "
                                  "magnitude under 2**63); the checkpoint is corrupt or was edited.")


def check_lane_state(lane: int, cur: "LaneCursor | LaneSnapshot", datasets_by_id: Mapping[int, Any],
                     flush_every: int) -> None:
    """`CheckpointError` unless a lane's state is one this pipeline could have written: it starts
    no chunk the work source has not handed out (``global_index``: chunks of every lane so far),
    and every row reference of a by-reference state points into this pipeline's data (its lane,
    a chunk the lane has started, a known dataset, one of its shards, a row of that shard).
    Checked at restore, before any read."""
    if isinstance(cur, LaneCursor):
        started = cur.source_state.get("global_index")
        if isinstance(started, int) and cur.epoch * flush_every > started:
            raise CheckpointError(f"checkpoint lane {lane}: flush epoch {cur.epoch} starts at chunk "
                                  f"{cur.epoch * flush_every}, past the chunks the work source has handed out "
                                  f"(global_index = {started}); the checkpoint is corrupt.")
        return
    _check_references(lane, cur, datasets_by_id)


def _check_references(lane: int, snapshot: "LaneSnapshot", datasets_by_id: Mapping[int, Any]) -> None:
    tables = [("pending.rows", snapshot.pending[0])] if snapshot.pending is not None else []
    for i, (_, rows) in enumerate(snapshot.stages):
        tables.append((f"stages[{i}].rows", rows))
    for i, inbox in enumerate(snapshot.inboxes):
        tables.append((f"stages[{i}].inbox", inbox))
    for i, queue in enumerate(snapshot.queues):
        tables += [(f"queues[{i}].rows", it[1]) for it in queue if it[0] == "rows"]
    shard_rows = {d: _shard_rows(ds) for d, ds in datasets_by_id.items()}
    last_chunk = snapshot.resume["chunk"]
    started = snapshot.resume["source_state"].get("global_index")  # chunks of every lane so far
    if isinstance(started, int) and last_chunk > started:
        raise CheckpointError(f"checkpoint lane {lane}: resume.chunk = {last_chunk} is past the chunks the work "
                              f"source has handed out (global_index = {started}); the checkpoint is corrupt.")
    for where, refs in tables:
        if refs is None or refs.num_rows == 0:
            continue
        cols = {n: refs.column(n).to_numpy() for n in ("__lane", "__chunk", "__dataset", "__shard", "__row")
                if n in refs.column_names}
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
                    bad = f"shard {int(cols['__shard'][at][~known][0])} of dataset id {d}, which has no such shard"
                    break
                over = cols["__row"][at] >= counts[pos]
                if over.any():
                    k = int(np.flatnonzero(over)[0])
                    bad = (f"row {int(cols['__row'][at][k])} of shard {int(cols['__shard'][at][k])} of dataset id {d}, "
                           f"which has {int(counts[pos][k])} rows")
                    break
        if bad is not None:
            raise CheckpointError(f"checkpoint lane {lane}: {where} refers to {bad}; the checkpoint is corrupt or "
                                  "belongs to other data.")


def _shard_rows(ds: Any) -> tuple[np.ndarray, np.ndarray]:
    """(shard ids sorted, their row counts) of a dataset (ids are positions without ``ids()``)."""
    counts = np.asarray(ds.counts(), dtype=np.int64)
    ids = np.asarray(ds.ids(), dtype=np.int64) if hasattr(ds, "ids") else np.arange(len(counts))
    order = np.argsort(ids, kind="stable")
    return ids[order], counts[order]


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
    lanes: dict[int, Any] = {}
    for i, ck in enumerate(ckpts):
        r, ls = parse_checkpoint(ck)
        check_recipe(recipe, r)
        for lane, cur in ls.items():
            if lane in lanes and json.dumps(lanes[lane].to_json(), sort_keys=True) != json.dumps(
                    cur.to_json(), sort_keys=True):
                raise CheckpointError(f"merge_checkpoints: checkpoint {i} disagrees with an earlier one on lane "
                                      f"{lane}; were they taken at the same step?")
            lanes[lane] = cur
    world = dict(ckpts[0]["world"])
    world.update(dp_degree=None, dp_group_id=None, merged_from=len(ckpts))
    return build_checkpoint(recipe=recipe, world=world, lanes=lanes)
