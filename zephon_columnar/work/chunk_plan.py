"""The plan step of `~zephon_columnar.work.static_mixture.StaticMixtureWorkSource`: what each
global chunk holds, as ``(dataset, pass, position, count)`` segments, without the pointers.

Planning is O(number of datasets) per chunk: quotas by exact Bresenham accumulators (the
long-run ratios equal the mixture weights exactly), cursor arithmetic, and the exhaustion
policies' transitions. Every lane plans every chunk, so all lanes agree on the stream without
talking to each other; the source then materializes the pointers of the chunks a lane owns.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

from zephon_columnar.errors import ConfigError


class ChunkDraws(Protocol):
    """Weights that change from chunk to chunk (a schedule, `zephon_columnar.work.schedule`), by
    component index. Every pool's units sum to `scale`, so the accumulators' denominator never
    has to grow however often the weights change."""

    scale: int

    def drawn(self, g: int) -> frozenset[int]:
        """The components with a weight > 0 in chunk ``g``."""

    def ahead(self, g: int) -> frozenset[int]:
        """The components with a weight > 0 in chunk ``g`` or any later one."""

    def pool_units(self, g: int, pool: Sequence[int]) -> list[int]:
        """Chunk ``g``'s sample weights of ``pool``, integers summing to `scale`."""

    def targets(self, g: int) -> dict[int, float]:
        """Chunk ``g``'s target mixture (of tokens for a token-unit mixture): every component
        weighted there, drawn or not (one that ran out still counts against its target)."""


@dataclass(frozen=True)
class PlanConfig:
    """Everything that fixes the global chunk stream (shared, read-only, by lane clones).
    ``draws``: weights that change by chunk; None: ``units`` and ``targets`` hold throughout."""

    names: tuple[str, ...]
    rows: tuple[int, ...]
    weights: tuple[float, ...]  # normalized over all components (as in the recipe)
    units: tuple[int, ...]  # sample weights as exact integers (common scale)
    targets: tuple[int, ...]  # the chunks' target_mixture as exact integers: the
    # weights (== units unless the mixture is in tokens)
    chunk_size: int
    policies: tuple[str, ...]
    max_passes: tuple[int | None, ...]  # passes a component may be read; None: unbounded
    floor: int | None  # stop_after_passes
    draws: ChunkDraws | None = None


@dataclass
class PlanCursor:
    """The mutable position of the global stream: O(number of datasets), copied cheaply."""

    g: int  # next global chunk index to plan
    epoch: list[int]  # pass being read (== passes completed)
    position: list[int]  # offset in that pass, always < rows
    active: list[bool]  # still drawn from (weight > 0, not left, stream not over)
    acc: list[int]  # Bresenham accumulators, exactly: acc[k] / den samples
    den: int = 1

    def copy(self) -> PlanCursor:
        return PlanCursor(self.g, list(self.epoch), list(self.position), list(self.active), list(self.acc), self.den)


@dataclass(frozen=True)
class ChunkPlan:
    """What chunk ``g`` holds, without the pointers: ``(k, epoch, position, count)`` segments."""

    g: int
    segments: tuple[tuple[int, int, int, int], ...]
    size: int
    target: dict[str, float]
    exhausted: tuple[str, ...]


class ChunkPlanner:
    """The plan step: quotas and policy transitions of one chunk, O(number of datasets)."""

    def __init__(self, cfg: PlanConfig) -> None:
        self.cfg = cfg
        self._pool_totals: dict[tuple[int, ...], int] = {}

    def pool_total(self, pool: Sequence[int]) -> int:
        """Sum of the integer weights of ``pool``; ``units[k] / total`` is k's share."""
        key = tuple(pool)
        total = self._pool_totals.get(key)
        if total is None:
            total = self._pool_totals[key] = sum(self.cfg.units[k] for k in key)
        return total

    def allocate(self, cur: PlanCursor, pool: list[int], n: int) -> list[int]:
        """Split ``n`` slots of chunk ``cur.g`` among ``pool`` by largest remainder on the
        accumulators.

        Each accumulator is credited its share of ``n`` and debited what it gets, so every
        component stays within 2 samples of its exact share forever. Quotas are floor(acc)
        clamped at 0; the remaining slots go to the largest remainders (ties: lower index).
        When the floors exceed ``n`` (possible once a clamped component owes a sample, or
        after one leaves), slots are taken back from the smallest remainders (ties: higher
        index). The arithmetic is exact (integers over a common denominator), so ties are
        real ties (three equal weights give a, b, c, a, b, c) rather than rounding noise.
        """
        draws = self.cfg.draws
        if draws is None:
            units, total = [self.cfg.units[k] for k in pool], self.pool_total(pool)
        else:
            units, total = draws.pool_units(cur.g, pool), draws.scale
        acc = cur.acc
        if cur.den % total:  # new pool: refine the common denominator (at most a few times)
            m = total // math.gcd(cur.den, total)
            for k in range(len(acc)):
                acc[k] *= m
            cur.den *= m
        den, step = cur.den, cur.den // total * n
        q = []
        for k, units_k in zip(pool, units):
            acc[k] += units_k * step
            q.append(max(acc[k] // den, 0))
        left = n - sum(q)
        if left > 0:
            rank = sorted(range(len(pool)), key=lambda i: (q[i] * den - acc[pool[i]], i))
            for t in range(left):
                q[rank[t % len(rank)]] += 1
        elif left < 0:
            rank = sorted((i for i in range(len(pool)) if q[i] > 0), key=lambda i: (acc[pool[i]] - q[i] * den, -i))
            t = 0
            while left < 0:
                i = rank[t % len(rank)]
                if q[i] > 0:
                    q[i] -= 1
                    left += 1
                t += 1
        for k, qk in zip(pool, q):
            acc[k] -= qk * den
        return q

    def plan(self, cur: PlanCursor) -> ChunkPlan | None:
        """Plan chunk ``cur.g`` and advance ``cur`` past it; None when the stream is over."""
        cfg = self.cfg
        act = [k for k, a in enumerate(cur.active) if a]
        # what this chunk draws from: under a schedule, the active components weighted now
        drawn = act if cfg.draws is None else sorted(cfg.draws.drawn(cur.g).intersection(act))
        if not drawn:
            return None
        rows, policies = cfg.rows, cfg.policies
        consumed = {k: cur.epoch[k] * rows[k] + cur.position[k] for k in act}
        counts = dict.fromkeys(act, 0)
        leaving: list[int] = []
        acc_before, den_before = list(cur.acc), cur.den

        # 1. Quotas. A 'redistribute' component that runs out takes what it has; its shortfall
        #    is re-allocated among the others in the same chunk, so chunks stay full while
        #    anything is left.
        pool, need = drawn, cfg.chunk_size
        while need > 0 and pool:
            short, keep = 0, []
            for k, qk in zip(pool, self.allocate(cur, pool, need)):
                if policies[k] == "redistribute":
                    left = rows[k] - consumed[k] - counts[k]
                    if left <= qk:
                        counts[k] += left
                        short += qk - left
                        leaving.append(k)
                        continue
                counts[k] += qk
                keep.append(k)
            pool, need = keep, short

        # 2. 'stop', and 'repeat' with max_repeats once its last pass is read: the source ends at
        #    the first chunk such a dataset cannot fill, as in Zephon, so every chunk keeps the
        #    mixture; its last rows, fewer than its quota, are not read (nor the others' rest:
        #    that is what 'stop' asks for). The failed draw leaves no trace: the state after the
        #    end is the state before it. A first chunk that cannot be filled is an error.
        cannot_fill = {
            k: rest
            for k in act
            if policies[k] != "redistribute"
            and (rest := terminal_left(cfg, k, consumed[k])) is not None
            and rest < counts[k]
        }
        if cannot_fill:
            cur.acc, cur.den = acc_before, den_before  # planned again (and refused) on every call
            if cur.g == 0:
                k, rest = next(iter(cannot_fill.items()))
                raise ConfigError(
                    f"StaticMixtureWorkSource: Cannot produce the first chunk: dataset {cfg.names[k]!r} "
                    f"(exhausted_policy={policies[k]!r}) has {rest} row(s) to give, fewer than its quota of "
                    f"{counts[k]} in a chunk of {cfg.chunk_size}. Lower chunk_size, or let it repeat "
                    "(exhausted_policy='repeat') or leave early ('redistribute')."
                )
            return None

        # 3. stop_after_passes=N: once every dataset short of N passes can finish them in this
        #    chunk, it is the last one. Those datasets take exactly what they lack; the others
        #    are scaled by the same fraction f, so the final chunk keeps the mixture's shape.
        last = False
        if cfg.floor is not None:
            lacking: list[tuple[int, int]] = []
            done: list[tuple[int, int]] = []
            # a dataset a schedule never weights again cannot hold up the end
            counted = act if cfg.draws is None else sorted(cfg.draws.ahead(cur.g).intersection(act))
            for k in counted:  # every dataset repeats without a cap under a floor
                r = cfg.floor * rows[k] - consumed[k]
                (lacking if r > 0 else done).append((k, r))
            if all(r <= counts[k] for k, r in lacking):
                f = max((Fraction(r, counts[k]) for k, r in lacking), default=Fraction(1))
                for k, r in lacking:
                    counts[k] = r
                for k, _ in done:
                    counts[k] = math.floor(f * counts[k] + Fraction(1, 2))  # round half up, exactly
                last = True

        # 4. Advance the cursors (a draw may run into the next pass: no row skipped).
        segments = []
        for k in act:
            n = counts[k]
            if n:
                segments.append((k, cur.epoch[k], cur.position[k], n))
                cur.epoch[k], cur.position[k] = divmod(consumed[k] + n, rows[k])
        for k in act if last else leaving:
            cur.active[k] = False
            cur.acc[k] = 0
        plan = ChunkPlan(
            g=cur.g,
            segments=tuple(segments),
            size=sum(counts.values()),
            target=chunk_target(cfg, drawn, cur.g),
            exhausted=tuple(
                n
                for k, n in enumerate(cfg.names)
                if terminal_left(cfg, k, cur.epoch[k] * rows[k] + cur.position[k]) == 0
            ),
        )
        cur.g += 1
        return plan

    def unbounded(self, cur: PlanCursor) -> bool:
        """Whether the stream from ``cur`` never ends: no floor, no active dataset that ends it
        ('stop', capped 'repeat'), and one that repeats forever."""
        cfg = self.cfg
        act = [k for k, a in enumerate(cur.active) if a]
        if cfg.floor is not None or any(
            cfg.policies[k] != "redistribute" and cfg.max_passes[k] is not None for k in act
        ):
            return False
        return any(cfg.max_passes[k] is None for k in act)


def terminal_left(cfg: PlanConfig, k: int, consumed: int) -> int | None:
    """Rows dataset ``k`` may still give before its last pass is over, or None when it repeats
    forever. Zero marks it exhausted (``WorkChunk.source_exhausted``); a pass boundary of a
    repeating dataset or the pass floor does not."""
    passes = cfg.max_passes[k]
    return None if passes is None else passes * cfg.rows[k] - consumed


def chunk_target(cfg: PlanConfig, act: list[int], g: int) -> dict[str, float]:
    """The target mixture of chunk ``g``, drawn from the components ``act``."""
    if cfg.draws is not None:
        return {cfg.names[k]: w for k, w in cfg.draws.targets(g).items()}
    total = sum(cfg.targets[k] for k in act)
    return {cfg.names[k]: cfg.targets[k] / total for k in act}


def exact_units(weights: Iterable[float]) -> tuple[int, ...]:
    """Weights as integers on a common scale (floats are dyadic: exact fractions)."""
    exact = [Fraction(w) for w in weights]
    scale = math.lcm(*(f.denominator for f in exact))
    return tuple(int(f * scale) for f in exact)
