"""``Pipeline.ensure_mixture``: hold the output mixture on target per lane (`EnsureMixtureOp`),
by smooth weighted round robin over the mixture components.

Per lane, one row at a time (so frame sizes never change the result):

- *weight* of a row: its tokens (``weight_by="auto"``: the length of the first of
  ``input_ids``, ``tokens``, ``token_ids``, ``ids``; or a named list field), 1
  (``"samples"``), or ``weight_by(record)``. A packed row is charged per component from its
  ``__segments`` (real tokens, or with ``"samples"`` the documents it closes);
- *target*: ``mixture={name: weight}``, else the target mixture of the row's chunk (the
  composition the source aimed for), re-read when a row of a newer chunk arrives, without the
  components the source goes on without (``WorkSource.continues_after_exhaustion``, e.g.
  ``exhausted_policy="redistribute"``) once their last row came in an earlier chunk;
- *deficit* of component k: ``T[k] * max(1, E) - E[k]`` where ``E[k]`` is the weight emitted so
  far (``E`` their sum over the target); the *ideal* component has the largest (ties: the
  smaller component id);
- a row is filed under its component (rows of components outside the target are *obsolete*);
  then rows go out while the ideal component has one waiting (or, for a packed row, one that
  contains it); otherwise they wait. When ``max_buffer_size`` rows wait, the buffer is drained
  down to ``drain_target_ratio * max_buffer_size`` with the best rows available. One emission
  in ``1 / obsolete_drain_rate`` may be an obsolete row;
- at a flush point and at the end, everything buffered goes out in that order (forced), or,
  with ``max_buffer_size=None`` (an exact mixture), what waits is dropped and counted
  (``ensure_mixture_dropped`` in the lane's stats; a warning), as in Zephon, once the
  components that ran out by then and that the source goes on without have left the target
  (their rows no longer hold the others back). The deficits restart at every flush point.

``warn_tolerance``: after 1000 emissions of a lane, a ``RuntimeWarning`` (once per flush epoch
and lane) when a component's share drifts further than this from its target.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from zephon_columnar import frame as F
from zephon_columnar.errors import (
    ConfigError,
    MissingFieldError,
    MixtureDropWarning,
    PipelineError,
    operator_failure,
    warn,
)
from zephon_columnar.losses import Notice
from zephon_columnar.ops.accumulators.lane import LaneContext
from zephon_columnar.ops.base import OpTraits, OrderedOp
from zephon_columnar.ops.store import RowStore
from zephon_columnar.records import records_of
from zephon_columnar.references import schema_from_json, schema_to_json, state_column, with_state
from zephon_columnar.types import TOKEN_FIELD_CANDIDATES

WARN_WARMUP = 1000
#: Lane counter: rows ``ensure_mixture(max_buffer_size=None)`` dropped at flush points.
MIXTURE_DROPPED = "ensure_mixture_dropped"


def _dropped_text(counters: Mapping[str, int], scope: str) -> str:
    return (
        f"ensure_mixture(max_buffer_size=None) dropped {counters.get(MIXTURE_DROPPED, 0)} row(s) {scope} at flush "
        f"points to keep the mixture exact (counted in metrics_snapshot() as {MIXTURE_DROPPED}); raise "
        "flush_every_k_chunks to drop fewer, or pass a max_buffer_size."
    )


class EnsureMixtureOp(OrderedOp):
    """``ensure_mixture(*, max_buffer_size=1000, drain_target_ratio=0.8, obsolete_drain_rate=0.1,
    weight_by="auto", warn_tolerance=None, mixture=None)``; see the module docstring."""

    name = "ensure_mixture"

    def __init__(
        self,
        *,
        max_buffer_size: int | None = 1000,
        drain_target_ratio: float = 0.8,
        obsolete_drain_rate: float = 0.1,
        weight_by: str | Callable[[Any], float] = "auto",
        warn_tolerance: float | None = None,
        mixture: Mapping[str, float] | None = None,
        parallelism: int | None = None,
    ) -> None:
        super().__init__()
        if max_buffer_size is not None and (
            isinstance(max_buffer_size, bool) or not isinstance(max_buffer_size, int) or max_buffer_size < 1
        ):
            raise ConfigError(
                f"ensure_mixture(max_buffer_size={max_buffer_size!r}): pass a positive int, or None "
                "for an exact mixture that drops what it cannot place."
            )
        if not isinstance(drain_target_ratio, (int, float)) or not 0 < drain_target_ratio < 1:
            raise ConfigError(f"ensure_mixture(drain_target_ratio={drain_target_ratio!r}): pass a number in (0, 1).")
        if not isinstance(obsolete_drain_rate, (int, float)) or not 0 <= obsolete_drain_rate <= 1:
            raise ConfigError(f"ensure_mixture(obsolete_drain_rate={obsolete_drain_rate!r}): pass a number in [0, 1].")
        if warn_tolerance is not None and (not isinstance(warn_tolerance, (int, float)) or not 0 < warn_tolerance < 1):
            raise ConfigError(f"ensure_mixture(warn_tolerance={warn_tolerance!r}): pass a number in (0, 1) or None.")
        if not (callable(weight_by) or (isinstance(weight_by, str) and weight_by)):
            raise ConfigError(
                f"ensure_mixture(weight_by={weight_by!r}): pass 'auto', 'samples', a field name or a "
                "callable record -> float."
            )
        if mixture is not None and (
            not isinstance(mixture, Mapping)
            or not mixture
            or any(not isinstance(v, (int, float)) or v < 0 for v in mixture.values())
        ):
            raise ConfigError(f"ensure_mixture(mixture={mixture!r}): pass {{component name: weight >= 0}}.")
        self.max_buffer_size = max_buffer_size
        self.drain_target_ratio = float(drain_target_ratio)
        self.obsolete_drain_rate = float(obsolete_drain_rate)
        self.weight_by = weight_by
        self.warn_tolerance = warn_tolerance
        self.mixture = dict(mixture) if mixture is not None else None
        self.parallelism = parallelism

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=False, indexable=False)

    def lane_accumulator(self, ctx: LaneContext | None = None) -> MixtureBuffer:
        return MixtureBuffer(self, ctx or LaneContext())

    def fingerprint(self) -> dict[str, Any]:
        wb = self.weight_by if isinstance(self.weight_by, str) else getattr(self.weight_by, "__qualname__", "fn")
        return {
            "op": self.name,
            "max_buffer_size": self.max_buffer_size,
            "drain_target_ratio": self.drain_target_ratio,
            "obsolete_drain_rate": self.obsolete_drain_rate,
            "weight_by": wb,
            "mixture": self.mixture,
        }


class MixtureBuffer:
    """One lane's state of `EnsureMixtureOp` (see the module docstring)."""

    #: It reads the chunks' target mixtures (`LaneContext.chunk_target`): checkpoints keep those
    #: of the chunks rows in the lane still come from.
    uses_chunk_targets = True

    def __init__(self, op: EnsureMixtureOp, ctx: LaneContext) -> None:
        self.op = op
        self.ctx = ctx
        self.ids = {name: cid for cid, name in ctx.component_names.items()}
        self.interval = int(1 / op.obsolete_drain_rate) if op.obsolete_drain_rate > 0 else 0
        self.store = RowStore()
        # Exact mixture only (a diagnostic, not checkpointed): rows received since the last one
        # went out, and their components. More than a pass of the data without an emission means
        # a target component never arrives: the lane would read forever.
        self._waiting_rows = 0
        self._waiting_components: set[int] = set()
        self._reset()

    def _reset(self) -> None:
        self.store.clear()
        self.emitted: dict[int, float] = {}  # E[k]
        self.target: dict[int, float] = {}  # T[k], normalized
        self.target_chunk = -1
        self.queues: dict[int, deque[tuple[int, dict[int, float]]]] = {}
        self.packs: deque[tuple[int, dict[int, float]]] = deque()
        self.obsolete: deque[tuple[int, dict[int, float]]] = deque()
        self.buffered = 0
        self.since_obsolete = 0
        self.total_emitted = 0
        self.warned = False

    # ------------------------------------------------------------------ weights and target
    def _weights(self, frame: pa.Table) -> list[dict[int, float]]:
        """Per row, ``{component id: weight}``."""
        wb = self.op.weight_by
        comps = frame.column(F.COMPONENT).to_numpy()
        if "__segments" in frame.column_names and not callable(wb):
            out = []
            for segs in frame.column("__segments").to_pylist():
                w: dict[int, float] = {}
                for s in segs:
                    add = (1.0 if s["closes"] else 0.0) if wb == "samples" else float(s["length"])
                    w[s["component"]] = w.get(s["component"], 0.0) + add
                out.append(w)
            return out
        if callable(wb):
            values = []
            for rec in records_of(frame):
                try:
                    values.append(float(wb(rec)))
                except Exception as err:
                    raise operator_failure(
                        err,
                        f"ensure_mixture: weight_by failed on sample {rec.meta.sample_id}: {type(err).__name__}: {err}",
                    ) from err
            lengths = np.array(values)
        elif wb == "samples":
            lengths = np.ones(frame.num_rows)
        else:
            field: str | None = wb
            if wb == "auto":
                field = next((c for c in TOKEN_FIELD_CANDIDATES if c in frame.column_names), None)
                if field is None:
                    raise MissingFieldError(
                        f"ensure_mixture(weight_by='auto'): no token field (looked for {list(TOKEN_FIELD_CANDIDATES)}; "
                        f"fields: {F.payload_names(frame)}). Tokenize first, or pass weight_by='samples' or a field."
                    )
            elif wb not in frame.column_names:
                raise MissingFieldError(
                    f"ensure_mixture(weight_by={wb!r}): no such field (fields: {F.payload_names(frame)})."
                )
            lengths = pc.fill_null(pc.list_value_length(frame.column(field)), 0).to_numpy().astype(float)
        return [{int(c): float(x)} for c, x in zip(comps.tolist(), lengths.tolist())]

    def _resolve_target(self, chunk_id: int) -> dict[int, float]:
        names = self.op.mixture if self.op.mixture is not None else self.ctx.chunk_target(chunk_id) or {}
        if self.op.mixture is not None:
            unknown = sorted(set(names) - set(self.ids)) if self.ids else []
            if unknown:
                raise ConfigError(
                    f"ensure_mixture(mixture=...): components {unknown} are not in the mixture "
                    f"(its components: {sorted(self.ids)})."
                )
        # A component the source goes on without, whose last row has gone ahead of this chunk,
        # leaves the target: the others no longer wait for it.
        gone = self.ctx.continuing & self.ctx.chunk_exhaustion(chunk_id).before
        weights = {self.ids.get(n, -1): float(w) for n, w in names.items() if w > 0 and n not in gone}
        weights.pop(-1, None)
        total = sum(weights.values())
        return {k: w / total for k, w in sorted(weights.items())} if total else {}

    def _set_target(self, target: dict[int, float]) -> None:
        if target == self.target:
            return
        self.target = target
        # Rows waiting for a component that left the target are obsolete now.
        for c in [c for c in self.queues if c not in target]:
            self.obsolete.extend(self.queues.pop(c))

    # ------------------------------------------------------------------ SWRR
    def _deficits(self) -> dict[int, float]:
        total = sum(self.emitted.get(k, 0.0) for k in self.target)
        scale = max(1.0, total)
        return {k: t * scale - self.emitted.get(k, 0.0) for k, t in self.target.items()}

    def _ideal(self, deficits: dict[int, float]) -> int | None:
        best = None
        for k, d in deficits.items():  # keys ascending: ties to the smaller id
            if best is None or d > deficits[best]:
                best = k
        return best

    def _file(self, handle: int, weights: dict[int, float]) -> None:
        comps = [c for c, w in weights.items()]
        self.buffered += 1
        if len(comps) == 1 and (not self.target or comps[0] in self.target):
            self.queues.setdefault(comps[0], deque()).append((handle, weights))
        elif len(comps) > 1 and all(c in self.target or weights[c] <= 0 for c in comps):
            self.packs.append((handle, weights))
        else:
            self.obsolete.append((handle, weights))

    def _best_pack(self, deficits: dict[int, float], must: int | None) -> int | None:
        best, score = None, None
        for i, (_, w) in enumerate(self.packs):
            if must is not None and w.get(must, 0) <= 0:
                continue
            s = sum(v * deficits.get(c, 0.0) for c, v in w.items())
            if score is None or s > score:
                best, score = i, s
        return best

    def _take_pack(self, i: int) -> tuple[int, dict[int, float]]:
        item = self.packs[i]
        del self.packs[i]
        return item

    def _emit_one(self, force: bool) -> tuple[int, dict[int, float]] | None:
        if self.obsolete and self.interval and self.since_obsolete >= self.interval:
            return self._done(self.obsolete.popleft(), obsolete=True)
        deficits = self._deficits()
        ideal = self._ideal(deficits)
        if ideal is not None:
            q = self.queues.get(ideal)
            if q:
                return self._done(q.popleft())
            i = self._best_pack(deficits, ideal)
            if i is not None:
                return self._done(self._take_pack(i))
            if not force:
                return None
        available = [c for c, q in self.queues.items() if q]
        if available:
            pick = max(available, key=lambda c: (deficits.get(c, float("-inf")), -c))
            return self._done(self.queues[pick].popleft())
        if self.packs:
            return self._done(self._take_pack(self._best_pack(deficits, None) or 0))
        if self.obsolete and (force or not self.target):
            return self._done(self.obsolete.popleft(), obsolete=True)
        return None

    def _done(self, item: tuple[int, dict[int, float]], obsolete: bool = False) -> tuple[int, dict[int, float]]:
        _handle, weights = item
        for c, w in weights.items():
            self.emitted[c] = self.emitted.get(c, 0.0) + w
        self.buffered -= 1
        self.total_emitted += 1
        self.since_obsolete = 0 if obsolete else min(self.since_obsolete + 1, self.interval)
        return item

    def _drain(self, out: list[int]) -> None:
        cap = self.op.max_buffer_size
        force = cap is not None and self.buffered >= cap
        floor = int(self.op.drain_target_ratio * cap) if cap is not None else 0
        while self.buffered:
            item = self._emit_one(force and self.buffered > floor)
            if item is None:
                break
            out.append(item[0])
        self._check_drift()

    def _check_drift(self) -> None:
        tol = self.op.warn_tolerance
        if tol is None or self.warned or self.total_emitted < WARN_WARMUP or not self.target:
            return
        total = sum(self.emitted.get(k, 0.0) for k in self.target)
        if not total:
            return
        for k, t in self.target.items():
            actual = self.emitted.get(k, 0.0) / total
            if abs(actual - t) > tol:
                name = self.ctx.component_names.get(k, str(k))
                warn(
                    f"ensure_mixture: lane {self.ctx.lane}, component {name!r}: share {actual:.3f} against a "
                    f"target of {t:.3f} (warn_tolerance={tol}); a component may be too scarce for the buffer "
                    "(raise max_buffer_size or flush_every_k_chunks).",
                    RuntimeWarning,
                )
                self.warned = True
                return

    # ------------------------------------------------------------------ LaneAccumulator
    def push(self, frame: pa.Table) -> list[pa.Table]:
        if frame.num_rows == 0:
            return []
        handles = self.store.add(frame)
        chunks = frame.column(F.CHUNK).to_numpy()
        out: list[int] = []
        for h, chunk, weights in zip(handles.tolist(), chunks.tolist(), self._weights(frame)):
            if chunk > self.target_chunk:
                self.target_chunk = chunk
                self._set_target(self._resolve_target(chunk))
            self._file(h, weights)
            self._drain(out)
        if self.op.max_buffer_size is None:
            self._check_unmet(frame, emitted=bool(out))
        return self._frames(out)

    def _check_unmet(self, frame: pa.Table, emitted: bool) -> None:
        if emitted:
            self._waiting_rows, self._waiting_components = 0, set()
            return
        self._waiting_rows += frame.num_rows
        self._waiting_components.update(np.unique(frame.column(F.COMPONENT).to_numpy()).tolist())
        # A pass's worth of rows holds each component at least once, up to the source's rounding
        # (a few rows): 5 passes leave no doubt for the only lane; a lane of several reads a share
        # of each pass, so 40 (see engine.lane.steps.EmptyPassGuard).
        passes = 5 if self.ctx.lanes == 1 else 40
        per_pass = self.ctx.rows_per_pass
        if per_pass is None or self._waiting_rows <= passes * per_pass:
            return
        missing = [self.ctx.component_names.get(k, str(k)) for k in self.target if k not in self._waiting_components]
        raise PipelineError(
            f"ensure_mixture(max_buffer_size=None): lane {self.ctx.lane} received {self._waiting_rows} rows, more "
            f"than {passes} passes' worth of the data ({per_pass} rows a pass), and could emit none: target "
            f"component(s) {missing} sent no row in that time (filtered out?), so the exact mixture cannot be met "
            "and the lane would read forever. Pass a max_buffer_size (the buffer then drains with the rows it has), "
            "or a mixture= without those components."
        )

    def _frames(self, handles: list[int]) -> list[pa.Table]:
        if not handles:
            return []
        h = np.array(handles, np.int64)
        table = self.store.take(h)
        self.store.release(h)
        return [table]

    def _release_run_out(self, out: list[int]) -> None:
        """Exact mixture, at a flush point: components the source goes on without that have run
        out by the newest chunk leave the target, so the rows waiting for them go out; when
        every target component has run out, the rows queued for them go out (rows of
        components that left the target earlier stay obsolete)."""
        said = self.ctx.chunk_exhaustion(self.target_chunk).through & self.ctx.continuing
        gone = {self.ids[n] for n in said if n in self.ids} & set(self.target)
        if not gone:
            return
        left = {k: w for k, w in self.target.items() if k not in gone}
        if left:
            total = sum(left.values())
            self._set_target({k: w / total for k, w in left.items()})
            self._drain(out)
            return
        self._force_out(out, lambda: any(self.queues.values()) or bool(self.packs))

    def _force_out(self, out: list[int], more: Callable[[], bool]) -> None:
        """Forced emissions (in the round robin's order) while ``more()``."""
        while more():
            item = self._emit_one(True)
            if item is None:
                break
            out.append(item[0])

    def flush(self, *, reset: bool, end: bool = False) -> list[pa.Table]:
        out: list[int] = []
        if self.op.max_buffer_size is None:
            self._release_run_out(out)
            if self.buffered:
                self.ctx.stats[MIXTURE_DROPPED] = self.ctx.stats.get(MIXTURE_DROPPED, 0) + self.buffered
                self.ctx.notices.note(
                    Notice(kind=MIXTURE_DROPPED, category=MixtureDropWarning, text=_dropped_text),
                    self.ctx.stats,
                    lane=self.ctx.lane,
                )
        else:
            self._force_out(out, lambda: self.buffered > 0)
        frames = self._frames(out)
        self._reset()
        return frames

    def carry(self) -> pa.Table | None:
        return None

    # ------------------------------------------------------------------ checkpoints (by reference)
    def _queued(self) -> list[tuple[str, int, deque[tuple[int, dict[int, float]]]]]:
        """Every waiting row's queue, in a fixed order: components ascending, packs, obsolete."""
        return (
            [("q", c, self.queues[c]) for c in sorted(self.queues)]
            + [("p", -1, self.packs)]
            + [("o", -1, self.obsolete)]
        )

    def snapshot(self) -> tuple[dict[str, Any], pa.Table | None]:
        """The round robin's scalars, and the waiting rows by reference with their weights."""
        layout: list[Any] = []
        handles: list[Any] = []
        single: list[Any] = []
        multi: dict[Any, Any] = {}
        for kind, comp, queue in self._queued():
            if queue:
                layout.append([kind, comp, len(queue)])
                for h, w in queue:
                    if len(w) == 1 and next(iter(w)) == comp:
                        single.append(next(iter(w.values())))
                    else:  # a packed row, or an obsolete one: its weights per component
                        multi[str(len(handles))] = [[c, v] for c, v in w.items()]
                        single.append(0.0)
                    handles.append(h)
        state = {
            "emitted": [[c, v] for c, v in self.emitted.items()],
            "target": [[c, v] for c, v in self.target.items()],
            "target_chunk": self.target_chunk,
            "since_obsolete": self.since_obsolete,
            "total_emitted": self.total_emitted,
            "warned": self.warned,
            "layout": layout,
            "multi": multi,
            "schema": schema_to_json(self.store.payload_schema()),
        }
        if not handles:
            return state, None
        return state, with_state(self.store.refs(np.array(handles, np.int64)), f_weight=single)

    def restore(self, state: dict[str, Any], rows: pa.Table | None, source: Any) -> None:
        self.emitted = {int(c): float(v) for c, v in state["emitted"]}
        self.target = {int(c): float(v) for c, v in state["target"]}
        self.target_chunk = int(state["target_chunk"])
        self.since_obsolete = int(state["since_obsolete"])
        self.total_emitted = int(state["total_emitted"])
        self.warned = bool(state["warned"])
        handles = self.store.restore(rows, schema_from_json(state.get("schema")), source).tolist()
        single = state_column(rows, "f_weight") if rows is not None else []
        weights = []
        i = 0
        for _kind, comp, count in state["layout"]:
            for j in range(i, i + count):
                w = state["multi"].get(str(j))
                weights.append({int(c): float(v) for c, v in w} if w is not None else {int(comp): float(single[j])})
            i += count
        i = 0
        for kind, comp, count in state["layout"]:
            items = deque(zip(handles[i : i + count], weights[i : i + count]))
            i += count
            if kind == "q":
                self.queues[int(comp)] = items
            elif kind == "p":
                self.packs = items
            else:
                self.obsolete = items
        self.buffered = len(handles)

    def rebuild(self, refs: pa.Table, schema: pa.Schema | None, source: Any) -> pa.Table:
        """Rows this stage emitted, from their references: it only reorders rows."""
        return source(refs, schema)
