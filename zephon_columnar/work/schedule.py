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
from collections.abc import Mapping, Sequence
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


def _normalized(i: int, point: SchedulePoint, before: SchedulePoint | None) -> dict[str, Fraction]:
    """Point ``i``'s weights, checked (``before``: the point before it) and normalized to sum 1."""
    where = f"MixtureSchedule point {i} (at={point.at!r})"
    if not isinstance(point.at, int) or isinstance(point.at, bool):
        raise TypeError(f"{where}: at must be a chunk index, an int >= 0.")
    if point.at < 0 or (before is None and point.at != 0):
        raise ValueError(
            f"{where}: at must be an int >= 0, and the first point must be at chunk 0 (where the stream starts)."
        )
    if before is not None and point.at <= before.at:
        raise ValueError(f"{where}: points must be in increasing order of at (the one before is at {before.at}).")
    if point.ramp not in ("step", "linear"):
        raise ValueError(f"{where}: ramp={point.ramp!r}; use 'step' or 'linear'.")
    if before is None and point.ramp == "linear":
        raise ValueError(f"{where}: the first point has nothing to ramp from; use ramp='step'.")
    weights: dict[str, Fraction] = {}
    for name, weight in point.weights.items():
        if not isinstance(name, str) or not isinstance(weight, (int, float)) or isinstance(weight, bool):
            raise TypeError(f"{where}: weights map component names (str) to numbers; got {name!r}: {weight!r}.")
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"{where}: weight of {name!r} is {weight!r}; pass a finite number >= 0.")
        weights[name] = Fraction(weight)
    total = sum(weights.values(), Fraction(0))
    if total == 0:
        raise ValueError(f"{where}: the weights sum to 0; give at least one component a weight > 0.")
    return {name: w / total for name, w in weights.items()}


__all__ = ["MixtureSchedule", "Ramp", "SchedulePoint"]
