"""The checkpoint's one JSON form, with a format version, and its validation.

``Pipeline.checkpoint()`` returns plain JSON types: ``{"format", "version", "recipe", "world",
"lanes": {lane: ...}}``. A lane is ``{"mode": "replay", ...}`` (`LaneCursor`) or ``{"mode":
"reference", ...}`` (`LaneSnapshot`); rows held by reference are encoded tables
(`zephon_columnar.references`), never null (no rows: an empty table), so a cut value cannot pass
for "nothing held". Each lane carries a ``digest`` of the rest of it: a lane edited or damaged
in a way that still parses (a position moved, rows removed) is refused rather than continued
with another stream.

A lane's work-source state is written as the work source gave it, but that what it repeats of the
recipe is named instead (``"<recipe.work_source>"``), and a wide mixture's per-component maps
are written compactly (`compact`: tens of bytes a dataset in each lane until it is read).

Parsing checks every field's presence, type and range and raises `CheckpointError` naming the
field (``checkpoint lanes.0.stages[1].queue[0].rows: ...``); it does no work with the data.

Example:
    >>> lane = LaneCursor(epoch=1, rows=2, items=3, inputs=0, source_state={"p": 1}, carries={},
    ...                   exhausted=frozenset())
    >>> text = lane_to_json(lane)
    >>> lane_from_json("lanes.0", text) == lane
    True
    >>> lane_from_json("lanes.0", dict(text, rows=-1))
    Traceback (most recent call last):
    ...
    zephon_columnar.errors.CheckpointError: checkpoint lanes.0.rows = -1: expected an int >= 0.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar import references
from zephon_columnar.engine.checkpoint.compact import compacted, compacted_recipe, expanded, expanded_recipe
from zephon_columnar.engine.checkpoint.state import (
    EpochMarker,
    HeldRows,
    LaneCursor,
    LaneSnapshot,
    LaneState,
    PipelineState,
    QueueEntry,
    ResumePoint,
    StageState,
    source_state_field,
    source_state_of,
)
from zephon_columnar.errors import CheckpointError
from zephon_columnar.ops.accumulators.lane import ChunkExhaustion

FORMAT = "zephon_columnar.checkpoint"
#: 4: a wide mixture's work-source maps written compactly (`compact`); 3 (the same otherwise) is read too.
VERSION = 4
_READABLE = (3, VERSION)

#: Stands for the checkpoint's ``recipe.work_source`` in a lane's work-source state (the same
#: dict in every lane: kept once).
_SAME_RECIPE = "<recipe.work_source>"
#: Every count, index and position in a checkpoint fits a signed 64-bit int (what the engine's
#: numpy columns hold); a number past it is corruption, not a long run.
_NUMBER_LIMIT = 2**63
#: The first bytes of a zstandard frame (`checkpoint_bytes` output).
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_NO_ROWS: dict[str, Any] = {"n": 0, "cols": {}}


# ---------------------------------------------------------------------- reading fields
class _Fields:
    """Typed reads of one JSON object's fields; every failure is a `CheckpointError` naming
    the field's path."""

    def __init__(self, where: str, value: Any) -> None:
        if not isinstance(value, Mapping):
            raise CheckpointError(
                f"checkpoint {where}: expected an object, got {_kind(value)}; was it produced by "
                "Pipeline.checkpoint() of zephon_columnar?"
            )
        self.where = where
        self.value = value

    def get(self, key: str) -> Any:
        if key not in self.value:
            raise CheckpointError(
                f"checkpoint {self.where}: field {key!r} is missing; the checkpoint is damaged, "
                "or was not produced by Pipeline.checkpoint() of this version."
            )
        return self.value[key]

    def at(self, key: str) -> str:
        return f"{self.where}.{key}"

    def count(self, key: str) -> int:
        v = self.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise CheckpointError(f"checkpoint {self.at(key)} = {v!r}: expected an int >= 0.")
        return v

    def flag(self, key: str) -> bool:
        v = self.get(key)
        if not isinstance(v, bool):
            raise CheckpointError(f"checkpoint {self.at(key)} = {v!r}: expected true or false.")
        return v

    def obj(self, key: str) -> Mapping[str, Any]:
        v = self.get(key)
        if not isinstance(v, Mapping):
            raise CheckpointError(f"checkpoint {self.at(key)}: expected an object, got {_kind(v)}.")
        return v

    def items(self, key: str) -> list[Any]:
        v = self.get(key)
        if not isinstance(v, list):
            raise CheckpointError(f"checkpoint {self.at(key)}: expected a list, got {_kind(v)}.")
        return v

    def table(self, key: str) -> pa.Table | None:
        """Encoded rows by reference (None when there are none)."""
        return _table_from_json(self.at(key), self.get(key))

    def schema(self, key: str) -> pa.Schema | None:
        v = self.get(key)
        try:
            return references.schema_from_json(v)
        except (TypeError, ValueError, KeyError, AttributeError, pa.ArrowInvalid) as err:
            raise CheckpointError(f"checkpoint {self.at(key)}: not an encoded payload schema ({err}).") from err


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


#: Reference columns whose values are positions or ids: never negative.
_NON_NEGATIVE = (F.LANE, F.CHUNK, F.OFFSET, F.DATASET, F.SHARD, F.ROW, F.COMPONENT, F.TOKEN_SKIP)
_SEGMENT_COUNTS = ("chunk", "offset", "dataset", "shard", "row", "component", "start", "length")


def _table_from_json(where: str, value: Any) -> pa.Table | None:
    if value is None:
        raise CheckpointError(
            f"checkpoint {where}: rows are null; a checkpoint writes held rows as an encoded table "
            "(an empty one when there are none): the checkpoint is damaged."
        )
    if isinstance(value, Mapping) and isinstance(value.get("cols"), Mapping):
        for name, values in value["cols"].items():
            if name == F.SEGMENTS:
                values = _segment_fields(values)
            if not str(name).startswith(references.FLOAT_STATE_PREFIX) and not _all_ints(values):
                raise CheckpointError(
                    f"checkpoint {where}: column {name!r} holds a value that is not an int; the checkpoint is damaged."
                )
    try:
        table = references.rows_from_json(value)
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError, pa.ArrowInvalid) as err:
        raise CheckpointError(f"checkpoint {where}: not an encoded table of references ({err}).") from err
    if table is None or table.num_rows == 0:
        return None
    missing = [n for n in F.BOOKKEEPING if n not in table.column_names]
    if missing:
        raise CheckpointError(
            f"checkpoint {where}: the rows lack the reference column(s) {missing}; the checkpoint is damaged."
        )
    for name in table.column_names:
        column = table.column(name)
        if column.null_count:
            raise CheckpointError(f"checkpoint {where}: column {name!r} has nulls; the checkpoint is damaged.")
        if name in _NON_NEGATIVE and len(column) and np.asarray(column.to_numpy()).min() < 0:
            raise CheckpointError(
                f"checkpoint {where}: column {name!r} holds a negative value; the checkpoint is damaged."
            )
        if name == F.LINEAGE and not all(_is_lineage(row) for row in column.to_pylist()):
            raise CheckpointError(
                f"checkpoint {where}: column {name!r} holds a null or negative value inside a row; "
                "the checkpoint is damaged."
            )
        if name == F.SEGMENTS and any(
            (not _is_lineage(seg[k]) if k == "lineage" else seg[k] is None or (k in _SEGMENT_COUNTS and seg[k] < 0))
            for row in column.to_pylist()
            for seg in row
            for k in seg
        ):
            raise CheckpointError(
                f"checkpoint {where}: a segment of column {name!r} has a missing or negative "
                "field; the checkpoint is damaged."
            )
    return table


def _is_lineage(value: Any) -> bool:
    """Whether ``value`` is a lineage as a checkpoint writes it: a list of child indices, each an
    int >= 0 (a row of the table has passed `_all_ints`; a null inside it is refused here)."""
    return isinstance(value, list) and all(v is not None and v >= 0 for v in value)


def _segment_fields(rows: Any) -> list[Any]:
    """The number fields of a ``__segments`` column's JSON form (per row, per segment: the
    fields, then ``closes``, a bool, which is left out); anything of another shape is kept
    whole, for `_all_ints` to refuse."""
    out: list[Any] = []
    for row in rows if isinstance(rows, list) else [rows]:
        for seg in row if isinstance(row, list) else [row]:
            closes_last = isinstance(seg, list) and bool(seg) and isinstance(seg[-1], bool)
            out.append(seg[:-1] if closes_last else [seg])
    return out


def _all_ints(value: Any) -> bool:
    """Whether every number in ``value`` (nested lists) is an int; None counts (a null, refused
    once the table is built), text does not."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, list):
            stack.extend(v)
        elif v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            return False
    return True


def _table_to_json(table: pa.Table | None) -> Any:
    return dict(_NO_ROWS) if table is None or table.num_rows == 0 else references.rows_to_json(table)


# ---------------------------------------------------------------------- lanes
def lane_to_json(lane: LaneState) -> dict[str, Any]:
    """A lane's state as JSON types (without its digest: `build_checkpoint` adds it)."""
    if isinstance(lane, LaneCursor):
        return {
            "mode": "replay",
            "epoch": lane.epoch,
            "inputs": lane.inputs,
            "rows": lane.rows,
            "items": lane.items,
            "source_state": lane.source_state,
            "carries": {str(k): F.frame_to_text(v) for k, v in sorted(lane.carries.items())},
            "exhausted": sorted(lane.exhausted),
        }
    resume = lane.resume
    return {
        "mode": "reference",
        "items": lane.items,
        "resume": {
            "chunk": resume.chunk,
            "offset": resume.offset,
            "marker": resume.marker,
            "source_state": resume.source_state,
        },
        "stages": [
            {
                "state": stage.state,
                "rows": _table_to_json(stage.rows),
                "inbox": _table_to_json(stage.inbox),
                "queue": [_entry_to_json(e) for e in stage.queue],
            }
            for stage in lane.stages
        ],
        "pending": _held_to_json(lane.pending),
        "targets": [[c, t] for c, t in sorted(lane.targets.items())],
        "exhaustion": [[c, sorted(e.through), sorted(e.before)] for c, e in sorted(lane.exhaustion.items())],
    }


def _held_to_json(held: HeldRows | None) -> dict[str, Any]:
    if held is None:
        return {"rows": dict(_NO_ROWS), "schema": None}
    return {"rows": _table_to_json(held.refs), "schema": references.schema_to_json(held.schema)}


def _entry_to_json(entry: QueueEntry) -> dict[str, Any]:
    if isinstance(entry, EpochMarker):
        return {"epoch": entry.epoch}
    return _held_to_json(entry)


def lane_from_json(where: str, value: Any) -> LaneState:
    """Parse and check one lane (``where``: its path in the checkpoint, for messages)."""
    d = _Fields(where, value)
    mode = d.get("mode")
    if mode == "replay":
        return _cursor_from_json(d)
    if mode == "reference":
        return _snapshot_from_json(d)
    raise CheckpointError(f"checkpoint {d.at('mode')} = {mode!r}: expected 'replay' or 'reference'.")


def _cursor_from_json(d: _Fields) -> LaneCursor:
    carries = {}
    for k, text in d.obj("carries").items():
        if not str(k).isdigit():
            raise CheckpointError(f"checkpoint {d.at('carries')}: key {k!r} is not a stage index.")
        try:
            carries[int(k)] = F.frame_from_text(text)
        except (TypeError, ValueError, AttributeError) as err:
            raise CheckpointError(f"checkpoint {d.at('carries')}[{k!r}]: not an encoded frame ({err}).") from err
    # absent in checkpoints written before stages learnt of source exhaustion: nothing said
    exhausted = d.items("exhausted") if "exhausted" in d.value else []
    if not all(isinstance(name, str) for name in exhausted):
        raise CheckpointError(f"checkpoint {d.at('exhausted')} = {exhausted!r}: expected a list of component names.")
    return LaneCursor(
        epoch=d.count("epoch"),
        inputs=d.count("inputs"),
        rows=d.count("rows"),
        items=d.count("items"),
        source_state=d.obj("source_state"),
        carries=carries,
        exhausted=frozenset(exhausted),
    )


def _snapshot_from_json(d: _Fields) -> LaneSnapshot:
    r = _Fields(d.at("resume"), d.get("resume"))
    resume = ResumePoint(
        chunk=r.count("chunk"), offset=r.count("offset"), marker=r.flag("marker"), source_state=r.obj("source_state")
    )
    stages = []
    for i, raw in enumerate(d.items("stages")):
        s = _Fields(f"{d.at('stages')}[{i}]", raw)
        queue: list[QueueEntry] = []
        for j, entry in enumerate(s.items("queue")):
            e = _Fields(f"{s.at('queue')}[{j}]", entry)
            queue.append(EpochMarker(epoch=e.count("epoch")) if "epoch" in entry else _held_from_json(e))
        stages.append(
            StageState(state=dict(s.obj("state")), rows=s.table("rows"), inbox=s.table("inbox"), queue=tuple(queue))
        )
    targets = {}
    for i, pair in enumerate(d.items("targets")):
        if (
            not isinstance(pair, list)
            or len(pair) != 2
            or isinstance(pair[0], bool)
            or not isinstance(pair[0], int)
            or pair[0] < 0
            or not (pair[1] is None or isinstance(pair[1], Mapping))
        ):
            raise CheckpointError(
                f"checkpoint {d.at('targets')}[{i}] = {pair!r}: expected [chunk, {{component: weight}}}} or null]."
            )
        targets[pair[0]] = None if pair[1] is None else dict(pair[1])
    exhaustion = {}
    # absent in checkpoints written before stages learnt of source exhaustion: nothing said
    for i, entry in enumerate(d.items("exhaustion") if "exhaustion" in d.value else []):
        if (
            not isinstance(entry, list)
            or len(entry) != 3
            or isinstance(entry[0], bool)
            or not isinstance(entry[0], int)
            or entry[0] < 0
            or not all(isinstance(names, list) and all(isinstance(n, str) for n in names) for names in entry[1:])
        ):
            raise CheckpointError(
                f"checkpoint {d.at('exhaustion')}[{i}] = {entry!r}: expected [chunk, [component, "
                "...] (through), [component, ...] (before)]."
            )
        exhaustion[entry[0]] = ChunkExhaustion(through=frozenset(entry[1]), before=frozenset(entry[2]))
    pending = _held_from_json(_Fields(d.at("pending"), d.get("pending")))
    return LaneSnapshot(
        items=d.count("items"),
        resume=resume,
        stages=tuple(stages),
        pending=None if pending.refs is None else pending,
        targets=targets,
        exhaustion=exhaustion,
    )


def _held_from_json(d: _Fields) -> HeldRows:
    """Rows and their schema (``refs`` None when there are none)."""
    return HeldRows(refs=d.table("rows"), schema=d.schema("schema"))


# ---------------------------------------------------------------------- whole checkpoints
def _digest(lane_json: Mapping[str, Any]) -> str:
    body = {k: v for k, v in lane_json.items() if k != "digest"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def build_checkpoint(state: PipelineState) -> dict[str, Any]:
    """The JSON form of ``state`` (each lane with its digest)."""
    work_source = state.recipe.get("work_source")
    out = {}
    for lane, cur in sorted(state.lanes.items()):
        d = lane_to_json(cur)
        source_state = source_state_of(cur)
        if isinstance(source_state, Mapping):
            stored = compacted(source_state, work_source)  # a wide mixture's per-component maps, compactly
            if source_state.get("recipe") == work_source:
                stored["recipe"] = _SAME_RECIPE
            if isinstance(cur, LaneCursor):
                d["source_state"] = stored
            else:
                d["resume"] = dict(d["resume"], source_state=stored)
        d["digest"] = _digest(d)
        out[str(lane)] = d
    return {
        "format": FORMAT,
        "version": VERSION,
        "recipe": compacted_recipe(state.recipe),
        "world": dict(state.world),
        "lanes": out,
    }


def checkpoint_bytes(ckpt: Mapping[str, Any]) -> bytes:
    """A checkpoint as compact bytes (zstandard-compressed JSON) that `parse_checkpoint` reads."""
    import zstandard

    return zstandard.ZstdCompressor(level=3).compress(json.dumps(ckpt, separators=(",", ":")).encode())


def load_checkpoint(ckpt: Any) -> dict[str, Any]:
    """The checkpoint dict of ``ckpt`` (the dict of ``Pipeline.checkpoint()``, its JSON text, or
    the bytes of ``checkpoint(as_bytes=True)``), its format and version checked."""
    if isinstance(ckpt, (bytearray, memoryview)):
        ckpt = bytes(ckpt)
    if isinstance(ckpt, bytes) and ckpt.startswith(_ZSTD_MAGIC):
        import zstandard

        try:
            ckpt = zstandard.ZstdDecompressor().decompress(ckpt, max_output_size=1 << 30)
        except zstandard.ZstdError as err:
            raise CheckpointError(
                f"checkpoint bytes are corrupt (zstandard: {err}); pass the bytes of "
                "Pipeline.checkpoint(as_bytes=True) unchanged."
            ) from err
    elif isinstance(ckpt, bytes) and ckpt[:1] == b"\x80":
        raise CheckpointError(
            "checkpoint bytes are a pickle: restore(pickle.loads(data)) (this library never "
            "unpickles what it is given), or store checkpoint(as_bytes=True) instead."
        )
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
    if ckpt.get("version") not in _READABLE:
        raise CheckpointError(
            f"checkpoint version {ckpt.get('version')!r} is not supported (expected {VERSION}); "
            "restore it with the version of zephon_columnar that wrote it."
        )
    for key in ("recipe", "world", "lanes"):
        if not isinstance(ckpt.get(key), Mapping):
            raise CheckpointError(f"checkpoint field {key!r} is missing or not an object.")
    return dict(ckpt)


def parse_checkpoint(ckpt: Any) -> PipelineState:
    """Validate a checkpoint's shape (`load_checkpoint`'s forms); its typed state. Digests are
    checked by `verify_digests`, after the checks that name a field more precisely."""
    ckpt = load_checkpoint(ckpt)
    check_numbers(ckpt["lanes"], "lanes")
    lanes: dict[int, LaneState] = {}
    recipe = expanded_recipe(ckpt["recipe"])
    work_source = recipe.get("work_source")
    for key, value in ckpt["lanes"].items():
        if not str(key).isdigit():
            raise CheckpointError(f"checkpoint lane key {key!r} is not an integer >= 0.")
        lane = lane_from_json(f"lanes.{key}", value)
        where = f"lanes.{key}.{source_state_field(lane)}"
        full = expanded(source_state_of(lane), where, work_source)
        if full.get("recipe") == _SAME_RECIPE:
            full["recipe"] = work_source
        lane = (
            dataclasses.replace(lane, source_state=full)
            if isinstance(lane, LaneCursor)
            else dataclasses.replace(lane, resume=dataclasses.replace(lane.resume, source_state=full))
        )
        lanes[int(key)] = lane
    return PipelineState(recipe=recipe, world=dict(ckpt["world"]), lanes=lanes)


def with_digests(ckpt: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``ckpt`` with every lane's digest computed again: for a tool that edits a
    checkpoint on purpose (a migration, a test of the checks behind the digest). Restore then
    takes the edit for what the pipeline wrote, so only the engine's own checks stand between
    it and the data."""
    out = dict(ckpt)
    out["lanes"] = {k: dict(v, digest=_digest(v)) for k, v in load_checkpoint(ckpt)["lanes"].items()}
    return out


def verify_digests(ckpt: Any) -> None:
    """`CheckpointError` naming the first lane whose content does not match its digest."""
    for key, value in load_checkpoint(ckpt)["lanes"].items():
        digest = value.get("digest") if isinstance(value, Mapping) else None
        if digest != _digest(value):
            raise CheckpointError(
                f"checkpoint lanes.{key}: its content does not match its digest ({digest!r}): the "
                "checkpoint was edited or damaged after Pipeline.checkpoint() wrote it, and restoring "
                "it would continue another stream. Restore an unmodified checkpoint."
            )


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
    """  # noqa: E501 - a doctest's expected exception line is the message verbatim: it cannot wrap
    stack = [(value, where)]
    while stack:
        v, at = stack.pop()
        if isinstance(v, Mapping):
            stack.extend((x, f"{at}.{k}") for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((x, f"{at}[{i}]") for i, x in enumerate(v))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and not abs(v) < _NUMBER_LIMIT:
            raise CheckpointError(
                f"checkpoint {at} = {v!r}: not a count or position this engine writes (finite, "
                "magnitude under 2**63); the checkpoint is corrupt or was edited."
            )
