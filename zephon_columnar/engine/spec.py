"""`PipelineSpec`: what a run is built from (the work source, the operators, the options).

A `~zephon_columnar.pipeline.Pipeline` builds one step by step; a
session (``zephon_columnar.session``) runs it; an mtp-mode side process and each torch loader
worker get one of their own (`for_side_process`, `for_lanes`), its data-parallel layout settled
in the trainer (`settled`). A spec is frozen: a change is a
new spec (``dataclasses.replace``), so a run never sees its recipe change under it. It pickles
by value (cloudpickle), so the lambdas of ``map_transform`` and friends reach spawned processes.

Example:
    >>> import pickle
    >>> import pyarrow as pa
    >>> from zephon_columnar import Dataset, StaticMixtureWorkSource
    >>> from zephon_columnar.ops.fetch import FetchOp
    >>> from zephon_columnar.options import RuntimeOptions
    >>> ds = Dataset.from_tables("a", [pa.table({"x": list(range(8))})])
    >>> spec = PipelineSpec(
    ...     work_source=StaticMixtureWorkSource([ds], {"a": 1.0}, chunk_size=2),
    ...     ops=(FetchOp(),),
    ...     options=RuntimeOptions(canonical_replicas=4),
    ... )
    >>> spec.build_engine().lanes, spec.for_lanes([1, 3]).build_engine().lanes
    ([0, 1, 2, 3], [1, 3])
    >>> pickle.loads(pickle.dumps(spec.for_lanes([2]))).lane_subset
    (2,)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import cloudpickle

from zephon_columnar.engine.engine import Engine
from zephon_columnar.engine.layout import current_world, settle_layout
from zephon_columnar.ops.base import BaseOp
from zephon_columnar.ops.batch import BatchOp
from zephon_columnar.options import RuntimeOptions
from zephon_columnar.work.base import WorkSource


@dataclass(frozen=True, kw_only=True)
class PipelineSpec:
    """The work source, the operators (fetch first) and the options of a pipeline.

    ``prefetch``: ``Pipeline.prefetch``'s ``(buffer_size, parallelism)``, None when off.
    ``lane_subset``: the lanes of this rank's that a run reads (a torch loader worker's share;
    None: all of them). ``ignored``: what the builder calls named that has no effect here (one
    line each, with why: `zephon_columnar.compatibility`), for ``explain()``.
    """

    work_source: WorkSource
    ops: tuple[BaseOp, ...]
    options: RuntimeOptions
    prefetch: tuple[int, int] | None = None
    lane_subset: tuple[int, ...] | None = None
    ignored: tuple[str, ...] = ()

    def settled(self) -> PipelineSpec:
        """This spec with its data-parallel layout explicit for the world this process is in
        (`zephon_columnar.engine.layout.settle_layout`; a `ConfigError` where ranks would read the
        same data): what a loader worker or side process, which has no process group, is given."""
        options = settle_layout(self.options, current_world())
        return self if options is self.options else dataclasses.replace(self, options=options)

    def build_engine(self) -> Engine:
        """The engine of a run of this spec (cheap: compiling the plan, no thread started), on
        the layout `settled` gives."""
        self.options.validate()
        options = settle_layout(self.options, current_world())
        prefetcher = None
        if self.prefetch is not None:
            from zephon_columnar.engine.prefetch import ShardPrefetcher

            buffer_size, parallelism = self.prefetch
            prefetcher = ShardPrefetcher(
                self.work_source.datasets_by_id, parallelism=parallelism, buffer_size=buffer_size
            )
        return Engine(
            self.work_source,
            list(self.ops),
            options,
            prefetcher=prefetcher,
            lane_subset=None if self.lane_subset is None else list(self.lane_subset),
        )

    def for_lanes(self, lanes: Sequence[int]) -> PipelineSpec:
        """This spec reading only ``lanes`` of the rank's."""
        return dataclasses.replace(self, lane_subset=tuple(lanes))

    def for_side_process(self) -> PipelineSpec:
        """What an mtp-mode side process runs: the operators up to ``batch`` (``map_batch``
        after it runs in the trainer), in that process."""
        settled = self.settled()
        options = settled.options.updated(mtp_mode=False)
        return dataclasses.replace(settled, ops=ops_up_to_batch(self.ops), options=options)

    def __reduce__(self) -> tuple[Any, ...]:
        # By value: the operators may hold lambdas that a spawned process cannot import.
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return (_from_cloudpickle, (cloudpickle.dumps(fields),))


def ops_up_to_batch(ops: Sequence[BaseOp]) -> tuple[BaseOp, ...]:
    """The operators through ``batch`` (all of them without one)."""
    for i, op in enumerate(ops):
        if isinstance(op, BatchOp):
            return tuple(ops[: i + 1])
    return tuple(ops)


def _from_cloudpickle(blob: bytes) -> PipelineSpec:
    return PipelineSpec(**cloudpickle.loads(blob))
