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
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from zephon_columnar.errors import CheckpointError, ConfigError, ConfigurationWarning, warn
from zephon_columnar.work.chunk import WorkChunk
from zephon_columnar.work.read_order import (
    ComponentOrder,
    MixtureComponent,
    MixtureReadConfig,
    MixtureReadMode,
    SamplesPerComponent,
    SourcedSampleId,
)

if TYPE_CHECKING:  # the work layer only reads names and row counts; no io import at runtime
    from zephon_columnar.io.dataset import Dataset
    from zephon_columnar.work.positions import SamplePositions


_INDEX_CHUNK = 1024  # samples per chunk of the default positions()


def check_lane(lane_id: int, canonical_replicas: int) -> None:
    """Raise :class:`ConfigError` unless ``0 <= lane_id < canonical_replicas``."""
    for name, v in (("lane_id", lane_id), ("canonical_replicas", canonical_replicas)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(f"clone_for_lane: {name} must be an int, got {v!r}.")
    if canonical_replicas < 1:
        raise ConfigError(f"clone_for_lane: canonical_replicas must be >= 1, got {canonical_replicas}.")
    if not 0 <= lane_id < canonical_replicas:
        raise ConfigError(f"clone_for_lane: lane_id must be in [0, {canonical_replicas}), got {lane_id}.")


class WorkSource:
    """Produces the chunks of one lane, deterministically, and can checkpoint its position.

    Subclasses implement :meth:`next_chunk`, :meth:`component_ids` and :attr:`datasets_by_id`
    (the base raises ``NotImplementedError`` for them, as Zephon's does), and extend
    :meth:`state_dict` / :meth:`load_state_dict` with their position. The other members have
    defaults that a bounded or lane-aware source overrides.

    Contract:
        - ``next_chunk()`` returns the next chunk of this lane, or None once the lane is done
          (and None on every later call).
        - ``load_state_dict(s.state_dict())`` on a source built with the same arguments makes
          it continue exactly where ``s`` was; the state stays small however far it went.
        - ``component_ids()`` is fixed for the life of the source and covers every component
          it will ever emit.
    """

    # The lane a clone serves (Zephon's base-class fields: a subclass's ``next_chunk`` may read
    # ``self._lane``); None on the instance the user built, which never yields chunks itself.
    _lane: int | None = None
    _canon: int | None = None
    _cloned: bool = False

    def __init__(self) -> None:
        self._lane, self._canon, self._cloned = None, None, False

    def next_chunk(self) -> WorkChunk | None:
        """The next chunk of this lane, or None when the lane is done. Every source implements it."""
        raise NotImplementedError(f"{type(self).__name__} must implement next_chunk().")

    def state_dict(self) -> dict[str, Any]:
        """Small JSON-serializable position; must not grow with the samples consumed.

        The base state (Zephon's) is only the lane identity: a source with a position extends it
        (``{**super().state_dict(), "pos": ...}``), or restores would start it from the top."""
        return {"lane_id": self._lane, "canonical_replicas": self._canon, "chunk_size_hint": self.chunk_size_hint()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (a :meth:`state_dict` result, possibly JSON round-tripped).
        The base checks that the state is this lane's."""
        try:
            lane, lanes = state["lane_id"], state["canonical_replicas"]
        except (KeyError, TypeError) as err:
            raise CheckpointError(
                f"{type(self).__name__}: the state {state!r} has no lane identity (lane_id, "
                "canonical_replicas); pass what this source's state_dict() returned."
            ) from err
        self._verify_base_state(None if lane is None else int(lane), None if lanes is None else int(lanes))

    def component_ids(self) -> dict[str, int]:
        """``{component_name: id}`` of every component this source may ever emit (ids unique,
        non-negative, fixed for the life of the source). Every source must implement it."""
        raise NotImplementedError(f"{type(self).__name__} must implement component_ids().")

    @property
    def datasets_by_id(self) -> dict[int, Dataset]:
        """``{dataset_id: Dataset}``; pointers' first column indexes this. Every source must
        implement it."""
        raise NotImplementedError(f"{type(self).__name__} must implement the datasets_by_id property.")

    # ---------------------------------------------------------------- defaults
    def clone_for_lane(self, lane_id: int, canonical_replicas: int) -> WorkSource:
        """A source that yields only lane ``lane_id``'s chunks out of ``canonical_replicas``.

        The default, as Zephon's, is a deep copy bound to the lane (``self._lane``,
        ``self._canon``): the subclass's ``next_chunk`` must then yield only its lane's chunks.
        With more than one lane that is the subclass's job, so the default warns once
        (`~zephon_columnar.errors.ConfigurationWarning`) that a ``next_chunk`` ignoring
        ``self._lane`` would give every lane the same data. Sources that split their stream
        themselves (``StaticMixtureWorkSource``) override this.
        """
        check_lane(lane_id, canonical_replicas)
        if self._cloned:
            raise ConfigError(
                f"{type(self).__name__}.clone_for_lane: this is already lane {self._lane}'s clone; "
                "clone the source you built, not a clone."
            )
        if canonical_replicas > 1 and lane_id == 0:
            warn(
                f"{type(self).__name__} uses WorkSource's default clone_for_lane for {canonical_replicas} lanes: "
                "each lane gets a copy bound to its lane (self._lane). Its next_chunk must yield only that "
                "lane's chunks, or every lane reads the same data; override clone_for_lane to say how the "
                "stream splits.",
                ConfigurationWarning,
            )
        clone = copy.deepcopy(self)
        clone._cloned = True  # noqa: SLF001 - a copy of this very object
        clone._bind_lane(lane_id, canonical_replicas)  # noqa: SLF001
        return clone

    def _bind_lane(self, lane_id: int, canonical_replicas: int) -> None:
        """Set the lane this clone serves (a subclass may extend it to seed per-lane cursors)."""
        self._lane, self._canon = int(lane_id), int(canonical_replicas)

    def _verify_base_state(self, lane_id: int | None, canonical_replicas: int | None) -> None:
        """Refuse a state saved by another lane or lane count (for subclasses whose state
        records them, as Zephon's base state does)."""
        if lane_id != self._lane or canonical_replicas != self._canon:
            raise CheckpointError(
                f"{type(self).__name__}: the state is lane {lane_id} of {canonical_replicas}, "
                f"this source is lane {self._lane} of {self._canon}; restore each lane's own state."
            )

    @property
    def total_samples(self) -> float:
        """Pointers left from the current position to the end; ``inf`` when unbounded/unknown."""
        return math.inf

    def __len__(self) -> int:
        total = self.total_samples
        if math.isinf(total):
            raise TypeError(
                f"len() is not defined for an infinite work source: {type(self).__name__} is unbounded (or its "
                "size is unknown); use total_samples, which is inf here."
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

    def target_weights(self) -> dict[str, float]:
        """``{component_name: weight}`` the mixture aims at (summing to 1), what progress and
        ``explain()`` compare the delivered mixture with; {} when the source states none."""
        return {}

    def for_epoch(self, epoch: int) -> WorkSource:
        """This source at the start of epoch ``epoch``, its order seeded for that epoch
        (`Pipeline.set_epoch`). Epoch 0 is the source itself; a source whose order no seed sets
        has no other epoch."""
        if epoch == 0:
            return self
        raise ConfigError(
            f"set_epoch({epoch}): {type(self).__name__} has no epochs (its order is not set by a seed); "
            "iterate again for the same order, or override WorkSource.for_epoch."
        )

    def stream_passes(self) -> int | None:
        """Passes of `rows_per_pass` rows the stream runs from its start (None: endless or
        unknown): what the progress readout's ETA runs to."""
        return None

    def describe_data(self) -> list[str]:
        """What ``explain()`` shows of the data this source reads, a line each. The default
        names the source and its datasets."""
        names = ", ".join(ds.name for ds in self.datasets_by_id.values())
        return [f"{self!r}: datasets {names}"]

    def recipe(self) -> dict[str, Any]:
        """JSON-friendly identity of the data order: two sources with equal recipes (and equal
        positions) produce the same chunks. The default only names the class."""
        cls = type(self)
        return {"class": f"{cls.__module__}.{cls.__qualname__}"}

    def accepts_mixture_changes(self) -> bool:
        """Whether the training loop may change this source's mixture during a run
        (`Pipeline.set_mixture`; `~zephon_columnar.work.scheduled_mixture.ScheduledMixtureWorkSource`
        does); the engine then checkpoints every lane by replay (`zephon_columnar.engine.checkpoint.mode`).
        False by default."""
        return False

    def continued_from(self, state: Mapping[str, Any], *, replayed_before: int | None = None) -> WorkSource:
        """This source, as built, continuing the run a lane's ``state`` comes from: what the run
        added to the source during the run (a scheduled mixture's changes) taken from the state,
        so that later changes extend it. ``replayed_before``: the first global chunk the
        restored run plans afresh (the chunks before it are replayed as they were read; None:
        unknown), so that a source told its recipe may change from some chunk on (a scheduled
        mixture's ``schedule_edits="future"``) can accept the checkpoint. A restore replaces the
        pipeline's source with it; this source itself by default."""
        return self

    def as_continued(self, saved_recipe: Mapping[str, Any]) -> Mapping[str, Any]:
        """A checkpoint's work-source recipe as this source continues it: ``saved_recipe`` itself
        by default; a source that `continued_from` a checkpoint whose recipe it accepted while it
        differs answers its own recipe."""
        return saved_recipe

    def with_mixture_change(self, *, at: int, weights: Mapping[str, float]) -> WorkSource:
        """This source with its mixture ``weights`` from global chunk ``at`` on (a source that
        `accepts_mixture_changes`); raises ``TypeError`` by default."""
        raise TypeError(
            f"{type(self).__name__} has a fixed mixture; build the pipeline over a ScheduledMixtureWorkSource "
            "(zephon_columnar.ScheduledMixtureWorkSource(datasets, [SchedulePoint(at=0, weights={...})])) to change "
            "it during training."
        )

    def continues_after_exhaustion(self) -> frozenset[str]:
        """Components the source goes on without once they run out (announced in
        ``WorkChunk.source_exhausted``); none by default."""
        return frozenset()

    def supports_indexing(self) -> bool:
        """Whether the source's samples have positions (`positions`); False by default."""
        return False

    def positions(self) -> SamplePositions:
        """The stream as a random-access array of pointers, for map-style datasets.

        The default serves Zephon's indexing API: a source whose ``supports_indexing()`` is
        True and that implements ``__len__`` and ``sample_id_at(i)`` (Zephon's names) is asked
        for every sample id once, here."""
        if not self.supports_indexing():
            raise ConfigError(
                f"{type(self).__name__} has no sample positions (supports_indexing() is False); "
                "iterate it with to_torch_dataset(), or implement supports_indexing() and positions()."
            )
        from zephon_columnar.work.positions import SamplePositions

        ids = np.asarray([tuple(self.sample_id_at(i)) for i in range(len(self))], np.int64).reshape(-1, 3)
        names = {cid: name for name, cid in self.component_ids().items()}
        single = next(iter(names.values())) if len(names) == 1 else None
        components = [single if single is not None else names.get(int(d), str(int(d))) for d in ids[:, 0]]
        chunks: list[WorkChunk] = []
        start = 0
        while start < len(ids):  # runs of one component, at most _INDEX_CHUNK samples each
            end = start + 1
            while end < len(ids) and end - start < _INDEX_CHUNK and components[end] == components[start]:
                end += 1
            chunks.append(WorkChunk({components[start]: ids[start:end]}))
            start = end
        return SamplePositions([len(c) for c in chunks], chunks.__getitem__)

    def sample_id_at(self, index: int) -> tuple[int, int, int]:
        """``(dataset_id, shard_id, row)`` at position ``index`` of the stream (Zephon's
        indexing API); implemented by indexable sources."""
        raise NotImplementedError(f"{type(self).__name__} is not indexable: it does not implement sample_id_at().")

    @property
    def requires_token_priming(self) -> bool:
        """Whether ``prime`` must run before the first chunk (token-unit mixtures)."""
        return False

    def prime(self, counts: Any = None, **kwargs: Any) -> None:
        """Prepare a token-unit mixture (`StaticMixtureWorkSource.prime`); nothing by default."""


__all__ = [
    "ComponentOrder",
    "MixtureComponent",
    "MixtureReadConfig",
    "MixtureReadMode",
    "SamplesPerComponent",
    "SourcedSampleId",
    "WorkChunk",
    "WorkSource",
]
