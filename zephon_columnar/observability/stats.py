"""Metric summaries (Zephon's ``zephon.observability.stats``): deltas in, running totals out.

A *delta* is what one report adds (an operator's work since the last report, one fetch group,
one prefetched batch); a *summary* sums deltas per stage (and per operator, or per shard),
merges with another summary, copies, and flattens to records (``to_records``: one dict per row
of a metrics table). `PipelineSummary` is also what ``Pipeline.metrics_snapshot`` returns: its
``records`` hold the engine's own counters (per lane and stage), listed after the operators'.

Example:
    >>> s = PipelineSummary(plan_id="p", tracking_mode=ExecutionTrackingMode.NODES)
    >>> s.apply(NodeMetricsDelta(stage_index=0, op_index=0, stage_name="map", name="upper",
    ...                          processed_ns=10, produced_elements=2, wait_ns=5))
    >>> s.apply(NodeMetricsDelta(stage_index=0, op_index=0, stage_name="map", name="upper",
    ...                          processed_ns=30, produced_elements=2, wait_ns=5))
    >>> [(r["name"], r["processed_ns"], r["avg_processing_ns"]) for r in s.to_records()]
    [('upper', 40, 10.0)]
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from zephon_columnar.observability.config import ExecutionTrackingMode

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from Python 3.11; annotations only

_UNSET_MIN = sys.maxsize


def _ratio(part: float, whole: float) -> float:
    return part / whole if whole > 0 else 0.0


@dataclass
class _PlanSummary:
    """What every pipeline-wide summary has: which plan, how often it reports, how finely it
    tracks; ``merge`` keeps its own values and takes the other's where it has none."""

    plan_id: str | None = None
    reporting_interval_s: float | None = None
    tracking_mode: ExecutionTrackingMode = ExecutionTrackingMode.OFF

    def merge(self, other: Any) -> None:
        raise NotImplementedError

    def _merge_plan(self, other: _PlanSummary) -> None:
        if self.plan_id is None:
            self.plan_id = other.plan_id
        if self.reporting_interval_s is None:
            self.reporting_interval_s = other.reporting_interval_s

    def clone(self) -> Self:
        """An independent copy (later deltas applied to either do not reach the other)."""
        clone = type(self)(self.plan_id, self.reporting_interval_s, self.tracking_mode)
        clone.merge(self)
        return clone


@dataclass(slots=True)
class NodeMetricsDelta:
    """One operator's work since its last report."""

    stage_index: int
    op_index: int
    stage_name: str
    name: str
    processed_ns: int = 0
    produced_elements: int = 0
    consumed_elements: int = 0
    produced_bytes: int = 0
    consumed_bytes: int = 0
    wait_ns: int = 0
    max_queue_depth: int | None = None
    min_processing_ns: int | None = None
    max_processing_ns: int | None = None

    @classmethod
    def empty(cls, stage_index: int, op_index: int, stage_name: str, name: str) -> NodeMetricsDelta:
        return cls(stage_index=stage_index, op_index=op_index, stage_name=stage_name, name=name)


_NODE_SUMS = ("processed_ns", "produced_elements", "consumed_elements", "produced_bytes", "consumed_bytes", "wait_ns")


@dataclass(slots=True)
class NodeSummary:
    """One operator's totals; ``wait_ratio`` is its share of the pipeline's waiting
    (`PipelineSummary.compute_wait_ratios`)."""

    stage_index: int
    op_index: int
    name: str
    processed_ns: int = 0
    produced_elements: int = 0
    consumed_elements: int = 0
    produced_bytes: int = 0
    consumed_bytes: int = 0
    wait_ns: int = 0
    min_processing_ns: int = _UNSET_MIN
    max_processing_ns: int = 0
    max_queue_depth: int = 0
    wait_ratio: float = 0.0

    def apply(self, delta: NodeMetricsDelta) -> None:
        for name in _NODE_SUMS:
            setattr(self, name, getattr(self, name) + getattr(delta, name))
        if delta.max_queue_depth is not None:
            self.max_queue_depth = max(self.max_queue_depth, delta.max_queue_depth)
        if delta.min_processing_ns is not None:
            self.min_processing_ns = min(self.min_processing_ns, delta.min_processing_ns)
        if delta.max_processing_ns is not None:
            self.max_processing_ns = max(self.max_processing_ns, delta.max_processing_ns)

    def as_delta(self, stage_name: str) -> NodeMetricsDelta:
        """These totals as one delta (to merge or copy them into another summary)."""
        return NodeMetricsDelta(
            stage_index=self.stage_index,
            op_index=self.op_index,
            stage_name=stage_name,
            name=self.name,
            **{name: getattr(self, name) for name in _NODE_SUMS},
            max_queue_depth=self.max_queue_depth,
            min_processing_ns=None if self.min_processing_ns == _UNSET_MIN else self.min_processing_ns,
            max_processing_ns=self.max_processing_ns or None,
        )

    @property
    def has_samples(self) -> bool:
        return self.produced_elements > 0 or self.processed_ns > 0

    @property
    def avg_processing_ns(self) -> float:
        return _ratio(self.processed_ns, self.produced_elements)

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage_index,
            "op": self.op_index,
            "name": self.name,
            **{name: getattr(self, name) for name in _NODE_SUMS},
            "min_processing_ns": None if self.min_processing_ns == _UNSET_MIN else self.min_processing_ns,
            "max_processing_ns": self.max_processing_ns,
            "avg_processing_ns": self.avg_processing_ns,
            "max_queue_depth": self.max_queue_depth,
            "wait_ratio": self.wait_ratio,
        }


@dataclass(slots=True)
class StageSummary:
    """One stage's operators' totals, by operator index."""

    index: int
    name: str
    nodes: MutableMapping[int, NodeSummary] = field(default_factory=dict)

    def apply(self, delta: NodeMetricsDelta) -> None:
        if delta.stage_name and not self.name:
            self.name = delta.stage_name
        node = self.nodes.get(delta.op_index)
        if node is None:
            node = self.nodes[delta.op_index] = NodeSummary(delta.stage_index, delta.op_index, delta.name)
        node.apply(delta)

    def merge(self, other: StageSummary) -> None:
        for node in other.iter_nodes():
            self.apply(node.as_delta(self.name))

    def iter_nodes(self) -> Iterator[NodeSummary]:
        return (node for _, node in sorted(self.nodes.items()))

    def copy(self) -> StageSummary:
        clone = StageSummary(index=self.index, name=self.name)
        clone.merge(self)
        return clone

    @property
    def total_processing_ns(self) -> int:
        return sum(node.processed_ns for node in self.nodes.values())

    @property
    def total_wait_ns(self) -> int:
        return sum(node.wait_ns for node in self.nodes.values())

    @property
    def produced_elements(self) -> int:
        return sum(node.produced_elements for node in self.nodes.values())


@dataclass(slots=True)
class FetchTimingDelta:
    """One fetch group: the samples read from one shard and where the time went."""

    stage_index: int
    dataset_id: int
    shard_id: int
    samples: int
    group_ns: int
    resolve_ns: int
    open_ns: int
    read_ns: int
    close_ns: int
    retries: int
    cache_hits: int
    cache_misses: int
    shard_reopens: int = 0


_FETCH_SUMS = (
    "samples",
    "group_ns",
    "resolve_ns",
    "open_ns",
    "read_ns",
    "close_ns",
    "retries",
    "cache_hits",
    "cache_misses",
    "shard_reopens",
)


@dataclass(slots=True)
class FetchTimingTotals:
    """Fetch totals (of a stage, or of one shard of it); ``groups`` counts the deltas."""

    samples: int = 0
    groups: int = 0
    group_ns: int = 0
    resolve_ns: int = 0
    open_ns: int = 0
    read_ns: int = 0
    close_ns: int = 0
    retries: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    shard_reopens: int = 0

    def apply(self, delta: FetchTimingDelta) -> None:
        self.groups += 1
        for name in _FETCH_SUMS:
            setattr(self, name, getattr(self, name) + max(0, getattr(delta, name)))

    def merge(self, other: FetchTimingTotals) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def copy(self) -> FetchTimingTotals:
        return copy.copy(self)

    @property
    def avg_group_ns(self) -> float:
        return _ratio(self.group_ns, self.groups)

    @property
    def avg_resolve_ns(self) -> float:
        return _ratio(self.resolve_ns, self.samples)

    @property
    def avg_open_ns(self) -> float:
        return _ratio(self.open_ns, self.samples)

    @property
    def avg_read_ns(self) -> float:
        return _ratio(self.read_ns, self.samples)

    @property
    def avg_close_ns(self) -> float:
        return _ratio(self.close_ns, self.samples)

    @property
    def cache_hit_ratio(self) -> float:
        return _ratio(self.cache_hits, self.cache_hits + self.cache_misses)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out.update(
            avg_group_ns=self.avg_group_ns,
            avg_resolve_ns=self.avg_resolve_ns,
            avg_open_ns=self.avg_open_ns,
            avg_read_ns=self.avg_read_ns,
            avg_close_ns=self.avg_close_ns,
            cache_hit_ratio=self.cache_hit_ratio,
        )
        return out


@dataclass(slots=True)
class FetchStageSummary:
    """One fetch stage: its totals and, per ``(dataset_id, shard_id)``, each shard's."""

    index: int
    totals: FetchTimingTotals = field(default_factory=FetchTimingTotals)
    shard_totals: MutableMapping[tuple[int, int], FetchTimingTotals] = field(default_factory=dict)

    def apply(self, delta: FetchTimingDelta) -> None:
        self.totals.apply(delta)
        self.shard_totals.setdefault((delta.dataset_id, delta.shard_id), FetchTimingTotals()).apply(delta)

    def merge(self, other: FetchStageSummary) -> None:
        self.totals.merge(other.totals)
        for key, totals in other.shard_totals.items():
            self.shard_totals.setdefault(key, FetchTimingTotals()).merge(totals)

    def copy(self) -> FetchStageSummary:
        clone = FetchStageSummary(index=self.index)
        clone.merge(self)
        return clone

    def to_records(
        self,
        *,
        plan_id: str | None,
        stage_name: str | None,
        tracking_mode: ExecutionTrackingMode,
        include_shards: bool = True,
    ) -> list[dict[str, Any]]:
        """The stage's totals (``dataset_id``/``shard_id`` None), then each shard's, in order."""
        rows: list[tuple[int | None, int | None, FetchTimingTotals]] = [(None, None, self.totals)]
        if include_shards:
            rows += [(d, s, t) for (d, s), t in sorted(self.shard_totals.items())]
        return [
            {
                "plan_id": plan_id,
                "tracking_mode": ExecutionTrackingMode(tracking_mode).value,
                "stage": self.index,
                "stage_name": stage_name,
                "dataset_id": d,
                "shard_id": s,
                **t.to_dict(),
            }
            for d, s, t in rows
        ]


@dataclass
class FetchTimingSummary(_PlanSummary):
    """Fetch metrics of a pipeline, per stage (`FetchStageSummary`: totals, and per shard).

    ``cache`` (zephon_columnar's addition): the shard cache's counters in the process that asked
    (``downloads``, ``hits``, ``evictions``, ``retries``), whichever stage they served.
    """

    stages: MutableMapping[int, FetchStageSummary] = field(default_factory=dict)
    cache: dict[str, int] = field(default_factory=dict)

    def apply(self, delta: FetchTimingDelta) -> None:
        self.stages.setdefault(delta.stage_index, FetchStageSummary(index=delta.stage_index)).apply(delta)

    def merge(self, other: FetchTimingSummary) -> None:
        self._merge_plan(other)
        for index, stage in other.stages.items():
            self.stages.setdefault(index, FetchStageSummary(index=index)).merge(stage)
        for name, count in other.cache.items():
            self.cache[name] = self.cache.get(name, 0) + count

    def iter_stages(self) -> Iterator[FetchStageSummary]:
        return (stage for _, stage in sorted(self.stages.items()))

    def to_records(
        self, stage_names: Mapping[int, str] | None = None, *, include_shards: bool = True
    ) -> list[dict[str, Any]]:
        return [
            record
            for stage in self.iter_stages()
            for record in stage.to_records(
                plan_id=self.plan_id,
                stage_name=(stage_names or {}).get(stage.index),
                tracking_mode=self.tracking_mode,
                include_shards=include_shards,
            )
        ]

    def has_samples(self) -> bool:
        return any(stage.totals.samples > 0 for stage in self.stages.values())


@dataclass(slots=True)
class PrefetchTimingDelta:
    """One prefetched batch: its size and the prefetch requests it made."""

    stage_index: int
    batch_size: int
    prefetch_requests: int
    prefetch_succeeded: int
    prefetch_failed: int


@dataclass(slots=True)
class PrefetchTimingTotals:
    """Prefetch totals of a stage; ``batches`` counts the deltas, ``samples`` their sizes.
    ``bytes`` and ``seconds`` (zephon_columnar's addition): what the successful downloads moved,
    and their time summed over the download threads."""

    batches: int = 0
    samples: int = 0
    prefetch_requests: int = 0
    prefetch_succeeded: int = 0
    prefetch_failed: int = 0
    bytes: int = 0
    seconds: float = 0.0

    def apply(self, delta: PrefetchTimingDelta) -> None:
        self.batches += 1
        self.samples += max(0, delta.batch_size)
        self.prefetch_requests += max(0, delta.prefetch_requests)
        self.prefetch_succeeded += max(0, delta.prefetch_succeeded)
        self.prefetch_failed += max(0, delta.prefetch_failed)

    def merge(self, other: PrefetchTimingTotals) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def copy(self) -> PrefetchTimingTotals:
        return copy.copy(self)


@dataclass
class PrefetchTimingSummary(_PlanSummary):
    """Prefetch metrics of a pipeline, per stage; ``success_rate`` over all of them."""

    stages: MutableMapping[int, PrefetchTimingTotals] = field(default_factory=dict)

    def apply(self, delta: PrefetchTimingDelta) -> None:
        self.stages.setdefault(delta.stage_index, PrefetchTimingTotals()).apply(delta)

    def merge(self, other: PrefetchTimingSummary) -> None:
        self._merge_plan(other)
        for index, totals in other.stages.items():
            self.stages.setdefault(index, PrefetchTimingTotals()).merge(totals)

    def has_samples(self) -> bool:
        return any(totals.samples > 0 for totals in self.stages.values())

    @property
    def success_rate(self) -> float:
        requests = sum(t.prefetch_requests for t in self.stages.values())
        return _ratio(sum(t.prefetch_succeeded for t in self.stages.values()), requests)


@dataclass
class PipelineSummary(_PlanSummary, Mapping[str, float]):
    """A pipeline's operator metrics, per stage, plus the engine's own counters (``records``:
    ``{lane, name, value}`` and per-stage dicts, what ``Pipeline.metrics_snapshot`` fills).

    It is also a flat, read-only ``Mapping[str, float]`` of every number in it, what W&B's
    ``wandb.log`` and TensorBoard's ``add_scalar`` take as they are: an engine counter under its
    name (summed over lanes) and ``"<name>/lane_<l>"``; an operator's figures under
    ``"op/<stage>.<index>.<operator>/<figure>"``; a parallel stage's under
    ``"stage/<stage>/<figure>"``. Strings, flags and missing values are left out.

    Example:
        >>> summary = PipelineSummary(records=[{"lane": 0, "name": "pack_dropped_final_tokens", "value": 3},
        ...                                    {"lane": 1, "name": "pack_dropped_final_tokens", "value": 4},
        ...                                    {"stage": 0, "index": 0, "op": "fetch", "rows_out": 20}])
        >>> for key, value in summary.items():
        ...     print(key, value)
        pack_dropped_final_tokens 7.0
        pack_dropped_final_tokens/lane_0 3.0
        pack_dropped_final_tokens/lane_1 4.0
        op/0.0.fetch/rows_out 20.0
    """

    stages: MutableMapping[int, StageSummary] = field(default_factory=dict)
    total_wait_ratio: float | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    # The flat view, built once per state (``dict(summary)`` reads every key): the state it was
    # built from (changes counted by apply/merge, and the records list) and the view.
    _changes: int = field(default=0, init=False, repr=False, compare=False)
    _view: tuple[tuple[int, int, int], dict[str, float]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def apply(self, delta: NodeMetricsDelta) -> None:
        self.stages.setdefault(delta.stage_index, StageSummary(delta.stage_index, delta.stage_name)).apply(delta)
        self._changes += 1

    def merge(self, other: PipelineSummary) -> None:
        self._merge_plan(other)
        for index, stage in other.stages.items():
            self.stages.setdefault(index, StageSummary(stage.index, stage.name)).merge(stage)
        self.records = self.records + other.records
        self._changes += 1

    def iter_stages(self) -> Iterator[StageSummary]:
        return (stage for _, stage in sorted(self.stages.items()))

    # ---------------------------------------------------------------- the flat view
    def _flat(self) -> dict[str, float]:
        state = (self._changes, id(self.records), len(self.records))
        if self._view is None or self._view[0] != state:
            self._view = (state, self._build_flat())
        return self._view[1]

    def _build_flat(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for record in self.to_records():
            if {"lane", "name", "value"} <= record.keys():
                if _is_number(record["value"]):
                    name, value = str(record["name"]), float(record["value"])
                    out[name] = out.get(name, 0.0) + value
                    out[f"{name}/lane_{record['lane']}"] = value
                continue
            prefix = _figure_prefix(record)
            for key, value in record.items():
                if key not in _IDENTITY_KEYS and _is_number(value):
                    out[f"{prefix}/{key}"] = float(value)
        return out

    def __getitem__(self, key: str) -> float:
        return self._flat()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._flat())

    def __len__(self) -> int:
        return len(self._flat())

    def to_records(self) -> list[dict[str, Any]]:
        """One record per operator (``NodeSummary.to_dict`` with ``stage_name``, ``plan_id``,
        ``tracking_mode``), then the engine's counters."""
        mode = ExecutionTrackingMode(self.tracking_mode).value
        return [
            {**node.to_dict(), "stage_name": stage.name, "plan_id": self.plan_id, "tracking_mode": mode}
            for stage in self.iter_stages()
            for node in stage.iter_nodes()
        ] + list(self.records)

    def clone(self) -> PipelineSummary:
        clone = super().clone()
        clone.total_wait_ratio = self.total_wait_ratio
        return clone

    def compute_wait_ratios(self) -> None:
        """Each operator's ``wait_ratio``: its share of all operators' wait time."""
        total = sum(stage.total_wait_ns for stage in self.stages.values())
        if total <= 0:
            self.total_wait_ratio = 0.0
            return
        for stage in self.stages.values():
            for node in stage.nodes.values():
                node.wait_ratio = node.wait_ns / total
        self.total_wait_ratio = 1.0


#: What names a record rather than measures it (left out of `PipelineSummary`'s flat view).
_IDENTITY_KEYS = frozenset({"stage", "index", "op", "name", "lane", "plan_id", "stage_name", "tracking_mode"})


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _figure_prefix(record: Mapping[str, Any]) -> str:
    """``op/<stage>.<index>.<operator>`` for an operator's record (the engine's, ``op`` a name;
    a `NodeSummary`'s, ``op`` its index and ``name`` its name), else ``stage/<stage>``."""
    stage, op = record.get("stage"), record.get("op")
    if isinstance(op, str):
        return f"op/{stage}.{record.get('index')}.{op}"
    if isinstance(op, int) and isinstance(record.get("name"), str):
        return f"op/{stage}.{op}.{record['name']}"
    return f"stage/{stage}"


__all__ = [
    "FetchStageSummary",
    "FetchTimingDelta",
    "FetchTimingSummary",
    "FetchTimingTotals",
    "NodeMetricsDelta",
    "NodeSummary",
    "PipelineSummary",
    "PrefetchTimingDelta",
    "PrefetchTimingSummary",
    "PrefetchTimingTotals",
    "StageSummary",
]
