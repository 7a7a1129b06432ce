"""Packing is loud, not silent (issue 25): documents first_fit / best_fit drop as longer than
max_length and the final partial row uncapped wrap drops are each warned about once per pass of
a pipeline (not once per lane), with counts that match ``metrics_snapshot()``; and pack_flat
refuses, when it is built, a max_length whose rows train on nothing."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pytest

from tests.ops._tokenizers import make_texts, make_tokenizer
from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.errors import ConfigError, DataDroppedWarning

OVERSIZED = re.compile(
    r"(?P<op>pack_flat|pack_sequences)\(max_length=(?P<max_length>\d+), algorithm='(?P<algorithm>\w+)'\) "
    r"dropped (?P<docs>\d+) of (?P<docs_seen>\d+) documents \((?P<docs_pct>[\d.]+)%\) and (?P<tokens>\d+) of "
    r"(?P<tokens_seen>\d+) tokens \((?P<tokens_pct>[\d.]+)%\) longer than max_length in lane (?P<lane>\d+) so far")
FINAL_ROW = re.compile(r"pack_flat\(algorithm='wrap'\) dropped the final partial row of lane (?P<lane>\d+) "
                       r"\((?P<tokens>\d+) tokens, fewer than max_length=(?P<max_length>\d+)\)")


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
        assert oversized[0].category is DataDroppedWarning
        assert oversized[0].filename == __file__  # points at the loop that iterates, not at the engine
    lanes = counters(pipe)
    assert sorted(lanes) == [0, 1] and all(c["pack_oversized_docs"] > 0 for c in lanes.values())  # both lanes drop


@pytest.mark.parametrize("runner", ["inline", "threads", "process"])
def test_oversized_warning_reports_the_shares_metrics_snapshot_counts(runner):
    # 80 documents, 64 of them longer than max_length; each lane reads 40, all in its first frame
    # (a pass's first frame holds up to 64 rows), so the counts "so far" at the first drop are
    # the lane's final counts.
    docs = [[7] * (200 if i % 5 else 50) for i in range(80)]
    pipe = Pipeline(token_source(docs)).pack_flat(129, algorithm="best_fit", num_bins=4).batch(2) \
        .options(canonical_replicas=2, runner=runner)
    with pytest.warns(DataDroppedWarning) as seen:
        rows = sum(len(b) for b in pipe)
    assert rows == 8  # the 16 short documents, two per row
    [warning] = matching(list(seen), OVERSIZED)
    message = str(warning.message)
    found = OVERSIZED.match(message)
    lane = counters(pipe)[int(found["lane"])]
    assert (int(found["docs"]), int(found["docs_seen"]), int(found["tokens"]), int(found["tokens_seen"])) == (
        lane["pack_oversized_docs"], lane["pack_docs_seen"], lane["pack_oversized_tokens"], lane["pack_tokens_seen"])
    assert (int(found["docs"]), int(found["docs_seen"])) == (32, 40)
    assert found["docs_pct"] == f"{100 * 32 / 40:.1f}" and found["tokens_pct"] == f"{100 * 6400 / 6800:.1f}"
    assert "pack_flat(max_length=129, algorithm='best_fit') dropped 32 of 40 documents (80.0%)" in message
    for way_out in ("drop_oversized=False", "tokenize(split_long_samples=True)", "algorithm='wrap'",
                    "metrics_snapshot()", "pack_oversized_docs/pack_oversized_tokens"):
        assert way_out in message
    totals = {name: sum(c[name] for c in counters(pipe).values()) for name in lane}
    assert totals == {"pack_oversized_docs": 64, "pack_docs_seen": 80, "pack_oversized_tokens": 12800,
                      "pack_tokens_seen": 13600}


def test_no_oversized_warning_when_every_document_fits():
    docs = [[7] * n for n in range(1, 41)] * 2
    pipe = Pipeline(token_source(docs)).pack_flat(64, algorithm="first_fit", num_bins=4).batch(2) \
        .options(canonical_replicas=2)
    [seen] = passes(pipe, 1)
    assert matching(seen, OVERSIZED) == [] and [w for w in seen if w.category is DataDroppedWarning] == []
    lanes = counters(pipe)
    assert sum(c["pack_docs_seen"] for c in lanes.values()) == 80
    assert all("pack_oversized_docs" not in c for c in lanes.values())


def test_drop_oversized_false_refuses_instead_of_warning():
    docs = [[7] * 200] + [[7] * 10] * 9
    pipe = Pipeline(token_source(docs)).pack_flat(129, algorithm="first_fit", num_bins=4, drop_oversized=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataDroppedWarning)  # no warning before the error
        with pytest.raises(ValueError, match="200 tokens, longer than max_length=129"):
            for _batch in pipe:
                pass


# ---------------------------------------------------------------------- uncapped wrap's final row
@pytest.mark.parametrize("runner", ["inline", "threads", "process"])
def test_wrap_final_row_warning_is_given_once_per_pass_with_two_lanes(runner):
    # 20 documents of 5 tokens: each lane reads 10 (50 tokens), makes 6 rows of 8, drops 2.
    pipe = Pipeline(token_source([[3] * 5] * 20)).pack_flat(8, algorithm="wrap").batch(1) \
        .options(canonical_replicas=2, runner=runner)
    first, second = passes(pipe, 2)
    for seen in (first, second):
        [warning] = matching(seen, FINAL_ROW)
        assert warning.category is DataDroppedWarning and issubclass(warning.category, UserWarning)
        found = FINAL_ROW.match(str(warning.message))
        assert (found["tokens"], found["max_length"]) == ("2", "8")
        assert "metrics_snapshot()" in str(warning.message)
    assert counters(pipe) == {0: {"pack_dropped_final_tokens": 2}, 1: {"pack_dropped_final_tokens": 2}}


def test_wrap_final_row_warning_still_names_lane_and_tokens_for_one_lane():
    pipe = Pipeline(token_source([[1] * 5] * 7)).pack_flat(8, algorithm="wrap").batch(1)
    with pytest.warns(UserWarning, match=r"dropped the final partial row of lane 0 \(3 tokens"):
        assert sum(len(b) for b in pipe) == 4  # 35 tokens: 4 rows of 8, 3 dropped


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
