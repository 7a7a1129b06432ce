"""Packing is loud, not silent (issue 25), and not noisy (issue 44): documents first_fit /
best_fit drop as longer than max_length are warned about once per pass of a pipeline (not once
per lane), at its end, with the pass's totals that match ``metrics_snapshot()``, under their own
class; uncapped wrap's final partial rows, a routine tail, are warned the same way only when
they are more than 1% of the pass's tokens, and logged otherwise; an endless stream is warned
at the first drop, with the lane's counts so far. pack_flat refuses, when it is built, a
max_length whose rows train on nothing."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pytest

from tests.ops._tokenizers import make_texts, make_tokenizer
from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.errors import ConfigError, DataDroppedWarning, OversizedDocumentWarning, PassTailWarning

OVERSIZED = re.compile(
    r"(?P<op>pack_flat|pack_sequences)\(max_length=(?P<max_length>\d+), algorithm='(?P<algorithm>\w+)'\) "
    r"dropped (?P<docs>\d+) of (?P<docs_seen>\d+) documents \((?P<docs_pct>[\d.]+)%\) and (?P<tokens>\d+) of "
    r"(?P<tokens_seen>\d+) tokens \((?P<tokens_pct>[\d.]+)%\) longer than max_length (?P<scope>in this pass \(lanes "
    r"[\d, -]+\)|in lane \d+ so far)")
FINAL_ROW = re.compile(r"pack_flat\(algorithm='wrap'\) dropped (?P<tokens>\d+) of (?P<seen>\d+) tokens \([\d.]+%\) "
                       r"in this pass \(lanes [\d, -]+\), each lane's final partial row \(fewer than "
                       r"max_length=(?P<max_length>\d+)")


def token_source(docs: Sequence[Sequence[int]]) -> StaticMixtureWorkSource:
    """Pre-tokenized documents (an ``input_ids`` list<int32> column), read in order."""
    table = pa.table({"input_ids": pa.array([list(d) for d in docs], pa.list_(pa.int32()))})
    return StaticMixtureWorkSource([Dataset.from_dict("docs", {0: table})], {"docs": 1.0}, chunk_size=len(docs) // 2,
                                   shuffle_shards=False)


def text_source(n: int) -> StaticMixtureWorkSource:
    """``n`` generated texts (1 to 60 words each, the first one empty) to tokenize."""
    table = pa.table({"text": make_texts(n, seed=25)})
    return StaticMixtureWorkSource([Dataset.from_dict("texts", {0: table})], {"texts": 1.0}, chunk_size=n // 2,
                                   shuffle_shards=False)


def passes(pipe: Pipeline, count: int) -> list[list[warnings.WarningMessage]]:
    """Iterate ``pipe`` to its end ``count`` times; the warnings each pass gave (all of them:
    no filter, no once-per-location registry)."""
    out = []
    for _ in range(count):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            for _batch in pipe:
                pass
        out.append(list(seen))
    return out


def matching(seen: list[warnings.WarningMessage], pattern: re.Pattern[str]) -> list[warnings.WarningMessage]:
    return [w for w in seen if pattern.match(str(w.message))]


def counters(pipe: Pipeline) -> dict[int, dict[str, Any]]:
    """``metrics_snapshot()`` lane counters, by lane."""
    out: dict[int, dict[str, Any]] = {}
    for rec in pipe.metrics_snapshot().records:
        if "name" in rec:
            out.setdefault(rec["lane"], {})[rec["name"]] = rec["value"]
    return out


# ---------------------------------------------------------------------- oversized documents
PACKERS: dict[str, Callable[..., Pipeline]] = {
    "pack_flat": lambda pipe, *a, **kw: pipe.pack_flat(*a, **kw).batch(2),
    "pack_sequences": lambda pipe, *a, **kw: pipe.pack_sequences(*a, **kw),
}


@pytest.mark.parametrize("algorithm", ["first_fit", "best_fit"])
@pytest.mark.parametrize("op", ["pack_flat", "pack_sequences"])
def test_oversized_documents_are_warned_about_once_per_pass_with_two_lanes(op, algorithm):
    tokenized = Pipeline(text_source(120)).tokenize(tokenizer=make_tokenizer(), field="text")
    pipe = PACKERS[op](tokenized, 48, algorithm=algorithm, num_bins=4).options(canonical_replicas=2)
    first, second = passes(pipe, 2)
    for seen in (first, second):
        oversized = matching(seen, OVERSIZED)
        assert len(oversized) == 1, [str(w.message) for w in seen]
        assert oversized[0].category is OversizedDocumentWarning and issubclass(DataDroppedWarning, UserWarning)
        assert oversized[0].filename == __file__  # points at the loop that iterates, not at the engine
        assert "in this pass (lanes 0, 1)" in str(oversized[0].message)
    lanes = counters(pipe)
    assert sorted(lanes) == [0, 1] and all(c["pack_oversized_docs"] > 0 for c in lanes.values())  # both lanes drop


@pytest.mark.parametrize("runner", ["inline", "threads", "process"])
def test_oversized_warning_reports_the_shares_metrics_snapshot_counts(runner):
    # 80 documents, 64 of them longer than max_length, over two lanes: the warning at the end of
    # the pass gives the pass's totals.
    docs = [[7] * (200 if i % 5 else 50) for i in range(80)]
    pipe = Pipeline(token_source(docs)).pack_flat(129, algorithm="best_fit", num_bins=4).batch(2) \
        .options(canonical_replicas=2, runner=runner)
    with pytest.warns(OversizedDocumentWarning) as seen:
        rows = sum(len(b) for b in pipe)
    assert rows == 8  # the 16 short documents, two per row
    [warning] = matching(list(seen), OVERSIZED)
    message = str(warning.message)
    found = OVERSIZED.match(message)
    names = ("pack_oversized_docs", "pack_docs_seen", "pack_oversized_tokens", "pack_tokens_seen")
    totals = {name: sum(c[name] for c in counters(pipe).values()) for name in names}
    assert totals == {"pack_oversized_docs": 64, "pack_docs_seen": 80, "pack_oversized_tokens": 12800,
                      "pack_tokens_seen": 13600}
    assert (int(found["docs"]), int(found["docs_seen"]), int(found["tokens"]), int(found["tokens_seen"])) == (
        64, 80, 12800, 13600)
    assert found["docs_pct"] == "80" and found["tokens_pct"] == f"{100 * 12800 / 13600:.3g}"
    assert "pack_flat(max_length=129, algorithm='best_fit') dropped 64 of 80 documents (80%)" in message
    for way_out in ("drop_oversized=False", "tokenize(split_long_samples=True)", "algorithm='wrap'",
                    "metrics_snapshot()", "pack_oversized_docs/pack_oversized_tokens"):
        assert way_out in message


def test_no_oversized_warning_when_every_document_fits():
    docs = [[7] * n for n in range(1, 41)] * 2
    pipe = Pipeline(token_source(docs)).pack_flat(64, algorithm="first_fit", num_bins=4).batch(2) \
        .options(canonical_replicas=2)
    [seen] = passes(pipe, 1)
    assert matching(seen, OVERSIZED) == [] and [w for w in seen if issubclass(w.category, DataDroppedWarning)] == []
    lanes = counters(pipe)
    assert sum(c["pack_docs_seen"] for c in lanes.values()) == 80
    assert all("pack_oversized_docs" not in c for c in lanes.values())


def test_drop_oversized_false_refuses_instead_of_warning():
    docs = [[7] * 200] + [[7] * 10] * 9
    pipe = Pipeline(token_source(docs)).pack_flat(129, algorithm="first_fit", num_bins=4, drop_oversized=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataDroppedWarning)  # no warning before the error (any subclass)
        with pytest.raises(ValueError, match="200 tokens, longer than max_length=129"):
            for _batch in pipe:
                pass


# ---------------------------------------------------------------------- uncapped wrap's final row
@pytest.mark.parametrize("runner", ["inline", "threads", "process"])
def test_wrap_final_row_warning_is_given_once_per_pass_with_two_lanes(runner):
    # 20 documents of 5 tokens: each lane reads 10 (50 tokens), makes 6 rows of 8, drops 2: 4%
    # of the pass's tokens, more than a routine tail's 1%, so warned.
    pipe = Pipeline(token_source([[3] * 5] * 20)).pack_flat(8, algorithm="wrap").batch(1) \
        .options(canonical_replicas=2, runner=runner)
    first, second = passes(pipe, 2)
    for seen in (first, second):
        [warning] = matching(seen, FINAL_ROW)
        assert warning.category is PassTailWarning and issubclass(warning.category, DataDroppedWarning)
        found = FINAL_ROW.match(str(warning.message))
        assert (found["tokens"], found["seen"], found["max_length"]) == ("4", "100", "8")
        assert "metrics_snapshot()" in str(warning.message) and warning.filename == __file__
    assert {lane: c["pack_dropped_final_tokens"] for lane, c in counters(pipe).items()} == {0: 2, 1: 2}


def test_wrap_final_row_warning_gives_the_tokens_for_one_lane():
    pipe = Pipeline(token_source([[1] * 5] * 7)).pack_flat(8, algorithm="wrap").batch(1)
    with pytest.warns(PassTailWarning, match=r"dropped 3 of 35 tokens \(8.57%\) in this pass \(lanes 0\)"):
        assert sum(len(b) for b in pipe) == 4  # 35 tokens: 4 rows of 8, 3 dropped


def test_a_routine_tail_under_one_percent_is_logged_not_warned(caplog):
    # 2,000 documents of 5 tokens in one lane: 10,000 tokens, 1,250 rows of 8, nothing dropped;
    # one more document of 3 tokens: 3 of 10,003 tokens dropped (0.03%), and 1,250 rows into
    # batches of 7 leave 4 rows (0.32%).
    docs = [[3] * 5] * 2000 + [[3] * 3]
    pipe = Pipeline(token_source(docs)).pack_flat(8, algorithm="wrap").batch(7)
    with caplog.at_level("INFO", logger="zephon_columnar"):
        [seen] = passes(pipe, 1)
    assert [w for w in seen if issubclass(w.category, DataDroppedWarning)] == []
    logged = [r.getMessage() for r in caplog.records if r.name == "zephon_columnar"]
    assert any("dropped 3 of 10003 tokens (0.03%)" in m for m in logged), logged
    assert any("batch(7) dropped 4 of 1250 rows (0.32%)" in m for m in logged), logged


def test_an_endless_stream_is_warned_at_the_first_drop_with_the_counts_so_far():
    docs = [[7] * (200 if i % 5 else 50) for i in range(80)]
    table = pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32()))})
    source = StaticMixtureWorkSource([Dataset.from_dict("docs", {0: table})], {"docs": 1.0}, chunk_size=40,
                                     exhausted_policy="repeat")
    pipe = Pipeline(source).pack_flat(129, algorithm="best_fit", num_bins=4).batch(2)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        it = iter(pipe)
        for _ in range(30):
            next(it)
        it.close()
    [warning] = matching(list(seen), OVERSIZED)
    assert OVERSIZED.match(str(warning.message))["scope"] == "in lane 0 so far"
    assert "the stream has no end" in str(warning.message) and warning.category is OversizedDocumentWarning


# ---------------------------------------------------------------------- max_length refused at build time
@pytest.mark.parametrize("algorithm", ["wrap", "first_fit", "best_fit_wrap"])
@pytest.mark.parametrize("max_length", [1, 0])
def test_pack_flat_max_length_below_2_is_refused_at_build_time(max_length, algorithm):
    options = {"num_bins": 4} if algorithm == "first_fit" else {}
    pipe = Pipeline(token_source([[1, 2, 3]] * 4))
    with pytest.raises(ConfigError, match=rf"pack_flat\(max_length={max_length}\): pass the packed row length, "
                                          r"an int >= 2 .*to_training\(return_labels=True\)") as raised:
        pipe.pack_flat(max_length, algorithm=algorithm, **options)  # built, never iterated
    assert isinstance(raised.value, ValueError)


def test_pack_flat_max_length_2_trains_on_one_token_per_row():
    pipe = Pipeline(token_source([[1, 2, 3, 4]] * 4)).pack_flat(2, algorithm="wrap").batch(2)
    t = next(iter(pipe)).to_training(return_labels=True)
    assert tuple(t["input_ids"].shape) == (2, 1) and tuple(t["labels"].shape) == (2, 1)


@pytest.mark.parametrize("algorithm, options", [("wrap", {}), ("best_fit_wrap", {}),
                                                 ("first_fit", {"num_bins": 2}), ("best_fit", {"num_bins": 2})])
def test_pack_sequences_max_length_1_is_allowed_and_its_rows_hold_a_token(algorithm, options):
    # pack_sequences keeps segments apart and is not shifted by to_training: a row of one token
    # is a whole one-token document (first_fit/best_fit) or a slice of one, never an empty row.
    docs = [[1], [2, 3], [4], [5, 6, 7]]
    pipe = Pipeline(token_source(docs)).pack_sequences(1, algorithm=algorithm, **options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataDroppedWarning)  # first_fit/best_fit drop the longer documents
        rows = [[s["input_ids"] for s in r.payload["packed_samples"]] for r in pipe]
    assert rows and all(len(row) == 1 and len(row[0]) == 1 for row in rows)  # one segment of one token
    kept = [t for row in rows for [t] in row]
    if algorithm in ("first_fit", "best_fit"):
        assert sorted(kept) == [1, 4]  # whole documents only
    else:
        assert sorted(kept) == [1, 2, 3, 4, 5, 6, 7]  # sliced, nothing lost


# ---------------------------------------------------------------------- the default path
def test_pack_flat_with_only_max_length_packs_without_failing_or_dropping_a_document():
    """Found by a new-user probe: pack_flat(128) failed (first_fit needs num_bins) and, once
    num_bins was given, dropped the long documents. Alone, max_length now means wrap: every
    token but each lane's final partial row is delivered; with num_bins, first_fit as in Zephon."""
    docs = [[5] * (300 if i % 4 == 0 else 40) for i in range(60)]
    pipe = Pipeline(token_source(docs)).pack_flat(128).batch(2, drop_last=False)
    [seen] = passes(pipe, 1)
    tokens = sum(int(t) for b in pipe for t in b.to_training()["input_ids"].shape[:1]) * 128
    dropped = sum(c.get("pack_dropped_final_tokens", 0) for c in counters(pipe).values())
    assert tokens + dropped == sum(map(len, docs)) and dropped < 128
    assert [w for w in seen if issubclass(w.category, OversizedDocumentWarning)] == []
    assert Pipeline(token_source(docs)).pack_flat(128, num_bins=4).spec.ops[-1].spec.algorithm == "first_fit"
    with pytest.raises(ConfigError, match="num_bins is required"):
        Pipeline(token_source(docs)).pack_sequences(128)  # as in Zephon
