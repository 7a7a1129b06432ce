"""Observability types (Zephon's names). Execution tracking is accepted and reported by
``Pipeline.explain()``; metrics sinks are documented no-ops in this version."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class ExecutionTrackingMode(str, enum.Enum):
    OFF = "off"
    STAGES = "stages"
    NODES = "nodes"


class MetricsSinkMode(str, enum.Enum):
    LOG = "log"
    STATSD = "statsd"
    BOTH = "both"


@dataclass(kw_only=True)
class MetricsSinkConfig:
    mode: MetricsSinkMode = MetricsSinkMode.LOG
    namespace: str = "zephon.pipeline"
    statsd_host: str = "127.0.0.1"
    statsd_port: int = 8125
    default_tags: dict[str, Any] = field(default_factory=dict)
    json_logs: bool = True
    max_batch_size: int = 32
    flush_interval_s: float = 5.0


@dataclass(kw_only=True)
class PipelineSummary:
    """Per-stage counters of a finished or running pass."""

    records: list[dict[str, Any]] = field(default_factory=list)

    def to_records(self) -> list[dict[str, Any]]:
        return list(self.records)
