"""Observability: what to track and where metrics go (`config`), the metric summaries (`stats`),
the side-process queue's occupancy (`mtp_stats`) and the sink that emits them (`sink`)."""

from zephon_columnar.observability.config import ExecutionTrackingMode, MetricsSinkConfig, MetricsSinkMode
from zephon_columnar.observability.mtp_stats import MTPQueueStats
from zephon_columnar.observability.stats import (
    FetchStageSummary,
    FetchTimingDelta,
    FetchTimingSummary,
    FetchTimingTotals,
    PipelineSummary,
    PrefetchTimingDelta,
    PrefetchTimingSummary,
    PrefetchTimingTotals,
)

__all__ = [
    "ExecutionTrackingMode",
    "FetchStageSummary",
    "FetchTimingDelta",
    "FetchTimingSummary",
    "FetchTimingTotals",
    "MTPQueueStats",
    "MetricsSinkConfig",
    "MetricsSinkMode",
    "PipelineSummary",
    "PrefetchTimingDelta",
    "PrefetchTimingSummary",
    "PrefetchTimingTotals",
]
