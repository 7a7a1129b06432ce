"""The metrics sink (`zephon_columnar.observability`): `metrics_snapshot` as log records or
StatsD datagrams, while a pass is iterated and at its end, in or out of mtp mode."""

from __future__ import annotations

import json
import logging
import socket

import pytest

from tests.engine.test_mtp import build
from zephon_columnar.observability import MetricsSinkConfig


def logged_metrics(caplog, namespace: str) -> list[dict]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == namespace]


@pytest.mark.parametrize("mtp", [False, True])
def test_log_sink_emits_the_snapshot_during_and_after_the_pass(caplog, mtp):
    sink = MetricsSinkConfig(namespace="test.loader", flush_interval_s=0, default_tags={"job": "t1"})
    pipe = build("stateful", mtp=mtp).enable_observability("stages", sink=sink)
    with caplog.at_level(logging.INFO, logger="test.loader"):
        items = sum(1 for _ in pipe)
    flushes = logged_metrics(caplog, "test.loader")
    assert len(flushes) == items + 1  # one per item (interval 0), one at the end
    assert all(f["event"] == "pipeline_metrics" and f["tags"] == {"job": "t1"} for f in flushes)
    delivered = [next(m["value"] for m in f["metrics"] if m["name"] == "test.loader.items_delivered")
                 for f in flushes]
    assert delivered == list(range(1, items + 1)) + [items]
    last = {(m["name"], m["tags"].get("op")): m for m in flushes[-1]["metrics"]}
    assert last[("test.loader.op.rows_out", "fetch")]["value"] == 120
    assert last[("test.loader.op.rows_in", "pack_flat")]["tags"] == {"stage": "ordered", "index": 2,
                                                                    "op": "pack_flat"}


def test_statsd_sink_sends_gauges_in_datagrams_of_at_most_max_batch_size():
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    receiver.settimeout(5)
    sink = MetricsSinkConfig(mode="statsd", namespace="zc", statsd_port=receiver.getsockname()[1],
                             default_tags={"run": "a"}, max_batch_size=3, flush_interval_s=3600)
    items = sum(1 for _ in build("stateful", mtp=False).enable_observability("stages", sink=sink))
    datagrams = []
    receiver.settimeout(0.5)
    try:
        while True:
            datagrams.append(receiver.recv(65536).decode())
    except socket.timeout:
        pass
    receiver.close()
    lines = [line for d in datagrams for line in d.split("\n")]
    assert datagrams and all(len(d.split("\n")) <= 3 for d in datagrams)
    assert f"zc.items_delivered:{items}|g|#run:a" in lines  # only the end-of-pass flush (interval 1 h)
    assert "zc.op.rows_out:120|g|#run:a,stage:0,index:0,op:fetch" in lines
    assert all(line.split(":", 1)[1].split("|")[1] == "g" for line in lines)


def test_a_statsd_sink_that_cannot_send_warns_once_and_never_stops_the_pass():
    sink = MetricsSinkConfig(mode="both", statsd_host="no-such-host.invalid", flush_interval_s=0)
    expected = sum(1 for _ in build("stateless", mtp=False))
    with pytest.warns(UserWarning, match="StatsD send to no-such-host.invalid:8125 failed") as seen:
        assert sum(1 for _ in build("stateless", mtp=False).enable_observability(sink=sink)) == expected
    assert len([w for w in seen if "StatsD" in str(w.message)]) == 1


def test_default_sink_logs_to_zephons_logger_and_off_emits_nothing(caplog):
    with caplog.at_level(logging.INFO, logger="zephon.pipeline"):
        list(build("stateless", mtp=False).enable_observability())
        assert len(logged_metrics(caplog, "zephon.pipeline")) == 1  # the end of the pass (interval 5 s)
        caplog.clear()
        list(build("stateless", mtp=False).enable_observability("off"))
        assert logged_metrics(caplog, "zephon.pipeline") == []


def test_text_logs_and_a_dict_config(caplog):
    sink = {"namespace": "plain", "json_logs": False, "flush_interval_s": 3600}
    with caplog.at_level(logging.INFO, logger="plain"):
        list(build("stateless", mtp=False).options(metrics_sink_config=sink))
    (line,) = [r.getMessage() for r in caplog.records if r.name == "plain"]
    # no tracking: lane counters only, no operator or stage gauges
    assert line.startswith("plain.items_delivered=") and "plain.op." not in line and "plain.stage." not in line


@pytest.mark.parametrize("sink, culprit", [
    ({"namespace": "x", "interval": 3}, "unknown keys \\['interval'\\]"),
    (MetricsSinkConfig(mode="kafka"), "mode='kafka'"),
    (MetricsSinkConfig(flush_interval_s=-1), "flush_interval_s=-1"),
    (MetricsSinkConfig(max_batch_size=0), "max_batch_size=0"),
    ("statsd", "metrics_sink_config='statsd'"),
])
def test_bad_sink_configs_are_value_errors_naming_the_field(sink, culprit):
    with pytest.raises(ValueError, match=culprit):
        build("stateless", mtp=False).options(metrics_sink_config=sink)


def test_metrics_snapshot_is_a_flat_mapping_of_floats_that_metric_loggers_take_as_it_is():
    from collections.abc import Mapping

    import pyarrow as pa

    from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource

    docs = Dataset.from_tables("a", [pa.table({"input_ids": [[i] * (1 + i % 5) for i in range(40)]})])
    pipe = (Pipeline(StaticMixtureWorkSource([docs], {"a": 1.0}, chunk_size=8, seed=3))
            .pack_flat(7, algorithm="wrap").batch(2).options(canonical_replicas=2).enable_observability())
    with pytest.warns(UserWarning):
        delivered = sum(len(b) for b in pipe)
    summary = pipe.metrics_snapshot()
    assert isinstance(summary, Mapping) and all(isinstance(v, float) for v in summary.values())
    json.dumps(dict(summary))  # what a metric logger sends
    lanes = [summary[f"pack_dropped_final_tokens/lane_{lane}"] for lane in (0, 1)]
    assert summary["pack_dropped_final_tokens"] == sum(lanes) > 0  # each lane's final partial row
    fetched = summary["op/0.0.fetch/rows_out"]
    tokens = sum(1 + i % 5 for i in range(40))
    assert fetched == 40 and delivered * 7 + summary["pack_dropped_final_tokens"] + \
        7 * summary.get("batch_dropped_final_rows", 0.0) == tokens  # every token delivered or counted
    assert summary.records  # the typed form is still there
