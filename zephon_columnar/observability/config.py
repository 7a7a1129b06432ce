"""Observability configuration: what to track (`ExecutionTrackingMode`) and where metrics go
(`MetricsSinkConfig`, `MetricsSinkMode`).

Example:
    >>> MetricsSinkMode(MetricsSinkConfig(mode="statsd").mode) is MetricsSinkMode.STATSD
    True
    >>> ExecutionTrackingMode("nodes")
    <ExecutionTrackingMode.NODES: 'nodes'>
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class ExecutionTrackingMode(str, enum.Enum):
    """How finely a pass's execution is timed: not at all, per stage, or per operator."""

    OFF = "off"
    STAGES = "stages"
    NODES = "nodes"


class MetricsSinkMode(str, enum.Enum):
    """Where metrics go: log records, StatsD datagrams, or both."""

    LOG = "log"
    STATSD = "statsd"
    BOTH = "both"


@dataclass(kw_only=True)
class MetricsSinkConfig:
    """Where and how often `zephon_columnar.observability.sink.MetricsEmitter` sends metrics."""

    mode: MetricsSinkMode = MetricsSinkMode.LOG
    namespace: str = "zephon.pipeline"
    statsd_host: str = "127.0.0.1"
    statsd_port: int = 8125
    default_tags: dict[str, Any] = field(default_factory=dict)
    json_logs: bool = True
    max_batch_size: int = 32
    flush_interval_s: float = 5.0


__all__ = ["ExecutionTrackingMode", "MetricsSinkConfig", "MetricsSinkMode"]
