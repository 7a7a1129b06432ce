"""`WorkSource`: the contract of everything that decides what to train on.

A work source hands out :class:`~zephon_columnar.work.chunk.WorkChunk` s of sample pointers, one
lane at a time, and can save and restore its position with a small JSON-friendly dict. It never
reads data: it only knows datasets' names and row counts.

Example:
    >>> class Fixed(WorkSource):
    ...     def __init__(self, ds): self._ds, self._done = ds, False
    ...     def next_chunk(self):
    ...         if self._done: return None
    ...         self._done = True
    ...         return WorkChunk({self._ds.name: [(0, 0, i) for i in range(len(self._ds))]})
    ...     def state_dict(self): return {"done": self._done}
    ...     def load_state_dict(self, state): self._done = state["done"]
    ...     def component_ids(self): return {self._ds.name: 0}
    ...     @property
    ...     def datasets_by_id(self): return {0: self._ds}
"""

from __future__ import annotations

import copy
import math
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Mapping

from zephon_columnar.errors import ConfigError
from zephon_columnar.work.chunk import WorkChunk
from zephon_columnar.work.read_order import (ComponentOrder, MixtureComponent, MixtureReadConfig, MixtureReadMode,
                                             SamplesPerComponent, SourcedSampleId)

if TYPE_CHECKING:  # the work layer only reads names and row counts; no io import at runtime
    from zephon_columnar.io.dataset import Dataset
    from zephon_columnar.work.positions import SamplePositions


def check_lane(lane_id: int, canonical_replicas: int) -> None:
    """Raise :class:`ConfigError` unless ``0 <= lane_id < canonical_replicas``."""
    for name, v in (("lane_id", lane_id), ("canonical_replicas", canonical_replicas)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(f"clone_for_lane: {name} must be an int, got {v!r}.")
    if canonical_replicas < 1:
        raise ConfigError(f"clone_for_lane: canonical_replicas must be >= 1, got {canonical_replicas}.")
    if not 0 <= lane_id < canonical_replicas:
        raise ConfigError(
            f"clone_for_lane: lane_id must be in [0, {canonical_replicas}), got {lane_id}."
        )


class WorkSource(ABC):
    """Produces the chunks of one lane, deterministically, and can checkpoint its position.

    Subclasses implement :meth:`next_chunk`, :meth:`state_dict`, :meth:`load_state_dict`,
    :meth:`component_ids` and :attr:`datasets_by_id`. The other members have defaults that a
    bounded or lane-aware source overrides.

    Contract:
        - ``next_chunk()`` returns the next chunk of this lane, or None once the lane is done
          (and None on every later call).
        - ``load_state_dict(s.state_dict())`` on a source built with the same arguments makes
          it continue exactly where ``s`` was; the state stays small however far it went.
        - ``component_ids()`` is fixed for the life of the source and covers every component
          it will ever emit.
    """

    @abstractmethod
    def next_chunk(self) -> WorkChunk | None:
        """The next chunk of this lane, or None when the lane is done."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Small JSON-serializable position; must not grow with the samples consumed."""

    @abstractmethod
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (a :meth:`state_dict` result, possibly JSON round-tripped)."""

    @abstractmethod
    def component_ids(self) -> dict[str, int]:
        """``{component_name: dataset_id}`` of every component this source may emit."""

    @property
    @abstractmethod
    def datasets_by_id(self) -> dict[int, "Dataset"]:
        """``{dataset_id: Dataset}``; pointers' first column indexes this."""

    # ---------------------------------------------------------------- defaults
    def clone_for_lane(self, lane_id: int, canonical_replicas: int) -> "WorkSource":
        """A source that yields only lane ``lane_id``'s chunks out of ``canonical_replicas``.

        The default is a deep copy, which is only correct for a single lane: a generic source
        does not know how to split its stream, so ``canonical_replicas > 1`` raises
        :class:`ConfigError`. Sources that can split (e.g. ``StaticMixtureWorkSource``) override
        this.
        """
        check_lane(lane_id, canonical_replicas)
        if canonical_replicas > 1:
            raise ConfigError(
                f"{type(self).__name__} cannot be split into {canonical_replicas} lanes: it does not "
                "override clone_for_lane. Use canonical_replicas=1, or implement clone_for_lane so "
                "that each lane yields a disjoint part of the stream."
            )
        return copy.deepcopy(self)

    @property
    def total_samples(self) -> float:
        """Pointers left from the current position to the end; ``inf`` when unbounded/unknown."""
        return math.inf

    def __len__(self) -> int:
        total = self.total_samples
        if math.isinf(total):
            raise TypeError(
                f"{type(self).__name__} is unbounded (or its size is unknown), so it has no len(); "
                "use total_samples, which is inf here."
            )
        return int(total)

    def rows_per_pass(self) -> int | None:
        """Rows (of every lane together) after which every dataset has been read at least once
        from any position: what the engine counts as a whole pass when it checks that rows come
        through at all (None: unknown). The default, the datasets' rows summed, fits a source
        that reads each dataset in turn; a weighted mixture overrides it."""
        try:
            return sum(len(ds) for ds in self.datasets_by_id.values())
        except TypeError:  # a dataset without a length
            return None

    def chunk_size_hint(self) -> int | None:
        """Typical number of pointers per chunk, or None when unknown."""
        return None

    def recipe(self) -> dict[str, Any]:
        """JSON-friendly identity of the data order: two sources with equal recipes (and equal
        positions) produce the same chunks. The default only names the class."""
        cls = type(self)
        return {"class": f"{cls.__module__}.{cls.__qualname__}"}

    def continues_after_exhaustion(self) -> frozenset[str]:
        """Components that restart (instead of ending) when their data runs out."""
        return frozenset()

    def supports_indexing(self) -> bool:
        """Whether the source's samples have positions (`positions`); False by default."""
        return False

    def positions(self) -> "SamplePositions":
        """The stream as a random-access array of pointers, for map-style datasets."""
        raise ConfigError(f"{type(self).__name__} has no sample positions (supports_indexing() is False); "
                          "iterate it with to_torch_dataset(), or implement supports_indexing() and positions().")

    @property
    def requires_token_priming(self) -> bool:
        """Whether ``prime`` must run before the first chunk (token-unit mixtures)."""
        return False

    def prime(self, counts: Any = None, **kwargs: Any) -> None:
        """Prepare a token-unit mixture (`StaticMixtureWorkSource.prime`); nothing by default."""


__all__ = ["ComponentOrder", "MixtureComponent", "MixtureReadConfig", "MixtureReadMode", "SamplesPerComponent",
           "SourcedSampleId", "WorkChunk", "WorkSource"]
