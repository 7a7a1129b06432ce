"""Mixture weights (`MixtureSpec`) and the smooth interleave of a chunk's components.

A mixture says in which proportion the components (datasets) of a stream are drawn. The work
source turns it into per-chunk quotas; :func:`interleave_order` then decides the read order
inside one chunk so that every prefix of the chunk is close to the chunk's composition.

Example:
    >>> spec = MixtureSpec({"web": 3, "code": 1})
    >>> spec.normalized_for(["web", "code"])
    {'web': 0.75, 'code': 0.25}
    >>> interleave_order([3, 1]).tolist()
    [0, 0, 1, 0]
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from zephon_columnar.errors import ConfigError


class MixtureSpec:
    """Relative weights of named components: ``{name: weight}``, weights finite and >= 0.

    Weights need not sum to 1: ``{"a": 1, "b": 3}`` is the same mixture as
    ``{"a": 0.25, "b": 0.75}``. A weight of 0 keeps a component in the recipe without ever
    drawing from it (Zephon 0.2.0 rejects 0; at least one weight must be positive in both).
    Errors are :class:`ConfigError` (a ``ValueError``) worded as Zephon's.

    Example:
        >>> spec = MixtureSpec({"a": 1, "b": 3})
        >>> spec.normalized, spec.normalized_for(["b", "a"])
        ({'a': 0.25, 'b': 0.75}, {'b': 0.75, 'a': 0.25})
        >>> MixtureSpec({"a": -1})
        Traceback (most recent call last):
        ...
        zephon_columnar.errors.ConfigError: MixtureSpec weight for component 'a' must be positive (or 0 to leave the component out), got -1.
    """  # noqa: E501 - a doctest's expected exception line is the message verbatim: it cannot wrap

    __slots__ = ("_normalized_cache", "_weights")

    def __init__(self, weights: Mapping[str, float]) -> None:
        if isinstance(weights, MixtureSpec):
            weights = weights.weights
        if not isinstance(weights, Mapping):
            raise ConfigError(
                f"MixtureSpec: weights must be a mapping {{component_name: weight}}, got {type(weights).__name__}."
            )
        if not weights:
            raise ConfigError("MixtureSpec must contain at least one component; pass {component_name: weight}.")
        clean: dict[str, float] = {}
        for name, w in weights.items():
            if not isinstance(name, str):
                raise ConfigError(f"MixtureSpec: component names must be str, got {name!r}.")
            # bool is an int subclass; a True weight is almost surely a mistake.
            if isinstance(w, bool) or not isinstance(w, numbers.Real):
                raise ConfigError(f"MixtureSpec weight for component {name!r} must be a number, got {w!r}.")
            value = float(w)
            if not math.isfinite(value):
                raise ConfigError(f"MixtureSpec weight for component {name!r} must be a finite number, got {w!r}.")
            if value < 0:
                raise ConfigError(
                    f"MixtureSpec weight for component {name!r} must be positive "
                    f"(or 0 to leave the component out), got {w!r}."
                )
            clean[name] = value
        if math.fsum(clean.values()) <= 0:
            first = next(iter(clean))
            raise ConfigError(
                f"MixtureSpec weight for component {first!r} must be positive: the weights {clean} "
                "sum to 0; give at least one component a positive weight."
            )
        self._weights = clean
        self._normalized_cache: dict[str, float] | None = None

    @property
    def weights(self) -> dict[str, float]:
        """The raw weights as given (a copy, as floats), in the order given."""
        return dict(self._weights)

    @property
    def normalized(self) -> dict[str, float]:
        """Weights divided by their sum, in the order given.

        Computed once: every access returns the same dict (as Zephon's cached property does),
        so treat it as read-only.

        Example:
            >>> spec = MixtureSpec({"beta": 2, "alpha": 2})
            >>> spec.normalized, spec.normalized is spec.normalized
            ({'beta': 0.5, 'alpha': 0.5}, True)
        """
        if self._normalized_cache is None:
            total = math.fsum(self._weights.values())
            self._normalized_cache = {n: w / total for n, w in self._weights.items()}
        return self._normalized_cache

    def validate_for(self, components: Iterable[str]) -> None:
        """Raise :class:`ConfigError` unless the weights name exactly ``components``.

        Example:
            >>> MixtureSpec({"a": 1}).validate_for(["a", "b"])
            Traceback (most recent call last):
            ...
            zephon_columnar.errors.ConfigError: MixtureSpec missing weights for components: b. The spec names ['a'] but the components are ['a', 'b']; give every component a weight (0 to leave it out).
        """  # noqa: E501 - a doctest's expected exception line is the message verbatim: it cannot wrap
        comps = list(components)
        known = set(comps)
        missing = [n for n in comps if n not in self._weights]
        unknown = [n for n in self._weights if n not in known]
        if not unknown and not missing:
            return
        parts = []
        if missing:
            parts.append("MixtureSpec missing weights for components: " + ", ".join(missing) + ".")
        if unknown:
            parts.append("MixtureSpec contains unknown components: " + ", ".join(unknown) + ".")
        raise ConfigError(
            " ".join(parts) + f" The spec names {list(self._weights)} but the components are {comps}; "
            "give every component a weight (0 to leave it out)."
        )

    def normalized_for(self, components: Iterable[str]) -> dict[str, float]:
        """The :attr:`normalized` weights of ``components``, keyed in their order.

        As in Zephon, ``components`` may be a subset of the spec (the shares are still those
        of the whole spec); a component without a weight raises :class:`ConfigError`. Use
        :meth:`validate_for` to require exactly the spec's names.

        Example:
            >>> MixtureSpec({"a": 1, "b": 3}).normalized_for(["b"])
            {'b': 0.75}
            >>> MixtureSpec({"a": 1}).normalized_for(["a", "b"])
            Traceback (most recent call last):
            ...
            zephon_columnar.errors.ConfigError: MixtureSpec missing weights for components: b. The spec names ['a']; give every component a weight (0 to leave it out).
        """  # noqa: E501 - a doctest's expected exception line is the message verbatim: it cannot wrap
        comps = list(components)
        normalized = self.normalized
        missing = [n for n in comps if n not in normalized]
        if missing:
            raise ConfigError(
                "MixtureSpec missing weights for components: "
                + ", ".join(missing)
                + f". The spec names {list(self._weights)}; give every component a weight "
                "(0 to leave it out)."
            )
        return {n: normalized[n] for n in comps}

    def __eq__(self, other: object) -> bool:
        # Same mixture = same normalized weights, whatever the scale or order they were given in.
        if not isinstance(other, MixtureSpec):
            return NotImplemented
        return self.normalized == other.normalized

    def __hash__(self) -> int:
        return hash(frozenset(self.normalized.items()))

    def __repr__(self) -> str:
        return f"MixtureSpec({self._weights!r})"


def _interleave_permutation(counts: npt.NDArray[np.int64]) -> npt.NDArray[np.intp]:
    """Permutation of the concatenated components (component 0's samples, then 1's, ...) into
    read order. The i-th sample of component k gets key (i + 0.5) / counts[k]: each component
    is spread evenly over the chunk, starting half a step in, so that small components are
    not all pushed to the front."""
    total = int(counts.sum())
    comp = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    starts = np.cumsum(counts) - counts
    i = np.arange(total, dtype=np.int64) - starts[comp]
    # (2i+1) / (2c) with both operands exact in float64: equal fractions round to the same float,
    # so mathematically tied keys tie exactly and the secondary key (component) decides.
    keys = (2 * i + 1).astype(np.float64) / (2 * counts[comp]).astype(np.float64)
    # The input is grouped by component in ascending order, so a stable sort on the key alone
    # sends ties to the lower component; within a component keys increase, so order is kept.
    return np.argsort(keys, kind="stable")


def interleave_order(counts: Sequence[int] | np.ndarray) -> npt.NDArray[np.int64]:
    """Component index of each read position when a chunk holds ``counts[k]`` samples of k.

    Positions are ordered by the key ``(i + 0.5) / counts[k]`` of the i-th sample of component
    ``k`` (stable; ties go to the lower component index). Every prefix of the result is within
    about ``len(counts)`` samples of the chunk's composition, and each component keeps its own
    order. Vectorized: O(n log n) in numpy, no per-sample Python loop.

    Example:
        >>> interleave_order([2, 4]).tolist()
        [1, 0, 1, 1, 0, 1]
        >>> interleave_order([0, 2]).tolist()
        [1, 1]
    """
    c = np.asarray(counts, dtype=np.int64).reshape(-1)
    if (c < 0).any():
        raise ConfigError(f"interleave_order: counts must be >= 0, got {c.tolist()}.")
    order: npt.NDArray[np.int64] = np.repeat(np.arange(len(c), dtype=np.int64), c)[_interleave_permutation(c)]
    return order
