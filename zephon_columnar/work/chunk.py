"""`WorkChunk`: one unit of work, a set of sample pointers grouped by mixture component.

A pointer is ``(dataset_id, shard_id, row)``. A chunk keeps, for each component, an int64
array of shape ``(n, 3)`` in that component's draw order; :meth:`WorkChunk.ordered` interleaves
the components smoothly (see :func:`~zephon_columnar.work.mixture.interleave_order`) into the
order the engine reads them in.

Example:
    >>> c = WorkChunk({"web": [(0, 0, 5), (0, 0, 6)], "code": [(1, 0, 9)]})
    >>> len(c), c.mixture
    (3, {'web': 0.6666666666666666, 'code': 0.3333333333333333})
    >>> [(sid, name) for sid, name in c.iter_samples()]
    [((0, 0, 5), 'web'), ((1, 0, 9), 'code'), ((0, 0, 6), 'web')]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping

import numpy as np

from zephon_columnar.errors import CheckpointError, ConfigError
from zephon_columnar.work.mixture import _interleave_permutation

if TYPE_CHECKING:
    from zephon_columnar.work.read_order import MixtureReadConfig

SampleId = tuple[int, int, int]

_STATE_VERSION = 1


def _as_pointers(name: str, value: Any) -> np.ndarray:
    """``value`` as an int64 ``(n, 3)`` array (no copy when it already is one)."""
    arr = np.asarray(value, dtype=np.int64)
    if arr.size == 0:
        return np.empty((0, 3), dtype=np.int64)
    if arr.ndim != 2 or arr.shape[1] != 3:
        raise ConfigError(
            f"WorkChunk component {name!r}: pointers must have shape (n, 3) "
            f"[dataset_id, shard_id, row], got shape {arr.shape}."
        )
    return arr


class WorkChunk:
    """Sample pointers of one chunk, grouped by component, plus what the source knew.

    Args:
        components: ``{component_name: pointers}``; pointers are an int64 array of shape
            ``(n, 3)`` (``[dataset_id, shard_id, row]``) or anything numpy converts to one,
            e.g. a list of tuples. Arrays are used as given, not copied. Insertion order is the
            component index used by :meth:`ordered` and breaks ties in the interleave.
        seed: the seed of the source that made the chunk (None when unknown).
        target_mixture: the weights the source aimed for (may differ from :attr:`mixture`,
            the actual composition, for a chunk that holds few samples of a rare component).
        source_exhausted: components that will never appear again after this chunk.
        global_index: position of the chunk in the source's global chunk stream (-1: none).

    Example:
        >>> c = WorkChunk({"a": np.array([[0, 0, 0], [0, 0, 1]]), "b": []})
        >>> ptrs, comp = c.ordered()
        >>> ptrs.tolist(), comp.tolist(), c.component_names
        ([[0, 0, 0], [0, 0, 1]], [0, 0], ('a', 'b'))
    """

    __slots__ = ("_components", "seed", "target_mixture", "source_exhausted", "global_index", "_ordered")

    def __init__(
        self,
        components: Mapping[str, Any],
        seed: int | None = None,
        target_mixture: Mapping[str, float] | None = None,
        source_exhausted: Iterable[str] = (),
        global_index: int = -1,
    ) -> None:
        if not isinstance(components, Mapping):
            raise ConfigError(
                f"WorkChunk: components must be a mapping {{name: pointers}}, got {type(components).__name__}."
            )
        self._components: dict[str, np.ndarray] = {
            str(name): _as_pointers(str(name), ptrs) for name, ptrs in components.items()
        }
        self.seed = seed
        self.target_mixture = dict(target_mixture) if target_mixture is not None else None
        self.source_exhausted = tuple(source_exhausted)
        self.global_index = int(global_index)
        self._ordered: tuple[np.ndarray, np.ndarray] | None = None

    # ---------------------------------------------------------------- composition
    @property
    def components(self) -> dict[str, np.ndarray]:
        """``{name: (n, 3) int64 pointers}`` in each component's own order (a new dict)."""
        return dict(self._components)

    @property
    def component_names(self) -> tuple[str, ...]:
        """All component names, empty ones included, in insertion order."""
        return tuple(self._components)

    def __len__(self) -> int:
        return sum(len(a) for a in self._components.values())

    @property
    def mixture(self) -> dict[str, float]:
        """Actual composition: sample share of each non-empty component (sums to 1)."""
        total = len(self)
        return {n: len(a) / total for n, a in self._components.items() if len(a)}

    # ---------------------------------------------------------------- read order
    def ordered(self) -> tuple[np.ndarray, np.ndarray]:
        """Pointers in read order and the component index of each.

        Returns ``(pointers, component)``: an int64 ``(n, 3)`` array and an int32 ``(n,)`` array
        holding each pointer's position in :attr:`component_names`. Components are interleaved
        smoothly; each keeps its own order. Computed once; the arrays are read-only.
        """
        if self._ordered is None:
            arrays = list(self._components.values())
            counts = np.array([len(a) for a in arrays], dtype=np.int64)
            # concatenate copies, so freezing the result never touches the caller's arrays
            flat = np.concatenate(arrays) if arrays else np.empty((0, 3), dtype=np.int64)
            comp = np.repeat(np.arange(len(arrays), dtype=np.int32), counts)
            if np.count_nonzero(counts) > 1:
                perm = _interleave_permutation(counts)
                flat, comp = flat[perm], comp[perm]
            flat.setflags(write=False)
            comp.setflags(write=False)
            self._ordered = (flat, comp)
        return self._ordered

    def iter_samples(self, config: "MixtureReadConfig | None" = None) -> Iterator[tuple[SampleId, str]]:
        """Yield ``((dataset_id, shard_id, row), component_name)`` (Python ints).

        Without ``config``: the engine's read order (the row view of :meth:`ordered`). With a
        `~zephon_columnar.work.read_order.MixtureReadConfig`: the order Zephon's reader takes
        under that config (smooth weighted round robin or weighted random between components,
        each component as is or shuffled; ``config.seed`` defaults to the chunk's).
        """
        if config is not None:
            from zephon_columnar.work.read_order import read_order

            seed = config.seed if config.seed is not None else self.seed
            lists = {name: [tuple(p) for p in arr.tolist()] for name, arr in self._components.items()}
            yield from read_order(lists, config, seed)  # type: ignore[misc]
            return
        ptrs, comp = self.ordered()
        names = self.component_names
        for (d, s, i), k in zip(ptrs.tolist(), comp.tolist()):
            yield (d, s, i), names[k]

    def materialize_order(self, config: "MixtureReadConfig") -> list[tuple[SampleId, str]]:
        """``list(iter_samples(config))``."""
        return list(self.iter_samples(config))

    def sample_at(self, index: int, config: "MixtureReadConfig | None" = None) -> tuple[SampleId, str]:
        """The ``index``-th sample of :meth:`iter_samples`."""
        return list(self.iter_samples(config))[index]

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """JSON-friendly state: ``{"components": {name: [[d, s, i], ...]}, ...}``."""
        return {
            "version": _STATE_VERSION,
            "components": {n: a.tolist() for n, a in self._components.items()},
            "seed": self.seed,
            "target_mixture": self.target_mixture,
            "source_exhausted": list(self.source_exhausted),
            "global_index": self.global_index,
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> "WorkChunk":
        """Rebuild a chunk from :meth:`state_dict` output (also after a JSON round trip)."""
        try:
            version = state["version"]
            if version != _STATE_VERSION:
                raise CheckpointError(
                    f"WorkChunk state version {version!r} is not supported (expected {_STATE_VERSION})."
                )
            return cls(
                state["components"],
                seed=state.get("seed"),
                target_mixture=state.get("target_mixture"),
                source_exhausted=state.get("source_exhausted", ()),
                global_index=state.get("global_index", -1),
            )
        except (KeyError, TypeError, ConfigError) as err:
            raise CheckpointError(f"WorkChunk state is malformed: {err!r}.") from err

    # ---------------------------------------------------------------- misc
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WorkChunk):
            return NotImplemented
        return (
            self.component_names == other.component_names
            and all(np.array_equal(a, other._components[n]) for n, a in self._components.items())
            and (self.seed, self.target_mixture, self.source_exhausted, self.global_index)
            == (other.seed, other.target_mixture, other.source_exhausted, other.global_index)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable arrays inside: not hashable

    def __repr__(self) -> str:
        comp = ", ".join(f"{n}={len(a)}" for n, a in self._components.items())
        return f"WorkChunk(global_index={self.global_index}, n={len(self)}, {comp})"
