"""The realized mixture: per-component counts, the starved-component warning, and the column
check that finds its usual cause before the first row is read.

Found by a new-user probe: two datasets with different columns in a 50/50 mixture and
``filter(pl.col("text").str.len_chars() > 10)``: the dataset without ``text`` got nulls, the
filter turned them into False, and the stream was 100/0 with no word.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.ops._tokenizers import make_tokenizer
from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.errors import ConfigurationWarning, StarvedComponentWarning

TEXTS = [f"document {i} says {' '.join(['words'] * (1 + i % 9))}" for i in range(240)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """web: column 'text'; code: column 'content' (no 'text'); books: 'text', long rows."""
    root = tmp_path_factory.mktemp("mix")
    for name, column, texts in (("web", "text", TEXTS), ("code", "content", TEXTS[::-1]),
                                ("books", "text", [t * 4 for t in TEXTS])):
        (root / name).mkdir()
        for s in range(2):
            pq.write_table(pa.table({column: texts[s::2]}), root / name / f"part-{s}.parquet", row_group_size=32)
    return root


def mixture(corpus: Path, names=("web", "code"), **source) -> StaticMixtureWorkSource:
    datasets = [Dataset.from_path(n, str(corpus / n)) for n in names]
    return StaticMixtureWorkSource(datasets, {n: 1.0 for n in names}, chunk_size=16, seed=5, **source)


def run(pipe: Pipeline) -> tuple[list, list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        items = list(pipe)
    return items, seen


def counters(pipe: Pipeline, prefix: str) -> Counter:
    out: Counter = Counter()
    for r in pipe.metrics_snapshot().records:
        if r["name"].startswith(prefix):
            out[r["name"][len(prefix):]] += r["value"]
    return out


@pytest.mark.parametrize("runner", ["inline", "threads", "process"])
@pytest.mark.parametrize("lanes", [1, 3])
def test_a_filter_on_a_column_one_dataset_lacks_is_warned_before_and_after(corpus, runner, lanes):
    pipe = (Pipeline(mixture(corpus)).filter(pl.col("text").str.len_chars() > 10).batch(4)
            .options(runner=runner, canonical_replicas=lanes))
    items, seen = run(pipe)
    before = [w for w in seen if issubclass(w.category, ConfigurationWarning)]
    starved = [w for w in seen if issubclass(w.category, StarvedComponentWarning)]
    assert len(before) == 1 and "reads column 'text', which dataset 'code'" in str(before[0].message)
    assert len(starved) == 1, [str(w.message) for w in seen]  # once per pass, whatever the lanes
    assert "'code' delivered 0 of the" in str(starved[0].message)
    assert Path(starved[0].filename).name == "test_realized.py"  # points at the user's loop
    assert counters(pipe, "component_rows_read.") == {"web": 240, "code": 240}
    assert counters(pipe, "component_rows_delivered.") == {"web": 240, "code": 0}
    assert sum(b.table.num_rows for b in items) == 240
    assert "code 240 (50%) -> 0 (0%)" in pipe.explain()


def test_a_filter_every_dataset_can_answer_is_not_warned_and_counts_equal_the_stream(corpus):
    # fill_null: the code rows are kept on purpose; an even filter keeps the shares
    pipe = (Pipeline(mixture(corpus)).filter(pl.col("text").fill_null("kept on purpose").str.len_chars() > 12)
            .batch(4, drop_last=False).options(runner="threads", canonical_replicas=2))
    items, seen = run(pipe)
    assert not [w for w in seen if issubclass(w.category, (ConfigurationWarning, StarvedComponentWarning))]
    delivered = Counter()
    for batch in items:
        for did in batch.table.column("__dataset").to_pylist():
            delivered[["web", "code"][did]] += 1
    assert counters(pipe, "component_rows_delivered.") == delivered
    assert delivered["code"] == 240


def test_packed_rows_count_documents_and_tokens_per_component(corpus):
    tok = make_tokenizer()
    pipe = (Pipeline(mixture(corpus, names=("web", "books")))
            .tokenize(tokenizer=tok, field="text", max_length=24, split_long_samples=True)
            .pack_flat(32, algorithm="wrap").batch(2, drop_last=False).options(runner="inline", canonical_replicas=2))
    items, seen = run(pipe)
    assert not [w for w in seen if issubclass(w.category, StarvedComponentWarning)]
    docs = counters(pipe, "component_rows_delivered.")
    tokens = counters(pipe, "component_tokens_delivered.")
    # every document ends in one packed row but those of the final partial rows wrap drops
    assert 230 <= docs["web"] <= 240 and 230 <= docs["books"] <= 240
    assert sum(tokens.values()) == sum(len(ids) for b in items for ids in b.table.column("input_ids").to_pylist())
    assert tokens["books"] > 3 * tokens["web"]


def test_a_component_an_operator_mostly_drops_is_starved_but_oversized_books_are_not_silent(corpus):
    tok = make_tokenizer()
    # first_fit drops documents longer than max_length: nearly every book, few web pages
    pipe = (Pipeline(mixture(corpus, names=("web", "books"))).tokenize(tokenizer=tok, field="text")
            .pack_flat(24, algorithm="first_fit", num_bins=4).batch(2).options(runner="inline"))
    _, seen = run(pipe)
    starved = [str(w.message) for w in seen if issubclass(w.category, StarvedComponentWarning)]
    assert len(starved) == 1 and "'books' delivered" in starved[0] and "'web'" not in starved[0]


def test_a_restored_run_is_not_judged_on_rows_read_before_the_checkpoint(corpus):
    def build():
        return (Pipeline(mixture(corpus)).filter(pl.col("text").fill_null("x" * 20).str.len_chars() > 10)
                .shuffle(64, seed=1).batch(4).options(runner="inline"))

    pipe = build()
    it = iter(pipe)
    for _ in range(100):  # near the end: the shuffle buffer holds rows of both, the source little
        next(it)
    ckpt = json.loads(json.dumps(pipe.checkpoint()))
    it.close()
    resumed = build()
    resumed.restore(ckpt)
    _, seen = run(resumed)
    assert not [w for w in seen if issubclass(w.category, StarvedComponentWarning)]


def test_the_column_check_follows_declared_writes_and_stops_at_a_callable(corpus):
    renamed = (Pipeline(mixture(corpus)).map_transform(pl.coalesce("text", "content").alias("body"))
               .filter(pl.col("body").str.len_chars() > 3).batch(4).options(runner="inline"))
    _, seen = run(renamed)
    assert not [w for w in seen if issubclass(w.category, (ConfigurationWarning, StarvedComponentWarning))]
    after_callable = (Pipeline(mixture(corpus)).map_transform(lambda row: {"text": row.get("text") or row["content"]})
                      .filter(pl.col("text").str.len_chars() > 3).batch(4).options(runner="inline"))
    _, seen = run(after_callable)
    assert not [w for w in seen if issubclass(w.category, (ConfigurationWarning, StarvedComponentWarning))]
