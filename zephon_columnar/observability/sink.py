"""The metrics sink: `MetricsEmitter` sends a pass's `Pipeline.metrics_snapshot` as gauges.

``pipeline.enable_observability(sink=MetricsSinkConfig(...))`` (or
``options(metrics_sink_config=...)``) makes every pass emit `Pipeline.metrics_snapshot` as
gauges every ``flush_interval_s`` seconds while it is iterated, and once at its end: as log
records of the logger named ``namespace`` (one JSON object per flush with ``json_logs``, else
one ``name=value`` line), as StatsD datagrams to ``statsd_host:statsd_port`` (at most
``max_batch_size`` gauges per datagram, DogStatsD ``#tag:value`` tags), or both. Emission runs
in the iterating thread, between two ``next()`` calls; a StatsD send that fails is reported
once as a warning and never interrupts training.

Example:
    >>> import logging
    >>> seen = []
    >>> handler = logging.Handler(); handler.emit = seen.append
    >>> logger = logging.getLogger("toy.metrics"); logger.addHandler(handler); logger.setLevel("INFO")
    >>> emitter = MetricsEmitter(MetricsSinkConfig(namespace="toy.metrics", json_logs=False),
    ...                          lambda: PipelineSummary(records=[{"lane": 0, "name": "dropped", "value": 2}]))
    >>> emitter.update("an item"); emitter.close()
    >>> seen[-1].getMessage()
    'toy.metrics.items_delivered=1 toy.metrics.dropped{lane=0}=2'
"""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Callable
from typing import Any

from zephon_columnar.observability.config import MetricsSinkConfig, MetricsSinkMode
from zephon_columnar.observability.stats import PipelineSummary

# Per-operator / per-stage record fields that are labels, not values.
_LABELS = ("lane", "stage", "index", "op")

Gauge = tuple[str, float, dict[str, Any]]  # (name, value, tags)


def gauges_of(summary: PipelineSummary | None, namespace: str) -> list[Gauge]:
    """The gauges of a `Pipeline.metrics_snapshot`: a lane counter ``{lane, name, value}`` is
    ``namespace.name`` tagged with its lane; an operator or stage record gives one gauge per
    numeric field, ``namespace.op.<field>`` / ``namespace.stage.<field>``, tagged with its labels."""
    out: list[Gauge] = []
    for rec in summary.records if summary is not None else []:
        tags = {k: rec[k] for k in _LABELS if k in rec and k != "name"}
        if "name" in rec and "value" in rec:
            out.append((f"{namespace}.{rec['name']}", float(rec["value"]), tags))
            continue
        kind = "op" if "op" in rec else "stage"
        out += [
            (f"{namespace}.{kind}.{k}", float(v), tags)
            for k, v in rec.items()
            if k not in _LABELS and isinstance(v, (int, float)) and not isinstance(v, bool)
        ]
    return out


class MetricsEmitter:
    """Emits a pass's metrics to the sink of a `MetricsSinkConfig` (see the module docstring).

    ``snapshot`` returns the current `PipelineSummary`; `update` is called with every item
    delivered, `close` once at the end of the pass (a last flush)."""

    def __init__(self, config: MetricsSinkConfig, snapshot: Callable[[], PipelineSummary | None]) -> None:
        mode = MetricsSinkMode(config.mode)
        self.config = config
        self.snapshot = snapshot
        self.items = 0
        self._log = logging.getLogger(config.namespace) if mode in (MetricsSinkMode.LOG, MetricsSinkMode.BOTH) else None
        self._udp: socket.socket | None = None
        if mode in (MetricsSinkMode.STATSD, MetricsSinkMode.BOTH):
            self._udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self._udp.setblocking(False)  # a full socket buffer drops metrics, never stalls a step
        self._send_failed = False
        self._next_flush = time.monotonic() + config.flush_interval_s

    def update(self, value: Any) -> None:
        self.items += 1
        if time.monotonic() >= self._next_flush:
            self.flush()

    def flush(self) -> None:
        gauges: list[Gauge] = [(f"{self.config.namespace}.items_delivered", float(self.items), {})]
        gauges += gauges_of(self.snapshot(), self.config.namespace)
        if self._log is not None:
            self._emit_log(gauges)
        if self._udp is not None:
            self._emit_statsd(gauges)
        self._next_flush = time.monotonic() + self.config.flush_interval_s

    def close(self, *, ended: bool = False) -> None:
        """The last flush, at the end of the pass (``ended``) or when it is closed early."""
        self.flush()
        if self._udp is not None:
            self._udp.close()
            self._udp = None

    def _emit_log(self, gauges: list[Gauge]) -> None:
        assert self._log is not None
        tags = dict(self.config.default_tags)
        if self.config.json_logs:
            self._log.info(
                json.dumps(
                    {
                        "event": "pipeline_metrics",
                        "tags": tags,
                        "metrics": [{"name": n, "value": v, "tags": t} for n, v, t in gauges],
                    },
                    default=str,
                )
            )
        else:
            self._log.info(" ".join(_text_gauge(n, v, {**tags, **t}) for n, v, t in gauges))

    def _emit_statsd(self, gauges: list[Gauge]) -> None:
        assert self._udp is not None
        lines = [_statsd_line(n, v, {**self.config.default_tags, **t}) for n, v, t in gauges]
        step = max(1, int(self.config.max_batch_size))
        for at in range(0, len(lines), step):
            try:
                self._udp.sendto(
                    "\n".join(lines[at : at + step]).encode(), (self.config.statsd_host, int(self.config.statsd_port))
                )
            except OSError as err:
                if not self._send_failed:
                    self._send_failed = True
                    from zephon_columnar.errors import warn

                    warn(
                        f"metrics sink: StatsD send to {self.config.statsd_host}:{self.config.statsd_port} "
                        f"failed ({err}); metrics are dropped until it works again."
                    )


def _text_gauge(name: str, value: float, tags: dict[str, Any]) -> str:
    label = "{" + ",".join(f"{k}={v}" for k, v in tags.items()) + "}" if tags else ""
    return f"{name}{label}={value:g}"


def _statsd_line(name: str, value: float, tags: dict[str, Any]) -> str:
    label = "|#" + ",".join(f"{k}:{v}" for k, v in tags.items()) if tags else ""
    return f"{name}:{value:g}|g{label}"
