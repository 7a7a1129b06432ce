"""How Zephon's reader orders one chunk's samples: `MixtureReadConfig` and `read_order`.

Between components, ``WEIGHTED_ROUND_ROBIN`` (smooth weighted round robin: each step emits the
component furthest below its share so far, ties to the earlier component) or
``WEIGHTED_RANDOM`` (a seeded weighted draw per step); within a component, ``AS_IS`` or
``SHUFFLE`` (seeded per component). Each component's weight is its share of the chunk.

Example:
    >>> comps = {"A": [(0, 0, 0), (0, 0, 1), (0, 0, 2)], "B": [(1, 0, 0)]}
    >>> [name for _, name in read_order(comps, MixtureReadConfig(), seed=None)]
    ['A', 'B', 'A', 'A']
"""

from __future__ import annotations

import enum
import random
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass

from zephon_columnar.records import SampleId

MixtureComponent = str
SourcedSampleId = tuple[SampleId, MixtureComponent]
SamplesPerComponent = MutableMapping[MixtureComponent, list[SampleId]]


class MixtureReadMode(str, enum.Enum):
    """How a chunk's components take turns."""

    WEIGHTED_RANDOM = "weighted_random"
    WEIGHTED_ROUND_ROBIN = "weighted_round_robin"


class ComponentOrder(str, enum.Enum):
    """How samples are taken within one component."""

    AS_IS = "as_is"
    SHUFFLE = "shuffle"


@dataclass(frozen=True)
class MixtureReadConfig:
    """Read order of a chunk: the mode between components, the order within one, the seed
    (None: the chunk's). ``precompute`` is accepted for Zephon's signature: the order is the
    same either way."""

    mode: MixtureReadMode = MixtureReadMode.WEIGHTED_ROUND_ROBIN
    seed: int | None = None
    precompute: bool = False
    within_component: ComponentOrder = ComponentOrder.AS_IS


def read_order(
    components: Mapping[str, Sequence[SampleId]], config: MixtureReadConfig, seed: int | None
) -> Iterator[SourcedSampleId]:
    """``(sample_id, component)`` of every sample of ``components``, once, in ``config``'s order."""
    names = [name for name, items in components.items() if len(items)]
    total = sum(len(components[n]) for n in names)
    lists: dict[str, list[SampleId]] = {}
    for position, name in enumerate(components):
        items = list(components[name])
        if config.within_component is ComponentOrder.SHUFFLE and items:
            rng = random.Random()
            if seed is not None:
                rng.seed((seed << 16) + position)
            rng.shuffle(items)
        lists[name] = items
    if len(names) == 1:
        yield from ((sid, names[0]) for sid in lists[names[0]])
        return
    if config.mode is MixtureReadMode.WEIGHTED_RANDOM:
        yield from _weighted_random(lists, names, total, seed)
    else:
        yield from _smooth_round_robin(lists, names, total)


def _shares(lists: Mapping[str, list[SampleId]], names: list[str], total: int) -> dict[str, float]:
    # Normalised twice, as Zephon does (the chunk's mixture, then the selector's), so that float
    # ties break exactly as there.
    mixture = {n: len(lists[n]) / total for n in names}
    norm = sum(mixture.values())
    return {n: w / norm for n, w in mixture.items()}


def _smooth_round_robin(lists: Mapping[str, list[SampleId]], names: list[str], total: int) -> Iterator[SourcedSampleId]:
    share = _shares(lists, names, total)
    emitted = dict.fromkeys(names, 0.0)
    taken = dict.fromkeys(names, 0)
    for step in range(total):
        scale = max(1.0, float(step))
        best = max(
            (n for n in names if taken[n] < len(lists[n])),
            key=lambda n: (share[n] * scale - emitted[n], -names.index(n)),
        )
        yield lists[best][taken[best]], best
        taken[best] += 1
        emitted[best] += 1.0


def _weighted_random(
    lists: Mapping[str, list[SampleId]], names: list[str], total: int, seed: int | None
) -> Iterator[SourcedSampleId]:
    active = list(names)
    weights = [len(lists[n]) / total for n in active]  # the chunk's mixture, as Zephon's reader weighs
    rng = random.Random(seed)
    taken = dict.fromkeys(names, 0)
    while active:
        i = rng.choices(range(len(active)), weights=weights, k=1)[0]
        name = active[i]
        if taken[name] < len(lists[name]):
            yield lists[name][taken[name]], name
            taken[name] += 1
        else:
            del active[i], weights[i]
