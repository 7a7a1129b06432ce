"""Bad input fails loudly, early, and names the file, line, field or option; nothing hangs."""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon_columnar import Dataset, InMemoryShard, Pipeline, StaticMixtureWorkSource
from zephon_columnar.errors import ConfigError, DatasetFormatError, DatasetNotFoundError
from zephon_columnar.ops.tokenize.paths import TokenizerNotFoundError
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


@pytest.mark.parametrize("runner", ["threads", "process"])
def test_a_failing_user_function_names_the_dataset_and_file_of_the_row(tmp_path, runner):
    for i in range(2):
        pq.write_table(pa.table({"text": ["a", "b", "c"]}), tmp_path / f"part-{i}.parquet")
    web = Dataset.from_path("web", str(tmp_path))
    pipe = Pipeline(StaticMixtureWorkSource([web], {"web": 1.0}, chunk_size=4, seed=3)).options(runner=runner)
    with pytest.raises(KeyError, match=rf"failed on sample \(dataset 'web', shard {tmp_path}/part-\d.parquet \(\d\), row \d\)"):
        collect(pipe.filter(lambda row: row["body"]))
    with pytest.raises(KeyError, match=rf"failed on sample \(dataset 'web', shard {tmp_path}/part-\d.parquet"):
        collect(pipe.map_transform(lambda row: {"y": row["body"]}))


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


def _one_batch():
    return next(iter(_pipe().batch(2)))


def _ws(**kwargs):
    return StaticMixtureWorkSource([Dataset.from_dict("d", {0: InMemoryShard([{"x": 1}])})], {"d": 1.0}, **kwargs)


ALGORITHMS = r"\['first_fit', 'best_fit', 'wrap', 'best_fit_wrap'\]"

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
    # A misspelt keyword: still Python's TypeError, naming the keyword meant (or listing them).
    ("tokenize-keyword-typo",
     lambda t: _pipe().tokenize(tokenizer_id="tok", field="text", add_special_token=True), TypeError,
     [r"Pipeline\.tokenize\(\) got an unexpected keyword argument 'add_special_token'",
      r"did you mean 'special_tokens'\?"]),
    ("shuffle-keyword-typo", lambda t: _pipe().shuffle(buffer=8), TypeError,
     [r"Pipeline\.shuffle\(\) got an unexpected keyword argument 'buffer'", r"did you mean 'buffer_size'\?"]),
    ("pack-flat-keyword-typo", lambda t: _pipe().pack_flat(8, pad_token=0), TypeError,
     [r"pack_flat\(\) got an unexpected keyword argument 'pad_token'", r"did you mean 'pad_token_id'\?"]),
    ("ensure-mixture-keyword-typo", lambda t: _pipe().ensure_mixture(buffer_size=8), TypeError,
     [r"ensure_mixture\(\) got an unexpected keyword argument 'buffer_size'", r"did you mean 'max_buffer_size'\?"]),
    ("batch-keyword-unlike-any", lambda t: _pipe().batch(4, size=2), TypeError,
     [r"batch\(\) got an unexpected keyword argument 'size'",
      r"its keywords are \['microbatch_size', 'drop_last', 'placement'\]"]),
    ("work-source-keyword-typo", lambda t: _ws(chunksize=4), TypeError,
     [r"StaticMixtureWorkSource\(\) got an unexpected keyword argument 'chunksize'", r"did you mean 'chunk_size'\?"]),
    ("from-path-keyword-typo", lambda t: Dataset.from_path("web", _parquet(t), format="parquet"), TypeError,
     [r"Dataset\.from_path\(\) got an unexpected keyword argument 'format'", r"did you mean 'fmt'\?"]),
    ("from-tables-keyword-typo", lambda t: Dataset.from_tables("web", [pa.table({"x": [1]})], shard_id=[0]), TypeError,
     [r"Dataset\.from_tables\(\) got an unexpected keyword argument 'shard_id'", r"did you mean 'shard_ids'\?"]),
    ("to-training-keyword-typo", lambda t: _one_batch().to_training(return_label=True), TypeError,
     [r"SampleBatch\.to_training\(\) got an unexpected keyword argument 'return_label'",
      r"did you mean 'return_labels'\?"]),
    ("to-torch-loader-keyword-typo", lambda t: _pipe().batch(2).to_torch_loader(num_worker=0), TypeError,
     [r"to_torch_loader: 'num_worker' is neither one of to_torch_loader's keywords nor a to_training keyword",
      r"did you mean 'num_workers'\?"]),
    # A string option with a fixed set of values: the option, the value, the closest value, all of them.
    ("pack-flat-algorithm-typo", lambda t: _pipe().pack_flat(8, algorithm="wrapp"), ConfigError,
     [r"pack_flat\(algorithm='wrapp'\)", r"did you mean 'wrap'\?", ALGORITHMS]),
    ("pack-sequences-algorithm-typo", lambda t: _pipe().pack_sequences(8, algorithm="firstfit"), ConfigError,
     [r"pack_sequences\(algorithm='firstfit'\)", r"did you mean 'first_fit'\?", ALGORITHMS]),
    ("shuffle-algorithm-typo", lambda t: _pipe().shuffle(8, algorithm="blok"), ConfigError,
     [r"shuffle\(algorithm='blok'\)", r"did you mean 'block'\?", r"\['streaming', 'block', 'block_warmup'\]"]),
    ("tokenize-special-tokens-typo",
     lambda t: _pipe().tokenize(tokenizer_id="tok", field="text", special_tokens="eoss"), ConfigError,
     [r"tokenize\(special_tokens='eoss'\)", r"did you mean 'eos'\?", r"'bos_eos', 'bos', 'eos', 'none'"]),
    ("pack-flat-shuffle-strategy-true", lambda t: _pipe().pack_flat(8, shuffle_strategy=True), ConfigError,
     [r"pack_flat\(shuffle_strategy=True\) \(a bool\)", r"for True pass 'random'", r"\[None, 'random', 'length'\]"]),
    ("tokenize-chat-loss-scope-typo", lambda t: _pipe().tokenize_chat(tokenizer_id="tok", loss_scope="last"),
     ConfigError, [r"tokenize_chat\(loss_scope='last'\)", r"did you mean 'last_span'\?", r"None, 'all_assistant'"]),
    ("to-training-position-mode-typo", lambda t: _one_batch().to_training(position_mode="seq"), ConfigError,
     [r"to_training\(position_mode='seq'\)", r"did you mean 'sequence'\?", r"\['preserve', 'sequence'\]"]),
    ("batch-drop-last-a-string", lambda t: _pipe().batch(2, drop_last="yes"), ConfigError,
     [r"batch\(drop_last='yes'\) \(a str\): pass True or False"]),
    ("map-transform-drop-none-a-string", lambda t: _pipe().map_transform(lambda p: p, drop_none="no"), ConfigError,
     [r"map_transform\(drop_none='no'\) \(a str\): pass True or False"]),
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
