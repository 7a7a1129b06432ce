"""Bad input fails loudly, early, and names the file, line, field or option; nothing hangs."""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon_columnar import Dataset, InMemoryShard, Pipeline, StaticMixtureWorkSource
from zephon_columnar.errors import ConfigError, DatasetFormatError, DatasetNotFoundError
from zephon_columnar.ops.tokenizer import TokenizerNotFoundError
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


# ------------------------------------------------------------------ bad calls: one row each
def _pipe() -> Pipeline:
    ds = Dataset.from_dict("d", {0: InMemoryShard([{"text": "a b"}] * 8)})
    return Pipeline(StaticMixtureWorkSource([ds], {"d": 1.0}, chunk_size=4))


def _parquet(tmp_path):
    pq.write_table(pa.table({"text": ["a", "b"]}), tmp_path / "part-0.parquet")
    return str(tmp_path)


def _tokenizer_typo(tmp_path):
    (tmp_path / "my_tokenizer").mkdir()
    (tmp_path / "my_tokenizer" / "tokenizer.json").write_text("{}")
    return _pipe().tokenize(tokenizer_id=str(tmp_path / "my_tokenzier") + "/", field="text")


def _tokenizer_suffix_typo(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    return _pipe().tokenize(tokenizer_id=str(tmp_path / "tokenizer.jsn"), field="text")


def _garbage_tar(tmp_path):
    import random

    (tmp_path / "shard-000.tar").write_bytes(random.Random(0).randbytes(3000))
    return Dataset.from_path("w", str(tmp_path))


def _gzipped_tar(tmp_path):
    import gzip

    (tmp_path / "shard-000.tar").write_bytes(gzip.compress(bytes(4096)))
    return Dataset.from_path("w", str(tmp_path))


def _mds_index_of_no_mds_shards(tmp_path):
    (tmp_path / "index.json").write_text(json.dumps({"version": 2, "shards": [{"raw_data": {}}]}))
    (tmp_path / "shard.00000.mds").write_bytes(bytes(64))
    return Dataset.from_path("m", str(tmp_path))


#: (id, call(tmp_path), the exact exception class, words the message must hold (a regex each)).
BAD_CALLS = [
    ("progress-every-not-a-number", lambda t: _pipe().show_progress(every_s="fast"), ConfigError,
     [r"show_progress: every_s='fast'", r"every_s=10\.0", r"every_s=None"]),
    ("progress-every-negative", lambda t: _pipe().show_progress(every_s=-1), ConfigError,
     [r"every_s=-1 is not a number of seconds >= 0"]),
    ("from-path-path-an-int", lambda t: Dataset.from_path("web", 42), TypeError,
     [r"Dataset\.from_path\('web', path=42\)", "not a path but an int", "a list of them"]),
    ("from-path-name-an-int", lambda t: Dataset.from_path(42, _parquet(t)), TypeError,
     [r"name=42", "not a str but an int", r"Dataset\.from_path\(\"web\""]),
    ("from-path-name-empty", lambda t: Dataset.from_path("", _parquet(t)), ConfigError, [r"name=''", "empty"]),
    ("from-path-list-item-an-int", lambda t: Dataset.from_path("web", [_parquet(t) + "/part-0.parquet", 3]),
     TypeError, [r"path\[1\]=3", "not a path but an int"]),
    ("tokenizer-folder-typo", _tokenizer_typo, TokenizerNotFoundError,
     ["no such file or folder", r"my_tokenzier\)", r"Did you mean .*my_tokenizer\?", r"holds \['my_tokenizer/'\]"]),
    ("tokenizer-suffix-typo", _tokenizer_suffix_typo, TokenizerNotFoundError,
     [r"tokenizer\.jsn", r"Did you mean .*tokenizer\.json\?"]),
    ("webdataset-garbage-tar", _garbage_tar, DatasetFormatError,
     [r"shard-000\.tar is not a tar archive", "no tar header at byte 0", "uncompressed tar"]),
    ("webdataset-gzipped-tar", _gzipped_tar, DatasetFormatError,
     [r"shard-000\.tar is not a tar archive", "gzip-compressed", "decompress it"]),
    ("mds-index-of-no-mds-shards", _mds_index_of_no_mds_shards, DatasetFormatError,
     [r"index\.json lists no MDS shards", r'"format": "mds"']),
]


@pytest.mark.parametrize("call, cls, words", [row[1:] for row in BAD_CALLS], ids=[row[0] for row in BAD_CALLS])
def test_a_bad_call_fails_at_once_naming_the_problem_and_the_fix(tmp_path, call, cls, words):
    with pytest.raises(Exception) as info:
        call(tmp_path)
    assert type(info.value) is cls, f"{type(info.value).__name__}: {info.value}"
    for pattern in words:
        assert re.search(pattern, str(info.value)), f"{pattern!r} not in: {info.value}"


def test_a_missing_tokenizer_path_is_a_file_not_found_error_and_still_a_config_error(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        _pipe().tokenize(tokenizer_id=str(tmp_path / "nowhere" / "tokenizer.json"), field="text")
    assert isinstance(info.value, ConfigError) and "never downloads" not in str(info.value)
    assert f"{tmp_path / 'nowhere'} does not exist" in str(info.value)
