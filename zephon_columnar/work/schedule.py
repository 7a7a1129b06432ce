"""Mixture weights as a function of training progress: `MixtureSchedule` (issue 47, first step).

Progress is counted in *global chunks*: every lane plans every chunk of the stream, so chunk
``g`` is the same point of the data whatever the runner, lane or rank count, and a restore
knows it exactly (a sample count would be ``g * chunk_size``; a token count is an estimate).

A schedule is a list of points ``(at, weights)``, the first at chunk 0. Between two points the
weights either hold the earlier point's until the later one (``"step"``: phases) or move in a
straight line from one to the other (``"linear"``: a ramp), as the later point says. A
component missing from a point weighs 0 there: it enters or leaves the mixture at that point.
Every value is an exact `Fraction` (a float weight is taken at its exact binary value), so a
planner that turns them into integer quotas gives the same chunks on every machine.

Example:
    >>> s = MixtureSchedule([
    ...     SchedulePoint(at=0, weights={"web": 0.9, "code": 0.1}),                  # start here,
    ...     SchedulePoint(at=100, weights={"web": 0.6, "code": 0.4}, ramp="linear"),  # ramp to main,
    ...     SchedulePoint(at=900, weights={"web": 0.5, "math": 0.5}),                 # then anneal
    ... ])
    >>> {k: float(v) for k, v in s.weights_at(50).items()}
    {'code': 0.25, 'math': 0.0, 'web': 0.75}
    >>> {k: float(v) for k, v in s.weights_at(900).items()}
    {'code': 0.0, 'math': 0.5, 'web': 0.5}
    >>> s.phase_at(899), s.phase_at(900)
    (1, 2)
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

Ramp = Literal["step", "linear"]


@dataclass(frozen=True, kw_only=True)
class SchedulePoint:
    """The mixture ``weights`` at global chunk ``at`` (normalized to sum 1); ``ramp``: how the
    weights get here from the point before (``"step"``: they change at ``at``; ``"linear"``:
    they move in a straight line from the point before)."""

    at: int
    weights: Mapping[str, float]
    ramp: Ramp = "step"


@dataclass(frozen=True)
class MixtureSchedule:
    """Weights per global chunk (see the module docstring). Raises ValueError naming the point
    for a point out of order, a negative or non-finite weight, or a point whose weights sum to 0;
    TypeError for a chunk index, name or weight of the wrong type."""

    points: Sequence[SchedulePoint]
    _exact: tuple[dict[str, Fraction], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        points = tuple(self.points)
        if not points:
            raise ValueError("MixtureSchedule: pass at least one SchedulePoint (at=0, weights={...}).")
        exact = [_normalized(i, point, points[i - 1] if i else None) for i, point in enumerate(points)]
        names = sorted({name for weights in exact for name in weights})
        object.__setattr__(self, "points", points)
        object.__setattr__(self, "_exact", tuple({n: w.get(n, Fraction(0)) for n in names} for w in exact))

    @property
    def components(self) -> list[str]:
        """Every component any point names, sorted."""
        return list(self._exact[0])

    def phase_at(self, chunk: int) -> int:
        """The index of the last point at or before ``chunk``."""
        return max(0, bisect.bisect_right(self.points, chunk, key=lambda p: p.at) - 1)

    def weights_at(self, chunk: int) -> dict[str, Fraction]:
        """The exact weights of global chunk ``chunk`` (summing to 1), by component name."""
        if chunk < 0:
            raise ValueError(f"MixtureSchedule.weights_at({chunk}): a chunk index is >= 0.")
        i = self.phase_at(chunk)
        if i + 1 < len(self.points) and self.points[i + 1].ramp == "linear":
            start, end = self.points[i].at, self.points[i + 1].at
            t = Fraction(chunk - start, end - start)
            before, after = self._exact[i], self._exact[i + 1]
            return {n: before[n] + (after[n] - before[n]) * t for n in before}
        return dict(self._exact[i])

    def fingerprint(self) -> list[dict[str, Any]]:
        """The schedule as JSON-normal values (a checkpoint's recipe records it)."""
        return [{"at": p.at, "ramp": p.ramp, "weights": dict(sorted(p.weights.items()))} for p in self.points]

    @classmethod
    def from_fingerprint(cls, fingerprint: Sequence[Mapping[str, Any]]) -> MixtureSchedule:
        """The schedule `fingerprint` describes (``KeyError`` / ``TypeError`` / ``ValueError``
        when it is not one)."""
        return cls([SchedulePoint(at=p["at"], weights=dict(p["weights"]), ramp=p["ramp"]) for p in fingerprint])

    def first_difference(self, other: MixtureSchedule) -> int | None:
        """The first chunk whose weights differ between this schedule and ``other`` (None: they
        agree on every chunk). Both are linear between their points, so comparing them at the
        points (and the chunk before each) finds it.

        Example:
            >>> a = MixtureSchedule([SchedulePoint(at=0, weights={"x": 1, "y": 1})])
            >>> b = MixtureSchedule([SchedulePoint(at=0, weights={"x": 1}), SchedulePoint(at=8, weights={"x": 1, "y": 1}, ramp="linear")])
            >>> a.first_difference(b), a.first_difference(MixtureSchedule([SchedulePoint(at=0, weights={"y": 2, "x": 2})]))
            (0, None)
        """  # noqa: E501 - a doctest line
        names = sorted(set(self.components) | set(other.components))

        def weights(schedule: MixtureSchedule, chunk: int) -> list[Fraction]:
            at = schedule.weights_at(chunk)
            return [at.get(n, Fraction(0)) for n in names]

        marks = sorted({c for p in (*self.points, *other.points) for c in (p.at - 1, p.at) if c >= 0})
        before = None
        for chunk in marks:
            if weights(self, chunk) != weights(other, chunk):
                # equal at the mark before and both linear in between: they part right after it
                return 0 if before is None else before + 1
            before = chunk
        return None


@dataclass(frozen=True, kw_only=True)
class MixtureChange:
    """A change of the mixture the training loop asked for: from global chunk ``at`` the
    ``weights`` (normalized) hold, until the schedule's next point (then the schedule again) or
    the next change (of two at the same chunk, the later). A component the weights leave out
    weighs 0."""

    at: int
    weights: Mapping[str, float]

    def to_state(self) -> dict[str, Any]:
        return {"at": self.at, "weights": dict(sorted(self.weights.items()))}


class ScheduledWeights:
    """A schedule and the changes applied to it: the weights of every chunk, in segments.

    The weights of chunk ``g`` are those of the latest change at or before ``g`` when no point
    of the schedule lies after it and at or before ``g``, else the schedule's. ``segment(g)``
    also names the stretch of chunks ``g`` belongs to, constant weights sharing one key (a
    ramp's chunks each have their own), so that callers can cache per stretch.

    Example:
        >>> s = MixtureSchedule([SchedulePoint(at=0, weights={"a": 1}), SchedulePoint(at=10, weights={"b": 1})])
        >>> w = ScheduledWeights(s, [MixtureChange(at=4, weights={"a": 1, "b": 1})])
        >>> [float(w.segment(g)[1]["b"]) for g in (3, 4, 9, 10)]
        [0.0, 0.5, 0.5, 1.0]
        >>> sorted(w.ahead(5))
        ['a', 'b']
    """

    def __init__(self, schedule: MixtureSchedule, changes: Sequence[MixtureChange] = ()) -> None:
        self.schedule = schedule
        self.changes = tuple(changes)
        names = schedule.components
        exact = []
        for i, change in enumerate(self.changes):
            where = f"mixture change {i} (at chunk {change.at!r})"
            _check_chunk(where, change.at)
            if i and change.at < self.changes[i - 1].at:
                raise ValueError(
                    f"{where}: changes must be in order of at (the one before is at {self.changes[i - 1].at}); "
                    "of two at the same chunk the later governs."
                )
            unknown = sorted(set(change.weights) - set(names))
            if unknown:
                raise KeyError(f"{where}: unknown component(s) {unknown}; the mixture's components are {names}.")
            weights = exact_weights(where, change.weights)
            exact.append({n: weights.get(n, Fraction(0)) for n in names})
        self._exact = tuple(exact)
        self._change_at = [c.at for c in self.changes]

    @property
    def components(self) -> list[str]:
        return self.schedule.components

    def change_at(self, g: int) -> int | None:
        """The index of the change that governs chunk ``g``, or None (the schedule does)."""
        i = bisect.bisect_right(self._change_at, g) - 1
        if i < 0 or self.changes[i].at < self.schedule.points[self.schedule.phase_at(g)].at:
            return None
        return i

    def segment(self, g: int) -> tuple[Hashable, dict[str, Fraction]]:
        """``(key, weights)`` of chunk ``g``: chunks with one key have the same weights."""
        change = self.change_at(g)
        if change is not None:
            return ("change", change), dict(self._exact[change])
        schedule = self.schedule
        phase = schedule.phase_at(g)
        points = schedule.points
        ramping = phase + 1 < len(points) and points[phase + 1].ramp == "linear"
        return ("ramp", g) if ramping else ("phase", phase), schedule.weights_at(g)

    def ahead(self, g: int) -> frozenset[str]:
        """The components with a weight > 0 in chunk ``g`` or any later chunk (as far as the
        schedule and the changes so far say)."""
        now = {n for n, w in self.segment(g)[1].items() if w > 0}
        points = self.schedule.points
        later = [self.schedule.weights_at(p.at) for p in points[self.schedule.phase_at(g) + 1 :]] + [
            w for c, w in zip(self.changes, self._exact) if c.at > g
        ]
        return frozenset(now.union(*({n for n, x in w.items() if x > 0} for w in later)))

    def fingerprint(self) -> dict[str, Any]:
        return {"schedule": self.schedule.fingerprint(), "changes": [c.to_state() for c in self.changes]}


def _normalized(i: int, point: SchedulePoint, before: SchedulePoint | None) -> dict[str, Fraction]:
    """Point ``i``'s weights, checked (``before``: the point before it) and normalized to sum 1."""
    where = f"MixtureSchedule point {i} (at={point.at!r})"
    _check_chunk(where, point.at)
    if before is None and point.at != 0:
        raise ValueError(f"{where}: the first point must be at chunk 0 (where the stream starts).")
    if before is not None and point.at <= before.at:
        raise ValueError(f"{where}: points must be in increasing order of at (the one before is at {before.at}).")
    if point.ramp not in ("step", "linear"):
        raise ValueError(f"{where}: ramp={point.ramp!r}; use 'step' or 'linear'.")
    if before is None and point.ramp == "linear":
        raise ValueError(f"{where}: the first point has nothing to ramp from; use ramp='step'.")
    return exact_weights(where, point.weights)


def _check_chunk(where: str, at: object) -> None:
    if not isinstance(at, int) or isinstance(at, bool):
        raise TypeError(f"{where}: at must be a chunk index, an int >= 0.")
    if at < 0:
        raise ValueError(f"{where}: at must be an int >= 0.")


def exact_weights(where: str, weights: Mapping[str, float]) -> dict[str, Fraction]:
    """``weights`` checked (names str, numbers finite and >= 0, not all 0; errors start with
    ``where``) and normalized to sum 1, as exact fractions."""
    if not isinstance(weights, Mapping):
        raise TypeError(f"{where}: weights must be a mapping {{component: weight}}, got {type(weights).__name__}.")
    exact: dict[str, Fraction] = {}
    for name, weight in weights.items():
        if not isinstance(name, str) or not isinstance(weight, (int, float)) or isinstance(weight, bool):
            raise TypeError(f"{where}: weights map component names (str) to numbers; got {name!r}: {weight!r}.")
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"{where}: weight of {name!r} is {weight!r}; pass a finite number >= 0.")
        exact[name] = Fraction(weight)
    total = sum(exact.values(), Fraction(0))
    if total == 0:
        raise ValueError(f"{where}: the weights sum to 0; give at least one component a weight > 0.")
    return {name: w / total for name, w in exact.items()}


__all__ = ["MixtureChange", "MixtureSchedule", "Ramp", "SchedulePoint", "ScheduledWeights", "exact_weights"]
