"""The torch loader's part of a checkpoint: what a DataLoader worker's state holds
(`WorkerState`), where it stands in its loader's round robin (`LoaderPhase`), and what a stateful
loader built by ``to_torch_loader`` records for its rank (`LoaderState`); typed, frozen,
versioned values with one JSON form each, validated before use; and how a resume on another
layout finds every lane.

A DataLoader worker serves a share of its rank's lanes (`worker_lanes`), so each worker state
holds the checkpoint of its own lanes only. A resume on the layout it was saved on (the same
lanes per rank, the same number of workers) gives each worker its own state back. A resume on
another layout (other ranks, other worker counts) needs every lane at one step, found in one of
two ways:

* **Whole state** (``to_torch_loader``): when the trainer asks the loader for its state, the
  rank's worker parts are merged (`rank_part`) and then every rank's, through the
  ``torch.distributed`` process group or the ``aggregate_dir`` directory (the same gather as
  ``Pipeline.checkpoint()``); the state then carries every lane's checkpoint (`LoaderState`), and
  a resume on any layout restores from it. Nothing else is kept anywhere.
* **Worker snapshots** (a ``StatefulDataLoader`` the user built over ``to_torch_dataset()``,
  whose state this library never sees whole): with ``aggregate_dir``, every worker snapshot
  also keeps its lanes' checkpoint in that directory (`write_loader_part`, the latest
  `LOADER_PARTS_KEPT`); a resume on another layout learns from its rank's other workers which
  snapshot each was at (`CutExchange`, `loader_cut`) and merges every rank's parts at that cut
  (`read_loader_parts`).

Example:
    >>> state = WorkerState(worker=1, lanes=(), rank_lanes=(0, 1, 2, 3), pipeline=None,
    ...                     phase=LoaderPhase(name="0123456789abcdef", position=-1, active=2), dp_degree=1, run_id="r")
    >>> worker_state_from_json(worker_state_to_json(state)) == state
    True
    >>> worker_state_from_json(dict(worker_state_to_json(state), rank_lanes=[0, 1]))
    Traceback (most recent call last):
    ...
    zephon_columnar.errors.CheckpointError: DataLoader worker state: its content does not match its digest; it was edited or damaged after state_dict() wrote it. Restore an unmodified state.
"""  # noqa: E501 - a doctest's expected exception line is the message verbatim: it cannot wrap

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from zephon_columnar.engine.checkpoint.codec import load_checkpoint
from zephon_columnar.engine.checkpoint.merge import merge_checkpoints
from zephon_columnar.engine.ownership import next_lane
from zephon_columnar.errors import CheckpointError

WORKER_FORMAT = "zephon_columnar.loader_worker"
LOADER_FORMAT = "zephon_columnar.loader"
#: The version of both forms. A worker state without ``format`` is one written before states
#: had a version (the same fields, no digest): it is still read.
LOADER_VERSION = 1
#: Where a stateful loader's `LoaderState` sits in its state dict, beside torchdata's own keys.
LOADER_STATE_KEY = "zephon_columnar"
#: Most DataLoader workers per rank a resume from worker snapshots coordinates (shared memory slots).
MAX_LOADER_WORKERS = 256


# ---------------------------------------------------------------------- values
@dataclass(frozen=True, kw_only=True)
class LoaderPhase:
    """Where a DataLoader worker stands in its loader's worker round robin, which is what
    lines up the snapshots of every worker on every rank into one cut.

    The loader asks its workers in turn, each for one item, starting with worker
    ``(last yielded + 1)``; idle workers (no lanes) drop out. So the ``delivered``-th item of
    the worker at ``position`` among the ``active`` ones is item ``(delivered - 1) * active +
    position`` of its rank's stream, the same on every rank at the same step. ``name`` tells
    phases apart: one from the start of a pass, then one per resume from worker snapshots on
    another layout (a resume on the same layout continues its phase).

    Example:
        >>> LoaderPhase(name="0", position=1, active=2, delivered=3).rank_item()
        5
        >>> LoaderPhase(name="0", position=1, active=2).delivered_at(6)  # items 1, 3, 5
        3
    """

    name: str
    position: int  # -1: an idle worker
    active: int
    delivered: int = 0

    def rank_item(self) -> int:
        """The rank's item index (from 0, in this phase) of this worker's latest item; -1 before its first."""
        return (self.delivered - 1) * self.active + self.position if self.delivered else -1

    def delivered_at(self, rank_items: int) -> int:
        """How many items this worker had delivered once its rank had delivered ``rank_items``."""
        return (rank_items - 1 - self.position) // self.active + 1 if rank_items > self.position else 0


@dataclass(frozen=True, kw_only=True)
class WorkerState:
    """One DataLoader worker's state: its ``lanes`` among its rank's ``rank_lanes`` and their
    checkpoint (``pipeline``, the JSON form of ``Pipeline.checkpoint()``; None: an idle worker),
    its `LoaderPhase` (None: a state written before states had a version), and the saving job's
    ``dp_degree`` and ``run_id`` (where its rank's peers keep their snapshots)."""

    worker: int
    lanes: tuple[int, ...]
    rank_lanes: tuple[int, ...]
    pipeline: Mapping[str, Any] | None
    phase: LoaderPhase | None
    dp_degree: int
    run_id: str

    def fits(self, rank_lanes: Sequence[int]) -> bool:
        """Whether it was saved by a rank owning ``rank_lanes``, this rank's lanes: then it
        resumes from its own lanes' checkpoint."""
        return self.rank_lanes == tuple(rank_lanes)


@dataclass(frozen=True, kw_only=True)
class LoaderLayout:
    """What a loader's lanes were split by: its rank's ``rank_lanes`` (of data-parallel group
    ``dp_group_id`` among ``dp_degree``) and its number of DataLoader ``workers``."""

    workers: int
    rank_lanes: tuple[int, ...]
    dp_degree: int
    dp_group_id: int


@dataclass(frozen=True, kw_only=True)
class LoaderState:
    """What a stateful loader built by ``to_torch_loader`` records beside torchdata's own state:
    the layout it was saved on and the checkpoint of the lanes its state covers at the step it
    was taken (its rank's lanes; every lane once gathered across ranks)."""

    layout: LoaderLayout
    checkpoint: Mapping[str, Any]

    def lanes(self) -> frozenset[int]:
        """The lanes the checkpoint holds."""
        return frozenset(int(lane) for lane in self.checkpoint["lanes"])


# ---------------------------------------------------------------------- one JSON form each
def _digest(body: Mapping[str, Any], pipeline: Mapping[str, Any] | None) -> str:
    """The digest of a state's fields; of its checkpoint, the lanes' own digests (the
    checkpoint checks its lanes against them on restore), so that a snapshot per batch does not
    hash every lane again."""
    lanes = None if pipeline is None else {k: v.get("digest") for k, v in pipeline["lanes"].items()}
    text = json.dumps([dict(body), lanes], sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def worker_state_to_json(state: WorkerState) -> dict[str, Any]:
    """The JSON form of ``state`` (plain types, with its format, version and digest)."""
    body = {
        "format": WORKER_FORMAT,
        "version": LOADER_VERSION,
        "worker": state.worker,
        "lanes": list(state.lanes),
        "rank_lanes": list(state.rank_lanes),
        "loader_phase": None if state.phase is None else asdict(state.phase),
        "dp_degree": state.dp_degree,
        "run_id": state.run_id,
    }
    pipeline = None if state.pipeline is None else dict(state.pipeline)
    return dict(body, pipeline=pipeline, digest=_digest(body, state.pipeline))


def is_worker_state(value: Any) -> bool:
    """Whether ``value`` is a DataLoader worker's state (rather than a whole loader's)."""
    if not isinstance(value, Mapping):
        return False
    return value.get("format") == WORKER_FORMAT or ("lanes" in value and "pipeline" in value)


def worker_state_from_json(value: Any) -> WorkerState:
    """The `WorkerState` of ``worker_state_to_json``'s output, every field checked; a damaged
    or foreign state is a `CheckpointError` naming what is wrong."""
    where = "DataLoader worker state"
    fields = _Reader(where, value)
    legacy = not {"format", "version", "digest"} & set(fields.value)  # written before states had a version
    if not legacy:
        fields.expect_format(WORKER_FORMAT)
    pipeline = fields.checkpoint("pipeline")
    saved_phase = fields.value.get("loader_phase") if legacy else fields.get("loader_phase")
    if saved_phase is None and not legacy:
        raise CheckpointError(f"{where}: loader_phase is null; the state is damaged.")
    phase = None
    if saved_phase is not None:
        p = _Reader(f"{where} loader_phase", saved_phase)
        phase = LoaderPhase(
            name=p.text("name"), position=p.integer("position", least=-1), active=p.integer("active", least=1),
            delivered=p.integer("delivered"),
        )  # fmt: skip
        if not (phase.position < phase.active and len(phase.name) == 16):
            raise CheckpointError(f"{where} loader_phase = {saved_phase!r:.120}: not a phase a loader writes.")
    lanes = fields.lanes("lanes")
    state = WorkerState(
        worker=fields.integer("worker"),
        lanes=lanes,
        rank_lanes=fields.lanes("rank_lanes") if "rank_lanes" in fields.value or not legacy else lanes,
        pipeline=pipeline,
        phase=phase,
        dp_degree=fields.integer("dp_degree", least=1) if "dp_degree" in fields.value or not legacy else 1,
        run_id=fields.text("run_id") if "run_id" in fields.value or not legacy else "",
    )
    if not legacy and fields.get("digest") != worker_state_to_json(state)["digest"]:
        raise CheckpointError(
            f"{where}: its content does not match its digest; it was edited or damaged after state_dict() "
            "wrote it. Restore an unmodified state."
        )
    _check_worker_state(where, state)
    return state


def _check_worker_state(where: str, state: WorkerState) -> None:
    """What every worker state a loader writes holds: its lanes among its rank's, the lanes of
    its checkpoint, and (with a phase) an even share of its rank's lanes, or none when idle."""
    held = None if state.pipeline is None else sorted(int(lane) for lane in state.pipeline["lanes"])
    problem = ""
    if not set(state.lanes) <= set(state.rank_lanes):
        problem = f"its lanes {list(state.lanes)} are not among its rank's {list(state.rank_lanes)}"
    elif held is not None and held != sorted(state.lanes):
        problem = f"its checkpoint holds lanes {held}, not its lanes {list(state.lanes)}"
    elif state.phase is not None:
        serving, active = state.phase.position >= 0, state.phase.active
        if serving != bool(state.lanes) or serving != (state.pipeline is not None):
            problem = f"worker at position {state.phase.position} with lanes {list(state.lanes)}"
        elif len(state.rank_lanes) % active or (serving and len(state.lanes) != len(state.rank_lanes) // active):
            problem = f"{len(state.lanes)} of its rank's {len(state.rank_lanes)} lanes among {active} workers"
    if problem:
        raise CheckpointError(f"{where}: {problem}; the state is damaged.")


def loader_state_to_json(state: LoaderState) -> dict[str, Any]:
    """The JSON form of ``state`` (plain types, with its format, version and digest)."""
    layout = dict(asdict(state.layout), rank_lanes=list(state.layout.rank_lanes))
    body = {"format": LOADER_FORMAT, "version": LOADER_VERSION, "layout": layout}
    return dict(body, checkpoint=dict(state.checkpoint), digest=_digest(body, state.checkpoint))


def loader_state_from_json(value: Any) -> LoaderState:
    """The `LoaderState` of ``loader_state_to_json``'s output, every field checked."""
    where = f"loader state[{LOADER_STATE_KEY!r}]"
    fields = _Reader(where, value)
    fields.expect_format(LOADER_FORMAT)
    layout = _Reader(f"{where} layout", fields.get("layout"))
    checkpoint = fields.checkpoint("checkpoint")
    if checkpoint is None:
        raise CheckpointError(f"{where} checkpoint: missing; the state is damaged.")
    state = LoaderState(
        layout=LoaderLayout(
            workers=layout.integer("workers", least=1),
            rank_lanes=layout.lanes("rank_lanes"),
            dp_degree=layout.integer("dp_degree", least=1),
            dp_group_id=layout.integer("dp_group_id"),
        ),
        checkpoint=checkpoint,
    )
    if fields.get("digest") != loader_state_to_json(state)["digest"]:
        raise CheckpointError(
            f"{where}: its content does not match its digest; it was edited or damaged after state_dict() "
            "wrote it. Restore an unmodified state."
        )
    rank_lanes, held = state.layout.rank_lanes, state.lanes()
    if list(rank_lanes) != sorted(set(rank_lanes)) or not set(rank_lanes) <= held or not rank_lanes:
        raise CheckpointError(
            f"{where}: layout.rank_lanes {list(rank_lanes)} are not its checkpoint's lanes {sorted(held)} "
            "(sorted, each once); the state is damaged."
        )
    if state.layout.dp_group_id >= state.layout.dp_degree:
        raise CheckpointError(
            f"{where}: layout.dp_group_id {state.layout.dp_group_id} >= dp_degree; the state is damaged."
        )
    return state


def with_state_digest(value: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a worker or loader state's JSON form with its digest computed again: for a
    tool that edits a state on purpose (a migration, a test of the checks behind the digest)."""
    embedded = value.get("pipeline", value.get("checkpoint"))
    body = {k: v for k, v in value.items() if k not in ("pipeline", "checkpoint", "digest")}
    return dict(value, digest=_digest(body, embedded if isinstance(embedded, Mapping) else None))


class _Reader:
    """Typed reads of one JSON object's fields; every failure a `CheckpointError` naming it."""

    def __init__(self, where: str, value: Any) -> None:
        if not isinstance(value, Mapping):
            raise CheckpointError(
                f"{where}: expected a dict from state_dict(), got {type(value).__name__}; restore the state "
                "the loader saved, unchanged."
            )
        self.where, self.value = where, value

    def get(self, key: str) -> Any:
        if key not in self.value:
            raise CheckpointError(f"{self.where}: field {key!r} is missing; the state is damaged.")
        return self.value[key]

    def expect_format(self, name: str) -> None:
        if self.value.get("format") != name:
            raise CheckpointError(f"{self.where}: format {self.value.get('format')!r} is not {name!r}.")
        if self.value.get("version") != LOADER_VERSION:
            raise CheckpointError(
                f"{self.where}: version {self.value.get('version')!r} is not supported (expected "
                f"{LOADER_VERSION}); resume it with the version of zephon_columnar that wrote it."
            )

    def integer(self, key: str, *, least: int = 0) -> int:
        v = self.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or not least <= v < 2**63:
            raise CheckpointError(f"{self.where}: {key} = {v!r}, expected an int >= {least}.")
        return v

    def text(self, key: str) -> str:
        v = self.get(key)
        if not isinstance(v, str):
            raise CheckpointError(f"{self.where}: {key} = {v!r}, expected a string.")
        return v

    def lanes(self, key: str) -> tuple[int, ...]:
        v = self.get(key)
        if (
            not isinstance(v, list)
            or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in v)
            or v != sorted(set(v))
        ):
            raise CheckpointError(f"{self.where}: {key} = {v!r:.80}, expected a sorted list of lane numbers.")
        return tuple(v)

    def checkpoint(self, key: str) -> Mapping[str, Any] | None:
        v = self.get(key)
        if v is None:
            return None
        try:
            return load_checkpoint(v)
        except CheckpointError as err:
            raise CheckpointError(f"{self.where}: {key}: {err}") from err


# ---------------------------------------------------------------------- lanes per worker
def active_workers(lanes: int, workers: int) -> int:
    """How many of ``workers`` loader workers serve ``lanes`` lanes: the largest divisor of the
    lane count that is at most ``workers`` (as in Zephon; the others stay idle).

    Example:
        >>> active_workers(6, 4), active_workers(4, 3), active_workers(2, 8)
        (3, 2, 2)
    """
    return max(d for d in range(1, min(workers, lanes) + 1) if lanes % d == 0)


def worker_lanes(
    rank_lanes: Sequence[int], worker: int, workers: int, *, first_worker: int, emitted: Mapping[int, int]
) -> list[int]:
    """The lanes loader worker ``worker`` of ``workers`` serves: counted from the lane the rank
    serves next (by ``emitted``, items per lane), the worker the loader asks first
    (``first_worker``) takes it, the next worker the next lane, and so on.

    Example:
        >>> [worker_lanes([0, 1, 2, 3, 4, 5], w, 4, first_worker=0, emitted={}) for w in range(4)]
        [[0, 3], [1, 4], [2, 5], []]
        >>> worker_lanes([0, 1, 2, 3], 0, 2, first_worker=0, emitted={0: 2, 1: 1, 2: 1, 3: 1})
        [1, 3]
    """
    lanes = list(rank_lanes)
    active = active_workers(len(lanes), workers)
    if worker >= active:
        return []
    first = lanes.index(next_lane(lanes, {lane: emitted[lane] for lane in lanes if lane in emitted})) if emitted else 0
    rotated = lanes[first:] + lanes[:first]
    return sorted(rotated[(worker - first_worker) % active :: active])


# ---------------------------------------------------------------------- a rank's cut
def loader_cut(phases: Sequence[LoaderPhase], workers: int) -> tuple[int, dict[int, int], int]:
    """From the phases of a rank's ``workers`` workers' latest states: how many items the rank
    had delivered, how many each serving worker had delivered then (the cut), and the worker
    that yielded last (``workers - 1`` before any: the loader asks the one after it next). A
    `CheckpointError` when the states are not one step of the loader's round robin (a loader
    iterated with ``in_order=False``, a worker that ran out, or snapshots taken every n steps,
    between two of them).

    Example:
        >>> p = LoaderPhase(name="0", position=0, active=2)
        >>> loader_cut([replace(p, delivered=3), replace(p, position=1, delivered=2)], 2)
        (5, {0: 3, 1: 2}, 0)
    """
    rank_items = max(p.rank_item() for p in phases) + 1
    cut = {w: p.delivered_at(rank_items) for w, p in enumerate(phases) if p.position >= 0}
    if any(cut[w] != phases[w].delivered for w in cut):
        raise CheckpointError(
            "the DataLoader workers' states are not one step of the loader's round robin (items delivered per "
            f"worker {[p.delivered for p in phases]}): was it iterated with in_order=False, snapshot_every_n_steps "
            "> 1, or did a worker run out of data? Such a state resumes on the layout it was saved on only."
        )
    last = max(range(len(phases)), key=lambda w: phases[w].rank_item()) if rank_items else workers - 1
    return rank_items, cut, last


def rank_part(states: Sequence[WorkerState]) -> dict[str, Any]:
    """The checkpoint of a rank's lanes after the loader's last item, from the state torchdata
    kept of each worker: the one that came with that worker's last item the loader yielded (a
    loader built by ``to_torch_loader`` snapshots every item, in order). Each lane is then at
    its last delivered item, also once a worker has run out and the others go on."""
    return merge_checkpoints([s.pipeline for s in states if s.pipeline is not None])


class CutExchange:
    """How the workers of one rank resuming from worker snapshots on another layout tell each
    other which snapshot each was given: one 64-bit word per worker in shared memory
    (``slots``, `MAX_LOADER_WORKERS` of them, inherited by the workers), written at once (a
    store of one word is seen whole by another process, as three separate stores need not be).
    The word counts resumes (a generation), so a slot left from an earlier resume is not taken
    for this one.

    Example:
        >>> CutExchange.parts(CutExchange.word(3, 12345, -1))
        (3, 12345, -1)
    """

    def __init__(self, slots: Any) -> None:
        self.slots = slots

    @staticmethod
    def word(generation: int, delivered: int, position: int) -> int:
        """(generation < 2**15, delivered < 2**39, -1 <= position < 511) as one int64."""
        return generation << 48 | (position + 1) << 39 | delivered

    @staticmethod
    def parts(word: int) -> tuple[int, int, int]:
        return word >> 48, word & ((1 << 39) - 1), ((word >> 39) & 511) - 1

    def exchange(self, saved: LoaderPhase, worker: int, workers: int, timeout_s: float) -> list[LoaderPhase]:
        """The phase of the snapshot each of the rank's ``workers`` workers was given: this one
        publishes ``saved``'s, then waits (``timeout_s`` at most) for the others'."""
        if workers > MAX_LOADER_WORKERS:
            raise CheckpointError(
                f"resuming {workers} DataLoader workers from worker snapshots on another data-parallel "
                f"layout works with at most {MAX_LOADER_WORKERS} workers per rank; build the loader with "
                "pipe.to_torch_loader(...), whose state carries every lane."
            )
        generation = (self.parts(self.slots[worker])[0] + 1) % (1 << 15)
        self.slots[worker] = self.word(generation, saved.delivered, saved.position)
        deadline = time.monotonic() + timeout_s
        while True:
            words = [self.parts(self.slots[w]) for w in range(workers)]
            if all(g == generation for g, _, _ in words):
                return [replace(saved, delivered=d, position=p) for _, d, p in words]
            if time.monotonic() > deadline:
                waiting = [w for w, (g, _, _) in enumerate(words) if g != generation]
                raise CheckpointError(
                    f"load_state_dict(): DataLoader worker {worker} waited {timeout_s:.0f}s for "
                    f"workers {waiting} of this rank to load their states (aggregate_timeout_s)."
                )
            time.sleep(0.01)


# ---------------------------------------------------------------------- worker snapshots on disk
#: How many of its latest snapshots a DataLoader worker keeps in the aggregate directory. A
#: checkpoint's cut is at most the loader's read-ahead (``prefetch_factor``) behind a worker's
#: newest snapshot; older ones are deleted as new ones are written.
LOADER_PARTS_KEPT = 64


def loader_part_path(directory: str, run_id: str, phase: str, group: int, worker: int, delivered: int) -> Path:
    """Where DataLoader worker ``worker`` of data-parallel group ``group`` keeps the checkpoint
    of its lanes after its ``delivered``-th item of loader phase ``phase``."""
    return Path(directory) / run_id / "loader" / phase / f"g{group:05d}-w{worker:03d}-k{delivered:09d}.json"


def write_loader_part(
    ckpt: Mapping[str, Any], *, directory: str, run_id: str, phase: str, group: int, worker: int, delivered: int
) -> None:
    """Keep one DataLoader worker snapshot (its lanes' checkpoint) where a resume on another
    data-parallel layout finds it (`read_loader_parts`), and drop the one `LOADER_PARTS_KEPT`
    snapshots older. Nothing waits for other ranks: the parts are merged when they are read.
    Tensor-parallel peers write the same bytes under the same name."""
    path = loader_part_path(directory, run_id, phase, group, worker, delivered)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(dict(ckpt)))
    os.replace(tmp, path)
    if delivered >= LOADER_PARTS_KEPT:
        loader_part_path(directory, run_id, phase, group, worker, delivered - LOADER_PARTS_KEPT).unlink(missing_ok=True)


def read_loader_parts(
    cut: Mapping[int, int], *, directory: str, run_id: str, phase: str, groups: int
) -> dict[str, Any]:
    """The checkpoint of every lane at a loader's cut: for each data-parallel group and each
    active worker ``w``, its snapshot after ``cut[w]`` items, merged. A missing snapshot is a
    `CheckpointError` naming its file."""
    parts = []
    for group in range(groups):
        for worker, delivered in sorted(cut.items()):
            path = loader_part_path(directory, run_id, phase, group, worker, delivered)
            try:
                parts.append(json.loads(path.read_text()))
            except FileNotFoundError:
                raise CheckpointError(
                    f"resuming DataLoader workers on another data-parallel layout needs {path} (worker {worker} of "
                    f"data-parallel group {group} after {delivered} items), which is missing: the checkpoint was taken "
                    f"with another aggregate_dir or run_id, those files were removed, or the ranks were not at the "
                    "same step."
                ) from None
            except (OSError, ValueError) as err:
                raise CheckpointError(f"resuming DataLoader workers: cannot read {path} ({err}).") from err
    return merge_checkpoints(parts)
