"""Data dropped on purpose is said once per pass in the process the training loop runs in, with
the pass's totals, pointing at the loop: whatever the runner, the side process (mtp_mode) or the
loader workers. Found by a new-user probe: a 2-worker loader printed four warnings, each with
its worker's counts, located at torch's fetch.py; the demo silenced DataDroppedWarning, which
also carried a drop of most of the tokens.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pyarrow as pa
import pytest

from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.errors import DataDroppedWarning, OversizedDocumentWarning, PassTailWarning

# 1,600 documents, every fifth 200 tokens long (oversized for rows of 129), the others 50.
DOCS = [[7] * (200 if i % 5 == 0 else 50) for i in range(1600)]


def build(**options) -> Pipeline:
    table = pa.table({"input_ids": pa.array(DOCS, pa.list_(pa.int32()))})
    source = StaticMixtureWorkSource([Dataset.from_dict("docs", {0: table})], {"docs": 1.0}, chunk_size=100)
    return (Pipeline(source).pack_flat(129, algorithm="first_fit", num_bins=4).batch(2)
            .options(canonical_replicas=4, **options))


def drops(caught: list[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    return [w for w in caught if issubclass(w.category, DataDroppedWarning)]


def expected_message() -> str:
    """The totals every lane dropped, as an in-process pass counts them."""
    pipe = build(runner="inline")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataDroppedWarning)
        for _ in pipe:
            pass
    totals: dict[str, int] = {}
    for record in pipe.metrics_snapshot().records:
        totals[record["name"]] = totals.get(record["name"], 0) + record["value"]
    assert totals["pack_oversized_docs"] == 320
    return (f"dropped {totals['pack_oversized_docs']} of {totals['pack_docs_seen']} documents (20%) and "
            f"{totals['pack_oversized_tokens']} of {totals['pack_tokens_seen']} tokens")


@pytest.mark.parametrize("workers", [0, 2])
def test_a_torch_loader_says_each_loss_once_in_the_trainer_with_the_ranks_totals(workers, capfd):
    expected = expected_message()
    loader = build().to_torch_loader(num_workers=workers, timeout=120 if workers else 0)
    for _ in range(2):  # every pass says it again
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _batch in loader:
                pass
        said = drops(caught)
        assert [w.category for w in said] == [OversizedDocumentWarning], [str(w.message) for w in said]
        assert expected in str(said[0].message) and "in this pass (lanes 0-3)" in str(said[0].message)
        assert Path(said[0].filename) == Path(__file__)  # the loop, not torch's fetch.py
    assert "Warning" not in capfd.readouterr().err  # no loader worker said anything itself


@pytest.mark.parametrize("options", [{"runner": "threads"}, {"runner": "process"}, {"mtp_mode": True}])
def test_every_runner_and_the_side_process_say_it_in_the_trainer(options):
    expected = expected_message()
    pipe = build(**options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _batch in pipe:
            pass
    said = drops(caught)
    assert len(said) == 1 and expected in str(said[0].message), [str(w.message) for w in said]
    assert Path(said[0].filename) == Path(__file__)


def test_a_pass_closed_early_says_nothing_and_metrics_still_count():
    pipe = build(runner="inline")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        it = iter(pipe)
        for _ in range(5):
            next(it)
        it.close()
    assert drops(caught) == []
    assert sum(r["value"] for r in pipe.metrics_snapshot().records if r["name"] == "pack_oversized_docs") > 0


def test_a_small_routine_tail_is_logged_and_a_large_one_warned(caplog):
    def wrap(docs: int) -> Pipeline:
        table = pa.table({"input_ids": pa.array([[3] * 5] * docs + [[3] * 3], pa.list_(pa.int32()))})
        source = StaticMixtureWorkSource([Dataset.from_dict("d", {0: table})], {"d": 1.0}, chunk_size=64)
        return Pipeline(source).pack_flat(8, algorithm="wrap").batch(1)

    for docs, warned in ((4000, False), (20, True)):
        with caplog.at_level("INFO", logger="zephon_columnar"), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in wrap(docs):
                pass
        assert [w.category for w in drops(caught)] == ([PassTailWarning] if warned else [])
        assert any("each lane's final partial row" in r.getMessage() for r in caplog.records) != warned
        caplog.clear()


def test_a_restored_pass_logs_its_routine_tail_its_share_of_the_pass_unknown(caplog):
    table = pa.table({"input_ids": pa.array([[3] * 5] * 20 + [[3] * 3], pa.list_(pa.int32()))})
    source = StaticMixtureWorkSource([Dataset.from_dict("d", {0: table})], {"d": 1.0}, chunk_size=8)
    build_small = lambda: Pipeline(source).pack_flat(8, algorithm="wrap").batch(1)  # noqa: E731
    pipe = build_small()
    it = iter(pipe)
    next(it)
    ckpt = pipe.checkpoint()
    it.close()
    resumed = build_small()
    resumed.restore(ckpt)
    with caplog.at_level("INFO", logger="zephon_columnar"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in resumed:
            pass
    assert drops(caught) == []  # 3 of 106 tokens would be warned in a whole pass (the previous test)
    assert any("each lane's final partial row" in r.getMessage() for r in caplog.records)
