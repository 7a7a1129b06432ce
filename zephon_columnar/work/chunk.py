"""`WorkChunk`: one unit of work, a set of sample pointers grouped by mixture component.

A pointer (sample id) is ``(dataset_id, shard_id, row)``. A chunk keeps, for each component, an
int64 array of shape ``(n, 3)`` in that component's draw order (:attr:`WorkChunk.component_arrays`,
what the engine reads); :attr:`WorkChunk.components` is Zephon's view of the same pointers,
``{name: [(dataset_id, shard_id, row), ...]}``. :meth:`WorkChunk.ordered` interleaves the
components smoothly (see :func:`~zephon_columnar.work.mixture.interleave_order`) into the order
the engine reads them in; iterating a chunk yields that order as ``(sample_id, component)``.

The state (:meth:`WorkChunk.state_dict`) follows Zephon 0.2.0's versioned chunk schema
(version 3); :meth:`WorkChunk.from_state` also restores versions 1 and 2.

Example:
    >>> c = WorkChunk({"web": [(0, 0, 5), (0, 0, 6)], "code": [(1, 0, 9)]})
    >>> len(c), c.mixture
    (3, {'web': 0.6666666666666666, 'code': 0.3333333333333333})
    >>> list(c)
    [((0, 0, 5), 'web'), ((1, 0, 9), 'code'), ((0, 0, 6), 'web')]
    >>> c.components["code"]
    [(1, 0, 9)]
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from zephon_columnar.errors import CheckpointError, ConfigError
from zephon_columnar.work.mixture import MixtureSpec, _interleave_permutation

if TYPE_CHECKING:
    from zephon_columnar.work.read_order import MixtureReadConfig

SampleId = tuple[int, int, int]

#: Version of :meth:`WorkChunk.state_dict` (Zephon 0.2.0's ``WORK_CHUNK_VERSION``). Version 2
#: added ``target_mixture``, version 3 ``source_exhausted``; older states restore with None / ().
WORK_CHUNK_VERSION = 3

# Keys every state of a version holds (absence is corruption, not an older layout).
_REQUIRED_KEYS = {
    1: ("components", "component_order"),
    2: ("components", "component_order", "target_mixture"),
    3: ("components", "component_order", "target_mixture", "source_exhausted"),
}


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


def _check_exhausted(names: Any) -> tuple[str, ...]:
    """``source_exhausted`` validated (tuple or list of unique non-empty str) and sorted."""
    if (
        not isinstance(names, (tuple, list))
        or any(not isinstance(n, str) or not n for n in names)
        or len(set(names)) != len(names)
    ):
        raise ConfigError(
            f"WorkChunk: source_exhausted must be a tuple or list of unique non-empty component "
            f"names, got {names!r}; pass e.g. ('web',), or () when no component has run out."
        )
    return tuple(sorted(names))


def _check_target(target: Any) -> dict[str, float] | None:
    """``target_mixture`` validated and normalised to shares (None stays None)."""
    if target is None:
        return None
    try:
        return dict(MixtureSpec(target).normalized)
    except ConfigError as err:
        raise ConfigError(
            f"WorkChunk: target_mixture {target!r} is invalid: {err} Pass None when the source has no target."
        ) from err


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _pointers_from_state(name: str, items: Sequence[Any]) -> np.ndarray:
    """The sample ids ``[[d, s, r], ...]`` of component ``name`` in a state as an int64 array;
    :class:`CheckpointError` ("Bad SampleId ...") naming the first one that is not three ints."""
    if not items:
        return np.empty((0, 3), dtype=np.int64)
    try:
        arr = np.array(items)
    except (ValueError, TypeError, OverflowError):
        arr = None
    if arr is not None and arr.dtype.kind == "i" and arr.ndim == 2 and arr.shape[1] == 3:
        return arr.astype(np.int64, copy=False)
    for sid in items:  # slow path only to name the culprit
        if (
            not isinstance(sid, (list, tuple))
            or len(sid) != 3
            or not all(_is_int(v) and -(2**63) <= v < 2**63 for v in sid)
        ):
            raise CheckpointError(
                f"Bad SampleId for component {name}: {sid!r}; a sample id is [dataset_id, shard_id, "
                "row], three int64s. The chunk state is corrupt."
            )
    return np.array(items, dtype=np.int64).reshape(-1, 3)


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
            Normalised to shares here; at least one weight must be positive, none negative.
        source_exhausted: components whose last sample was in this or an earlier chunk: a
            tuple or list of unique non-empty names, kept sorted.
        global_index: position of the chunk in the source's global chunk stream (-1: none).

    Raises:
        ConfigError: (a ``ValueError``) for pointers of the wrong shape, an invalid
            ``target_mixture`` or ``source_exhausted``.

    Example:
        >>> c = WorkChunk({"a": np.array([[0, 0, 0], [0, 0, 1]]), "b": []},
        ...               target_mixture={"a": 3, "b": 1}, source_exhausted=["b"])
        >>> ptrs, comp = c.ordered()
        >>> ptrs.tolist(), comp.tolist(), c.component_names
        ([[0, 0, 0], [0, 0, 1]], [0, 0], ('a', 'b'))
        >>> c.components, c.target_mixture, c.source_exhausted
        ({'a': [(0, 0, 0), (0, 0, 1)], 'b': []}, {'a': 0.75, 'b': 0.25}, ('b',))
    """

    __slots__ = ("_components", "_ordered", "global_index", "seed", "source_exhausted", "target_mixture")

    def __init__(
        self,
        components: Mapping[str, Any],
        seed: int | None = None,
        target_mixture: Mapping[str, float] | None = None,
        source_exhausted: Sequence[str] = (),
        global_index: int = -1,
    ) -> None:
        self._set_components(components)
        self.seed = seed
        self.target_mixture: dict[str, float] | None = _check_target(target_mixture)
        self.source_exhausted: tuple[str, ...] = _check_exhausted(source_exhausted)
        if not _is_int(global_index) or global_index < -1:
            raise ConfigError(f"WorkChunk: global_index must be an int >= 0, or -1 when unknown; got {global_index!r}.")
        self.global_index = int(global_index)

    def _set_components(self, components: Mapping[str, Any]) -> None:
        if not isinstance(components, Mapping):
            raise ConfigError(
                f"WorkChunk: components must be a mapping {{name: pointers}}, got {type(components).__name__}."
            )
        self._components: dict[str, np.ndarray] = {
            str(name): _as_pointers(str(name), ptrs) for name, ptrs in components.items()
        }
        self._ordered: tuple[np.ndarray, np.ndarray] | None = None

    # ---------------------------------------------------------------- composition
    @property
    def components(self) -> dict[str, list[SampleId]]:
        """Zephon's view: ``{name: [(dataset_id, shard_id, row), ...]}`` in each component's order.

        Built from the arrays on every access (a new dict of new lists, O(samples)); the
        engine and hot paths use :attr:`component_arrays`. Assigning a new mapping replaces
        the chunk's pointers (validated as in the constructor).
        """
        return {n: list(map(tuple, a.tolist())) for n, a in self._components.items()}

    @components.setter
    def components(self, components: Mapping[str, Any]) -> None:
        self._set_components(components)

    @property
    def component_arrays(self) -> dict[str, np.ndarray]:
        """``{name: (n, 3) int64 pointers}`` in each component's own order (a new dict, the
        arrays themselves are not copied)."""
        return dict(self._components)

    @property
    def component_names(self) -> tuple[str, ...]:
        """All component names, empty ones included, in insertion order."""
        return tuple(self._components)

    def __len__(self) -> int:
        return sum(len(a) for a in self._components.values())

    @property
    def mixture(self) -> dict[str, float]:
        """Actual composition: sample share of each non-empty component (sums to 1; {} when empty)."""
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

    def __iter__(self) -> Iterator[tuple[SampleId, str]]:
        """``iter_samples()``: every ``(sample_id, component)`` in the engine's read order."""
        return self.iter_samples()

    def iter_samples(self, config: MixtureReadConfig | None = None) -> Iterator[tuple[SampleId, str]]:
        """Yield ``((dataset_id, shard_id, row), component_name)`` (Python ints).

        Without ``config``: the engine's read order (the row view of :meth:`ordered`). With a
        `~zephon_columnar.work.read_order.MixtureReadConfig`: the order Zephon's reader takes
        under that config (smooth weighted round robin or weighted random between components,
        each component as is or shuffled; ``config.seed`` defaults to the chunk's).
        """
        if config is not None:
            from zephon_columnar.work.read_order import read_order

            seed = config.seed if config.seed is not None else self.seed
            yield from read_order(self.components, config, seed)
            return
        ptrs, comp = self.ordered()
        names = self.component_names
        for (d, s, i), k in zip(ptrs.tolist(), comp.tolist()):
            yield (d, s, i), names[k]

    def materialize_order(self, config: MixtureReadConfig) -> list[tuple[SampleId, str]]:
        """``list(iter_samples(config))``."""
        return list(self.iter_samples(config))

    def sample_at(self, index: int, config: MixtureReadConfig | None = None) -> tuple[SampleId, str]:
        """The ``index``-th sample of :meth:`iter_samples`."""
        return list(self.iter_samples(config))[index]

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """JSON-friendly state in Zephon's chunk schema, version :data:`WORK_CHUNK_VERSION`.

        ``{"version": 3, "seed", "components": [(name, [[d, s, r], ...]), ...],
        "component_order": [name, ...], "total_samples", "target_mixture",
        "source_exhausted": sorted names}``, plus ``"global_index"`` when the chunk has one.

        Example:
            >>> WorkChunk({"a": [(0, 0, 7)]}, seed=1).state_dict()  # doctest: +NORMALIZE_WHITESPACE
            {'version': 3, 'seed': 1, 'components': [('a', [[0, 0, 7]])], 'component_order': ['a'],
             'total_samples': 1, 'target_mixture': None, 'source_exhausted': []}
        """
        state: dict[str, Any] = {
            "version": WORK_CHUNK_VERSION,
            "seed": None if self.seed is None else int(self.seed),
            "components": [(n, a.tolist()) for n, a in self._components.items()],
            "component_order": list(self._components),
            "total_samples": len(self),
            "target_mixture": (
                None if self.target_mixture is None else {k: float(v) for k, v in self.target_mixture.items()}
            ),
            "source_exhausted": sorted(self.source_exhausted),
        }
        if self.global_index >= 0:
            state["global_index"] = self.global_index
        return state

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> WorkChunk:
        """Rebuild a chunk from :meth:`state_dict` output (also after a JSON round trip).

        Restores versions 1 to 3 of Zephon's chunk schema (a state without ``"version"`` is
        version 1); older versions restore with ``target_mixture`` None (v1) and no
        ``source_exhausted`` (v1, v2). ``component_order``, when given, sets the order of the
        components. Raises :class:`CheckpointError` (a ``ValueError``) naming every problem.

        Example:
            >>> c = WorkChunk.from_state({"version": 1, "components": [["a", [[0, 0, 1]]]],
            ...                           "component_order": ["a"], "total_samples": 1})
            >>> list(c), c.target_mixture, c.source_exhausted
            ([((0, 0, 1), 'a')], None, ())
        """
        where = "WorkChunk.from_state"
        if not isinstance(state, Mapping):
            raise CheckpointError(f"{where}: a chunk state is a dict, got {type(state).__name__}.")
        version = state.get("version", 1)
        if not _is_int(version) or not 1 <= version <= WORK_CHUNK_VERSION:
            newer = _is_int(version) and version > WORK_CHUNK_VERSION
            raise CheckpointError(
                f"{where}: chunk state version {version!r} is "
                + (
                    f"newer than the supported version {WORK_CHUNK_VERSION}; upgrade to load it."
                    if newer
                    else f"not a version this reader knows (1 to {WORK_CHUNK_VERSION})."
                )
            )
        errors = [
            f"{key}: missing (a version-{version} chunk state always has it)"
            for key in _REQUIRED_KEYS[version]
            if key not in state
        ]
        if errors:
            cls._fail(version, errors)
        comps = cls._components_from_state(state["components"], errors)
        names = list(comps)
        order = state["component_order"]
        if not isinstance(order, (list, tuple)) or any(not isinstance(n, str) for n in order):
            errors.append(f"component_order: must be a list of component names, got {order!r}")
        elif order and list(order) != names:
            if sorted(order) != sorted(names) or len(set(order)) != len(order):
                errors.append(f"component_order: {list(order)} does not name the components {names}")
            else:
                comps = {n: comps[n] for n in order}
        seed = state.get("seed")
        if seed is not None and not _is_int(seed):
            errors.append(f"seed: must be an int or None, got {seed!r}")
        total = state.get("total_samples")
        if total is not None and not _is_int(total):
            errors.append(f"total_samples: must be an int or None, got {total!r}")
        target = state["target_mixture"] if version >= 2 else None
        exhausted: Any = state["source_exhausted"] if version >= 3 else []
        if not isinstance(exhausted, (list, tuple)) or any(not isinstance(n, str) or not n for n in exhausted):
            errors.append(f"source_exhausted: must be a list of non-empty component names, got {exhausted!r}")
        elif len(set(exhausted)) != len(exhausted):
            errors.append(f"source_exhausted: names a component twice: {list(exhausted)}")
        elif list(exhausted) != sorted(exhausted):
            errors.append(f"source_exhausted: must be sorted, got {list(exhausted)}")
        global_index = state.get("global_index", -1)
        if errors:
            cls._fail(version, errors)
        try:
            chunk = cls(
                comps,
                seed=None if seed is None else int(seed),
                target_mixture=target,
                source_exhausted=tuple(exhausted),
                global_index=global_index,
            )
        except ConfigError as err:
            cls._fail(version, [str(err)])
        if total is not None and total != len(chunk):
            raise CheckpointError(
                f"WorkChunk total_samples mismatch: payload={total}, computed={len(chunk)}; the "
                "chunk state is corrupt (its components do not hold the samples it counted)."
            )
        return chunk

    @staticmethod
    def _components_from_state(raw: Any, errors: list[str]) -> dict[str, np.ndarray]:
        """``components`` of a state (``[(name, [[d, s, r], ...]), ...]``) as arrays; appends
        to ``errors`` what is wrong; raises :class:`CheckpointError` for a bad sample id."""
        comps: dict[str, np.ndarray] = {}
        if not isinstance(raw, (list, tuple)):
            errors.append(f"components: must be a list of [name, sample ids] pairs, got {type(raw).__name__}")
            return comps
        for entry in raw:
            if not isinstance(entry, (list, tuple)) or len(entry) != 2 or not isinstance(entry[0], str):
                errors.append(f"components: {entry!r} is not a [name, sample ids] pair")
                continue
            name, items = entry
            if name in comps:
                errors.append(f"components: {name!r} appears twice")
                continue
            if not isinstance(items, (list, tuple)):
                errors.append(f"components: the sample ids of {name!r} must be a list, got {type(items).__name__}")
                continue
            comps[name] = _pointers_from_state(name, items)
        return comps

    @staticmethod
    def _fail(version: int, errors: list[str]) -> NoReturn:
        raise CheckpointError(
            f"WorkChunk state (version {version}) is malformed:\n  - "
            + "\n  - ".join(errors)
            + "\nThe checkpoint is corrupt or was not written by WorkChunk.state_dict()."
        )

    # ---------------------------------------------------------------- misc
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WorkChunk):
            return NotImplemented
        return (
            self.component_names == other.component_names
            and all(np.array_equal(a, other._components[n]) for n, a in self._components.items())  # noqa: SLF001
            and (self.seed, self.target_mixture, tuple(sorted(self.source_exhausted)), self.global_index)
            == (other.seed, other.target_mixture, tuple(sorted(other.source_exhausted)), other.global_index)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable arrays inside: not hashable

    def __repr__(self) -> str:
        comp = ", ".join(f"{n}={len(a)}" for n, a in self._components.items())
        return f"WorkChunk(global_index={self.global_index}, n={len(self)}, {comp})"
