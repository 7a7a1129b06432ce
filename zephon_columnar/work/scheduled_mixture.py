"""`ScheduledMixtureWorkSource`: a mixture whose weights change during training, exactly.

The weights are a `~zephon_columnar.work.schedule.MixtureSchedule` (phases and linear ramps,
per global chunk) with the changes the training loop asked for (`with_mixture_change`; a
`~zephon_columnar.session.Session` decides where a change takes effect). Everything else is
`~zephon_columnar.work.static_mixture.StaticMixtureWorkSource`: the same datasets, orders,
exhaustion policies, lanes and token units, planned by the same accumulators. Because every lane
plans every chunk, the weights of chunk ``g`` are the same whatever the runner or layout, and a
checkpoint (which records the changes) restores the stream exactly.

Each chunk's sample weights are quantized to integers summing to ``2**62`` (largest remainder,
exact arithmetic): the accumulators then keep one denominator however often the weights change,
and a component's realized share stays within 2 rows of the schedule's, plus ``2**-62`` of the
rows drawn.

A component the schedule weighs 0 in a chunk is not drawn there; its position and accumulator
wait for the chunk that weights it again. Under ``stop_after_passes`` the stream ends once every
dataset the schedule still weights (now or later) has completed its passes.

Example:
    >>> from zephon_columnar.io.dataset import Dataset
    >>> web = Dataset.from_dict("web", {0: [{"t": "w"}] * 400})
    >>> code = Dataset.from_dict("code", {0: [{"t": "c"}] * 400})
    >>> schedule = MixtureSchedule([
    ...     SchedulePoint(at=0, weights={"web": 1.0}),                       # warm-up: web only
    ...     SchedulePoint(at=2, weights={"web": 0.5, "code": 0.5}),          # main
    ...     SchedulePoint(at=4, weights={"code": 1.0}, ramp="linear"),       # ramp to code
    ... ])
    >>> ws = ScheduledMixtureWorkSource([web, code], schedule, chunk_size=8, stop_after_passes=None,
    ...                                 exhausted_policy="repeat")
    >>> [{n: len(p) for n, p in ws.next_chunk().components.items()} for _ in range(5)]
    [{'web': 8}, {'web': 8}, {'web': 4, 'code': 4}, {'web': 2, 'code': 6}, {'code': 8}]
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import replace
from fractions import Fraction
from typing import Any, Literal

from zephon_columnar.errors import CheckpointError, ConfigError, ConfigurationWarning, DataDroppedWarning, warn
from zephon_columnar.io.dataset import Dataset
from zephon_columnar.recipes import recipe_differences
from zephon_columnar.work.chunk_plan import ChunkPlanner, PlanCursor
from zephon_columnar.work.schedule import (
    MixtureChange,
    MixtureSchedule,
    ScheduledWeights,
    SchedulePoint,
    exact_weights,
)
from zephon_columnar.work.static_mixture import StaticMixtureWorkSource
from zephon_columnar.work.token_estimation import TokenRatio

#: What every chunk's sample weights sum to (see the module docstring).
DRAW_SCALE = 1 << 62

#: How a restore treats a checkpoint taken under another schedule: refused (naming where they
#: differ), or continued when they differ only after what the restore replays ("future").
ScheduleEdits = Literal["refuse", "future"]


class ScheduleDraws:
    """The `~zephon_columnar.work.chunk_plan.ChunkDraws` of scheduled weights over the datasets
    ``names`` (by index); ``tokens_per_sample``: a token-unit mixture's expected tokens of a
    sample of each dataset (None: sample units). Shared by a source's lane clones: its caches
    hold values keyed by everything they depend on, so concurrent lanes only recompute."""

    scale = DRAW_SCALE

    def __init__(
        self,
        weights: ScheduledWeights,
        names: Sequence[str],
        tokens_per_sample: Sequence[float | Fraction] | None = None,
    ) -> None:
        self.weights = weights
        self.names = tuple(names)
        self.per_sample = None if tokens_per_sample is None else tuple(Fraction(t) for t in tokens_per_sample)
        self._index = {n: k for k, n in enumerate(self.names)}
        self._units: dict[tuple[Hashable, tuple[int, ...]], list[int]] = {}
        # The planner asks about one chunk several times in a row: its segment, weights and the
        # components weighted now and ahead, computed once (a tuple, replaced whole: lane
        # clones share this object across threads).
        self._chunk: tuple[int, Hashable, tuple[Fraction, ...], frozenset[int]] | None = None
        self._ahead: dict[Hashable, frozenset[int]] = {}

    def _of(self, g: int) -> tuple[int, Hashable, tuple[Fraction, ...], frozenset[int]]:
        chunk = self._chunk
        if chunk is None or chunk[0] != g:
            key, weights = self.weights.segment(g)
            targets = tuple(weights[n] for n in self.names)
            chunk = self._chunk = (g, key, targets, frozenset(k for k, w in enumerate(targets) if w > 0))
        return chunk

    def _targets(self, g: int) -> tuple[Hashable, tuple[Fraction, ...]]:
        _, key, targets, _ = self._of(g)
        return key, targets

    def drawn(self, g: int) -> frozenset[int]:
        return self._of(g)[3]

    def ahead(self, g: int) -> frozenset[int]:
        key = self._of(g)[1]
        ahead = self._ahead.get(key)
        if ahead is None:
            if len(self._ahead) > 64:  # a ramp has a segment per chunk: keep the caches small
                self._ahead.clear()
                self._units.clear()
            ahead = self._ahead[key] = frozenset(self._index[n] for n in self.weights.ahead(g))
        return ahead

    def pool_units(self, g: int, pool: Sequence[int]) -> list[int]:
        key, targets = self._targets(g)
        cached = self._units.get((key, tuple(pool)))
        if cached is None:
            if len(self._units) > 64:  # a ramp has a segment per chunk: keep the cache small
                self._units.clear()
            per_sample = self.per_sample
            shares = [
                targets[k] if per_sample is None else (targets[k] / per_sample[k] if per_sample[k] > 0 else Fraction(0))
                for k in pool
            ]
            cached = self._units[key, tuple(pool)] = quantized(shares, self.scale)
        return cached

    def targets(self, g: int) -> dict[int, float]:
        return {k: float(w) for k, w in enumerate(self._targets(g)[1]) if w > 0}


def quantized(shares: Sequence[Fraction], scale: int) -> list[int]:
    """``shares`` scaled to integers that sum to ``scale`` exactly: floors, then the largest
    remainders (ties: the lower index) get one more.

    Example:
        >>> quantized([Fraction(1), Fraction(1), Fraction(1)], 10)
        [4, 3, 3]
    """
    total = sum(shares, Fraction(0))
    if total == 0:
        return [scale // len(shares)] * len(shares)  # a pool of unweighted components: never asked
    exact = [s * scale / total for s in shares]
    units = [math.floor(e) for e in exact]
    for i in sorted(range(len(shares)), key=lambda i: (units[i] - exact[i], i))[: scale - sum(units)]:
        units[i] += 1
    return units


class ScheduledMixtureWorkSource(StaticMixtureWorkSource):
    """A mixture of ``datasets`` weighted by ``schedule`` (a `MixtureSchedule`, or a list of
    `SchedulePoint` s), with the trainer's ``changes`` so far (`with_mixture_change` adds one).

    Every other argument is `StaticMixtureWorkSource`'s, with the same meaning and defaults. The
    schedule must name every dataset at some point, and only datasets (``ConfigError``). A state
    restores only into a source with the same recipe, schedule included (a
    `~zephon_columnar.errors.CheckpointError` names each difference); the state's changes are
    adopted, and changes this source has beyond them stay (a `Session` restarting a run from the
    delivered position with one more change).

    Example:
        >>> from zephon_columnar.io.dataset import Dataset
        >>> a, b = (Dataset.from_dict(n, {0: [{"x": 1}] * 100}) for n in "ab")
        >>> ws = ScheduledMixtureWorkSource([a, b], [SchedulePoint(at=0, weights={"a": 1, "b": 1})], chunk_size=4)
        >>> changed = ws.with_mixture_change(at=1, weights={"a": 3, "b": 1})
        >>> [{n: len(p) for n, p in changed.next_chunk().components.items()} for _ in range(2)]
        [{'a': 2, 'b': 2}, {'a': 3, 'b': 1}]
        >>> changed.state_dict()["mixture_changes"]
        [{'at': 1, 'weights': {'a': 3, 'b': 1}}]
    """

    def __init__(
        self,
        datasets: Sequence[Dataset],
        schedule: MixtureSchedule | Sequence[SchedulePoint],
        *,
        changes: Sequence[MixtureChange] = (),
        schedule_edits: ScheduleEdits = "refuse",
        **options: Any,
    ) -> None:
        where = "ScheduledMixtureWorkSource"
        if schedule_edits not in ("refuse", "future"):
            raise ConfigError(f"{where}: schedule_edits={schedule_edits!r}; use 'refuse' or 'future'.")
        if not isinstance(schedule, MixtureSchedule):
            if isinstance(schedule, (Mapping, str)) or not all(isinstance(p, SchedulePoint) for p in schedule):
                raise ConfigError(
                    f"{where}: schedule must be a MixtureSchedule or a list of SchedulePoint(at=..., weights=...), "
                    f"got {schedule!r}; for fixed weights use StaticMixtureWorkSource."
                )
            schedule = MixtureSchedule(list(schedule))
        names = [ds.name for ds in datasets]
        unknown = sorted(set(schedule.components) - set(names))
        unweighted = [n for n in names if n not in schedule.components]
        if unknown or unweighted:
            raise ConfigError(
                f"{where}: the schedule names {schedule.components} but the datasets are {names}"
                + (f"; unknown: {unknown}" if unknown else "")
                + (f"; never weighted: {unweighted}" if unweighted else "")
                + ". Name every dataset at some point of the schedule (weight 0 elsewhere), and only those."
            )
        weights = ScheduledWeights(schedule, changes)
        first = {n: float(w) for n, w in weights.segment(0)[1].items()}
        super().__init__(datasets, {n: first[n] for n in names}, **options)
        self._scheduled = weights
        self._warned_left = False
        self._schedule_edits: ScheduleEdits = schedule_edits
        self._accepted_past: Any = None  # a checkpoint's schedule continued_from accepted (its fingerprint)
        cfg = self._planner.cfg
        self._planner = ChunkPlanner(replace(cfg, draws=ScheduleDraws(weights, cfg.names)))
        recipe = self.recipe()
        del recipe["mixture"]  # the schedule is the mixture (the changes are state: they happen during the run)
        self._set_recipe({**recipe, "schedule": schedule.fingerprint()})
        self._cursor = self._start_cursor()
        self._reset_caches()

    @property
    def schedule(self) -> MixtureSchedule:
        return self._scheduled.schedule

    @property
    def changes(self) -> tuple[MixtureChange, ...]:
        """The changes applied so far (the trainer's `with_mixture_change` calls), oldest first."""
        return self._scheduled.changes

    def accepts_mixture_changes(self) -> bool:
        return True

    def with_mixture_change(self, *, at: int, weights: Mapping[str, float]) -> ScheduledMixtureWorkSource:
        """This source (at its position) with one more change: ``weights`` from global chunk
        ``at`` until the schedule's next point. ``at`` must not be before the last change (one
        at the same chunk overrides it: every call stays in the history, so the states taken
        between them stay its prefixes), nor before the next chunk this source plans (chunks
        planned keep their weights). A component ``weights`` leaves out weighs 0; unknown ones
        raise ``KeyError``."""
        where = f"{type(self).__name__}.with_mixture_change(at={at!r})"
        exact_weights(where, weights)  # TypeError / ValueError naming the call
        if isinstance(at, int) and not isinstance(at, bool) and at < self._cursor.g:
            raise ValueError(
                f"{where}: this source already planned chunk {self._cursor.g - 1}; pass at >= {self._cursor.g}."
            )
        return self._with_changes((*self.changes, MixtureChange(at=at, weights=dict(weights))))

    def for_epoch(self, epoch: int) -> ScheduledMixtureWorkSource:
        """`StaticMixtureWorkSource.for_epoch`: a new pass, from chunk 0 of the schedule; the
        changes of the training loop are left behind (they were positions of another pass)."""
        twin = super().for_epoch(epoch)
        return twin if not twin.changes else twin._with_changes(())  # noqa: SLF001 - this class's own

    def _with_changes(self, changes: Sequence[MixtureChange]) -> ScheduledMixtureWorkSource:
        twin = object.__new__(type(self))
        twin.__dict__.update(self.__dict__)
        twin._scheduled = ScheduledWeights(self.schedule, changes)
        draws = self._planner.cfg.draws
        assert isinstance(draws, ScheduleDraws)
        twin._planner = ChunkPlanner(
            replace(self._planner.cfg, draws=ScheduleDraws(twin._scheduled, draws.names, draws.per_sample))
        )
        twin._cursor = self._cursor.copy()
        twin._positions = None
        twin._reset_caches()
        return twin

    def _start_cursor(self) -> PlanCursor:
        """Before the first chunk: every dataset with rows that the schedule weights at some
        point is active (it may enter later); the accumulators count in `DRAW_SCALE` ths."""
        cur = super()._start_cursor()
        if self._planner.cfg.draws is not None:  # (not yet while StaticMixtureWorkSource.__init__ runs)
            cur.active = [r > 0 for r in self._planner.cfg.rows]
            cur.den = DRAW_SCALE
        return cur

    def _use_ratios(self, ratios: Mapping[str, TokenRatio]) -> None:
        super()._use_ratios(ratios)
        cfg = self._planner.cfg
        per_sample = [
            self._ratios[n].tokens_per_byte * b / max(r, 1) if self._ratios else 0.0
            for n, b, r in zip(cfg.names, self._stored_bytes, cfg.rows)
        ]
        self._planner = ChunkPlanner(replace(cfg, draws=ScheduleDraws(self._scheduled, cfg.names, per_sample)))

    def _warn_unread(self) -> None:
        """`StaticMixtureWorkSource._warn_unread`, and a `DataDroppedWarning` (once) where the
        schedule lost data: the stream ended because every dataset a phase weights ran out
        while later points weight others, or (under a pass floor) the schedule stopped weighting
        datasets before they completed their passes (the rows of the pass they left unread)."""
        super()._warn_unread()
        cfg, cur = self._planner.cfg, self._cursor
        if self._warned_left:
            return
        active = {n for n, a in zip(cfg.names, cur.active) if a}
        now = {n for n, w in self._scheduled.segment(cur.g)[1].items() if w > 0}
        waiting = sorted((self._scheduled.ahead(cur.g) - now) & active)
        if waiting and not now & active:
            self._warned_left = True
            warn(
                f"{type(self).__name__}: the stream ended at chunk {cur.g}: every dataset the schedule weights there "
                f"({sorted(now)}) has run out ('redistribute'), so its later points, which weight {waiting}, were not "
                "reached. Let those datasets repeat (exhausted_policy='repeat'), or weight others in that phase.",
                DataDroppedWarning,
            )
            return
        if cfg.floor is None:
            return
        left = {
            n: cfg.rows[k] - cur.position[k]
            for k, n in enumerate(cfg.names)
            if cfg.rows[k] and cur.epoch[k] < cfg.floor
        }
        if left:
            self._warned_left = True
            warn(
                f"{type(self).__name__}: the schedule stopped weighting {sorted(left)} before they completed "
                f"stop_after_passes={cfg.floor} pass(es), so the stream ended without their last rows (unread in "
                f"the pass they were in: {left}). Weight them in a later phase to read them, or lower "
                "stop_after_passes.",
                DataDroppedWarning,
            )

    def target_weights(self) -> dict[str, float]:
        """The weights of the next chunk this source plans (of samples, or of tokens)."""
        _, weights = self._scheduled.segment(self._cursor.g)
        return {n: float(weights[n]) for n in self._planner.cfg.names}

    def rows_per_pass(self) -> int | None:
        """None: under a schedule a pass has no fixed length."""
        return None

    def _weight_text(self, k: int) -> str:
        return "weighted by the schedule"

    def describe_data(self) -> list[str]:
        lines = super().describe_data()
        g = self._cursor.g
        planned = f"; the next one this source plans is {g}" if g else ""
        lines.append(f"  schedule (by global chunk{planned}):")
        for i, p in enumerate(self.schedule.points):
            now = " <- now" if g and self._scheduled.change_at(g) is None and self.schedule.phase_at(g) == i else ""
            weights = ", ".join(f"{n} {float(w):.3f}" for n, w in self.schedule.weights_at(p.at).items() if w)
            lines.append(f"    from chunk {p.at}{' (linear ramp)' if p.ramp == 'linear' else ''}: {weights}{now}")
        for i, c in enumerate(self.changes):
            now = " <- now" if g and self._scheduled.change_at(g) == i else ""
            weights = ", ".join(f"{n} {float(w):.3f}" for n, w in self._scheduled.segment(c.at)[1].items() if w)
            lines.append(f"    changed at chunk {c.at}: {weights}{now}")
        return lines

    def _schedule_difference(self, fingerprint: Any) -> str:
        """What differs between the schedule a checkpoint's recipe holds and this source's."""
        try:
            saved = MixtureSchedule.from_fingerprint(fingerprint)
        except (KeyError, TypeError, ValueError):
            return f"schedule: {fingerprint!r} in the checkpoint is not a schedule"
        chunk = saved.first_difference(self.schedule)
        if chunk is None:
            return "schedule: written differently, with the same weights (build it as the checkpoint's)"

        def shown(weights: Mapping[str, Fraction]) -> str:
            return ", ".join(f"{n} {float(w):.3g}" for n, w in sorted(weights.items()) if w)

        return (
            f"the schedules differ from chunk {chunk} (checkpoint: {shown(saved.weights_at(chunk))}; "
            f"here: {shown(self.schedule.weights_at(chunk))})"
        )

    def state_dict(self) -> dict[str, Any]:
        """`StaticMixtureWorkSource.state_dict` with ``mixture_changes`` (the changes applied, one
        entry each) and ``weights`` those of the next chunk."""
        state = super().state_dict()
        state["mixture_changes"] = [c.to_state() for c in self.changes]
        state["weights"] = self.target_weights()
        return state

    def continued_from(
        self, state: Mapping[str, Any], *, replayed_before: int | None = None
    ) -> ScheduledMixtureWorkSource:
        """This source with exactly the changes of ``state``: the checkpoint's history is the run's
        (changes this source has beyond it, made after the checkpoint was taken, are left behind;
        a restored training loop makes them again at the same steps). Built with
        ``schedule_edits="future"``, it also accepts a state taken under another schedule when the
        two agree on every chunk before ``replayed_before`` (what the restore replays as it was
        read), with a `ConfigurationWarning`: the past replays, this schedule governs the rest."""
        where = f"{type(self).__name__}.continued_from"
        changes = _changes_of(state, where=where)
        twin = self if changes == self.changes else self._with_changes(changes)
        recipe = state.get("recipe") if isinstance(state, Mapping) else None
        saved_fp = recipe.get("schedule") if isinstance(recipe, Mapping) else None
        if saved_fp is None or saved_fp == self.recipe()["schedule"]:
            return twin
        if self._schedule_edits != "future":
            raise CheckpointError(
                f"{where}: the checkpoint was taken under another schedule: {self._schedule_difference(saved_fp)}. "
                "Build the source with the checkpoint's schedule, or, where only its future changed on purpose, "
                "with schedule_edits='future'."
            )
        try:
            saved = MixtureSchedule.from_fingerprint(saved_fp)
        except (KeyError, TypeError, ValueError) as err:
            raise CheckpointError(f"{where}: the checkpoint's schedule {saved_fp!r} is not one ({err}).") from err
        first = saved.first_difference(self.schedule)
        if first is not None and (replayed_before is None or first < replayed_before):
            raise CheckpointError(
                f"{where}: schedule_edits='future', but {self._schedule_difference(saved_fp)}, and the restore "
                + (
                    "cannot tell which chunks it replays"
                    if replayed_before is None
                    else f"replays the chunks before {replayed_before} as they were read"
                )
                + f": only the schedule from chunk {replayed_before} on may change. Keep the checkpoint's points "
                "before it (or restore a later checkpoint)."
            )
        if twin is self:
            twin = self._with_changes(changes)
        twin._accepted_past = saved_fp  # noqa: SLF001 - a copy of this very source
        warn(
            f"{where}: continuing under this source's schedule (schedule_edits='future'): "
            f"{self._schedule_difference(saved_fp)}, after the {replayed_before} chunks the restore replays as "
            "they were read.",
            ConfigurationWarning,
        )
        return twin

    def as_continued(self, saved_recipe: Mapping[str, Any]) -> Mapping[str, Any]:
        if self._accepted_past is not None and saved_recipe.get("schedule") == self._accepted_past:
            return {**saved_recipe, "schedule": self.recipe()["schedule"]}
        return saved_recipe

    def _changes_with(self, state: Mapping[str, Any], *, where: str) -> tuple[MixtureChange, ...]:
        """The longer of this source's changes and ``state``'s, when one extends the other."""
        theirs = _changes_of(state, where=where)
        ours = self.changes
        common = min(len(theirs), len(ours))
        if [c.to_state() for c in theirs[:common]] != [c.to_state() for c in ours[:common]]:
            raise CheckpointError(
                f"{where}: the checkpoint's mixture changes {[c.to_state() for c in theirs]} contradict this "
                f"source's {[c.to_state() for c in ours]}; build the source without changes (the checkpoint "
                "brings its own)."
            )
        return theirs if len(theirs) > len(ours) else ours

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        where = f"{type(self).__name__}.load_state_dict"
        if isinstance(state, Mapping) and isinstance(state.get("recipe"), Mapping):
            saved = self.as_continued(state["recipe"])
            diffs = recipe_differences({**saved, "schedule": None}, {**self.recipe(), "schedule": None})
            if saved.get("schedule") != self.recipe()["schedule"]:
                diffs.insert(0, self._schedule_difference(saved.get("schedule")))
            if diffs:
                raise CheckpointError(
                    f"{where}: the checkpoint was taken with another recipe (" + "; ".join(diffs) + "). A "
                    "scheduled mixture continues only with the recipe and schedule it was saved with: build the "
                    "source with the checkpoint's (or, where only the schedule's future changed on purpose, with "
                    "schedule_edits='future')."
                )
        changes = self._changes_with(state, where=where)
        if isinstance(state, Mapping) and isinstance(state.get("recipe"), Mapping):
            state = {**state, "recipe": self.as_continued(state["recipe"])}
        super().load_state_dict(state)
        if changes != self.changes:
            self.__dict__.update(self._with_changes(changes).__dict__)


def _changes_of(state: Mapping[str, Any], *, where: str) -> tuple[MixtureChange, ...]:
    raw = state.get("mixture_changes", []) if isinstance(state, Mapping) else []
    try:
        return tuple(MixtureChange(at=c["at"], weights=dict(c["weights"])) for c in raw)
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"{where}: the state's mixture_changes are malformed ({err!r}).") from err


__all__ = ["DRAW_SCALE", "ScheduleEdits", "ScheduledMixtureWorkSource", "quantized"]
