"""Pipeline.validate / auto-validation of add_op operators, and tokenizer preflight."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pytest

from zephon_columnar import Dataset, InMemoryShard, Pipeline, StaticMixtureWorkSource
from zephon_columnar.ops import BaseOp, ColumnarOp, OpTraits
from zephon_columnar.validation import ValidationError


def pipe() -> Pipeline:
    ds = Dataset.from_dict("d", {0: InMemoryShard([{"text": f"t{i}", "value": i} for i in range(8)])})
    return Pipeline(StaticMixtureWorkSource([ds], {"d": 1.0}, chunk_size=4))


class Pure(ColumnarOp):
    def traits(self):
        return OpTraits(preserves_cursor_order=True)

    def process_columns(self, batch):
        return batch.append_column("twice", pa.compute.multiply(batch.column("value"), 2))


class Counting(BaseOp):
    """Keeps a counter across calls: the hidden state validation must catch."""

    def __init__(self):
        super().__init__()
        self.calls = itertools.count()

    def traits(self):
        return OpTraits(preserves_cursor_order=True)

    def process_many(self, elems):
        n = next(self.calls)
        for r in elems:
            r.payload = {**r.payload, "n": n}
        return elems


def test_pure_op_passes_and_runs():
    p = pipe().add_op(Pure())
    assert p.validate().ok
    assert [r.payload["twice"] for r in p] == [2 * i for i in range(8)]


def test_stateful_process_many_is_refused_at_iteration():
    p = pipe().add_op(Counting())
    report = p.validate()
    assert [i.code for i in report.errors] == ["OP_CROSS_CALL_STATE"]
    with pytest.raises(ValidationError, match="OP_CROSS_CALL_STATE"):
        iter(p)
    p.options(auto_validation="off")
    assert len(list(p)) == 8


def test_kwargs_form_returning_dicts_is_reported():
    p = pipe().add_op("bad", process_many=lambda elems: [e.payload for e in elems], preserves_cursor_order=True)
    assert [i.code for i in p.validate().errors] == ["OP_OUTPUT_NOT_STREAM_ITEM"]


def test_preflight_passes_a_loadable_tokenizer_and_reports_a_broken_one(tmp_path):
    from tests.ops._tokenizers import make_tokenizer, save_folder

    good = save_folder(tmp_path / "good", make_tokenizer())
    for p in (pipe().tokenize(tokenizer=make_tokenizer(), field="text"),
              pipe().add_op(Pure()).tokenize(tokenizer_id=str(good), field="text")):
        report = p.preflight_tokenizers()
        assert report.ok and report.issues == []
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tokenizer.json").write_text("{ this is not a tokenizer")
    p = pipe().add_op(Pure()).tokenize(tokenizer_id=str(broken), field="text")
    report = p.preflight_tokenizers(strict=False)
    assert not report.ok
    assert [i.code for i in report.errors] == ["TOKENIZER_PREFLIGHT_FAILED"]  # the tokenizer only, not Pure
    assert str(broken) in report.format()
    with pytest.raises(ValidationError, match="TOKENIZER_PREFLIGHT_FAILED"):
        p.preflight_tokenizers()


def test_warn_mode_warns_and_runs():
    p = pipe().add_op(Counting()).options(auto_validation="warn")
    with pytest.warns(UserWarning, match="OP_CROSS_CALL_STATE"):
        it = iter(p)
    assert len(list(it)) == 8
