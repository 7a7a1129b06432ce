"""Bad input fails loudly, early, and names the file, line, field or option; nothing hangs."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon_columnar import Dataset, InMemoryShard, Pipeline, StaticMixtureWorkSource
from zephon_columnar.errors import ConfigError, DatasetFormatError, DatasetNotFoundError
from zephon_columnar.testing import collect


@pytest.mark.parametrize("runner", ["inline", "threads", "process"])
def test_malformed_jsonl_line_mid_stream_names_file_and_line(tmp_path, runner):
    path = tmp_path / "part-000.jsonl"
    # Past the rows discovery samples for the schema, so the error surfaces mid-stream.
    lines = [json.dumps({"id": i, "text": f"row {i}"}) for i in range(1500)]
    lines[1300] = '{"id": 1300, "text": "broken'
    path.write_text("\n".join(lines) + "\n")
    ws = StaticMixtureWorkSource([Dataset.from_path("j", str(tmp_path))], {"j": 1.0}, chunk_size=64)
    pipe = Pipeline(ws).batch(4).options(runner=runner)
    it = iter(pipe)
    assert next(it) is not None  # the stream starts fine
    with pytest.raises(DatasetFormatError, match=r"part-000\.jsonl:1301"):
        for _ in it:
            pass


def test_malformed_jsonl_line_within_the_schema_sample_fails_at_discovery(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"id": 1}\n{"id": 2\n')
    with pytest.raises(DatasetFormatError, match=r"a\.jsonl:2"):
        Dataset.from_path("j", str(tmp_path))


def test_corrupt_parquet_names_the_file(tmp_path):
    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "a.parquet")
    (tmp_path / "b.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(DatasetFormatError, match="b.parquet"):
        Dataset.from_path("p", str(tmp_path))


def test_schema_differing_between_shards_names_the_shard(tmp_path):
    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"x": ["one"]}), tmp_path / "b.parquet")
    with pytest.raises(DatasetFormatError, match="b.parquet"):
        Dataset.from_path("p", str(tmp_path))


def test_missing_path(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="nowhere"):
        Dataset.from_path("p", str(tmp_path / "nowhere"))


def test_unknown_mixture_component_names_it():
    ds = Dataset.from_dict("web", {0: InMemoryShard([{"x": 1}])})
    with pytest.raises(ConfigError, match="cod"):
        StaticMixtureWorkSource([ds], {"web": 0.5, "cod": 0.5}, chunk_size=4)


def test_empty_dataset_is_refused(tmp_path):
    pq.write_table(pa.table({"x": pa.array([], pa.int64())}), tmp_path / "a.parquet")
    with pytest.raises(DatasetFormatError, match="empty|0 rows|no rows"):
        Dataset.from_path("p", str(tmp_path))


def test_missing_field_in_a_transform_reaches_next(tmp_path):
    ds = Dataset.from_dict("d", {0: InMemoryShard([{"x": i} for i in range(10)])})
    ws = StaticMixtureWorkSource([ds], {"d": 1.0}, chunk_size=4)
    pipe = Pipeline(ws).map_transform(lambda p: {"y": p["text"]})
    with pytest.raises(Exception, match="text"):
        collect(pipe)
