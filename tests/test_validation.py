"""Pipeline.validate / auto-validation of add_op operators (the operator checks), and
tokenizer preflight. The accumulator checks are in test_validation_accumulators.py, the static
scan in test_validation_static.py."""

from __future__ import annotations

import copy
import itertools
import random
import threading
import warnings
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from zephon_columnar import Dataset, InMemoryShard, Pipeline, StaticMixtureWorkSource
from zephon_columnar import validation
from zephon_columnar.ops import (
    BaseOp,
    ColumnarOp,
    CountingAccumulator,
    OpContext,
    OpTraits,
    spawn_child,
    tombstones_for_record,
)
from zephon_columnar.ops.user import FunctionOp
from zephon_columnar.records import SampleMeta, SampleRecord
from zephon_columnar.validation import ValidationError, ValidationReport, validate_ops


def pipe() -> Pipeline:
    ds = Dataset.from_dict("d", {0: InMemoryShard([{"text": f"t{i}", "value": i} for i in range(8)])})
    return Pipeline(StaticMixtureWorkSource([ds], {"d": 1.0}, chunk_size=4))


def errors(report: ValidationReport) -> list[str]:
    return [i.code for i in report.errors]


def warning_codes(report: ValidationReport) -> set[str]:
    return {i.code for i in report.warnings}


def kwargs_op(fn, **kw) -> FunctionOp:
    kw.setdefault("preserves_cursor_order", True)
    return FunctionOp(fn.__name__, process_many=fn, **kw)


def records_like(payloads: list[dict], lanes: int = 2, lineage: tuple[int, ...] = ()) -> list[SampleRecord]:
    """Validation samples: one record per payload, spread over ``lanes`` lanes."""
    return [SampleRecord(SampleMeta(sample_id=(0, i % lanes, i), lane_id=i % lanes, chunk_id=0, chunk_offset=i,
                                    lineage=lineage), dict(p)) for i, p in enumerate(payloads)]


# ---------------------------------------------------------------- good operators
class Pure(ColumnarOp):
    def traits(self):
        return OpTraits(preserves_cursor_order=True)

    def process_columns(self, batch):
        return batch.append_column("twice", pc.multiply(batch.column("value"), 2))


class _Model:
    def __init__(self, name: str) -> None:
        self.name = name

    def score(self, texts: list[str]) -> list[float]:
        return [min(1.0, len(t) / 40) for t in texts]


class QualityScoreOp(BaseOp):
    """The guide's shape: a model built per worker in setup, records grouped by 64."""

    def __init__(self, model_name: str) -> None:
        super().__init__()
        self._model_name = model_name
        self._model: _Model | None = None

    def setup(self, ctx: OpContext) -> None:
        super().setup(ctx)
        self._model = _Model(self._model_name)

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True, parallelism=4)

    def accumulator(self, *, deterministic: bool, ctx: dict[str, Any]):
        return CountingAccumulator(max_batch=64)

    def process_many(self, elems):
        scores = self._model.score([record.payload["text"] for record in elems])
        for record, quality in zip(elems, scores, strict=True):
            record.payload = {**record.payload, "quality": quality}
        return elems


def split_in_two(records):
    """Fan-out done right: two children per record, via spawn_child."""
    out = []
    for r in records:
        for i in range(2):
            out.append(SampleRecord(spawn_child(r.meta, i, is_last_child=i == 1), {**r.payload, "half": i}))
    return out


def drop_odd(records):
    """Dropping done right: tombstones for what is left out."""
    out = []
    for r in records:
        out += tombstones_for_record(r) if r.payload["value"] % 2 else [r]
    return out


def fan_out_columns(batch):
    """The columnar hook fanning out: every row twice."""
    rows = [i for i in range(batch.num_rows) for _ in range(2)]
    return batch.take(pa.array(rows)), rows


def per_record_score(records):
    for r in records:
        r.payload = {**r.payload, "score": len(r.payload["text"]) + r.payload["value"]}
    return records


def as_arrays(records):
    """Tensors and arrays in payloads: equal ones must compare equal (their pickles differ)."""
    import numpy as np
    import torch

    for r in records:
        r.payload = {**r.payload, "ids": torch.tensor([r.payload["value"], 1]), "mask": np.ones(2, np.int8)}
    return records


GOOD_OPS = {
    "columnar": (lambda: Pure(), True),
    "quality score (guide)": (lambda: QualityScoreOp("quality-classifier-v2"), True),
    "kwargs + CountingAccumulator(64)": (lambda: kwargs_op(per_record_score, parallelism=4,
                                                           accumulator=lambda: CountingAccumulator(max_batch=64)),
                                         False),
    "fan-out with spawn_child": (lambda: kwargs_op(split_in_two), False),
    "drop with tombstones": (lambda: kwargs_op(drop_odd), False),
    "columnar fan-out with rows": (lambda: FunctionOp("fan", process_columns=fan_out_columns,
                                                      preserves_cursor_order=True), False),
    "calibration replayable": (lambda: kwargs_op(per_record_score, calibration_replayable=True), False),
}


@pytest.mark.parametrize("form", GOOD_OPS)
def test_good_operators_pass_and_run_under_strict_auto_validation(form):
    make, instance = GOOD_OPS[form]
    report = validate_ops([make()])
    assert report.ok and report.errors == []
    # Only the instance-form notice, exactly where Zephon gives it.
    assert warning_codes(report) == ({"OP_INSTANCE_RUNTIME_CHECKS_SKIPPED"} if instance else set())
    assert len(list(pipe().add_op(make()))) >= 4  # auto_validation="strict" is the default


def test_equal_tensors_and_arrays_in_payloads_compare_equal():
    assert validate_ops([kwargs_op(as_arrays, calibration_replayable=True)]).issues == []


def test_probes_are_set_up_copies_and_the_users_instance_is_left_alone():
    op = QualityScoreOp("m")
    assert validate_ops([op]).ok
    assert op._model is None  # setup ran on copies only


def test_pure_op_passes_and_runs():
    p = pipe().add_op(Pure())
    assert p.validate().ok
    assert [r.payload["twice"] for r in p] == [2 * i for i in range(8)]


def test_built_in_operators_are_not_validated():
    p = pipe().map_transform(lambda payload: {**payload, "x": random.random()}).batch(2)
    assert p.validate().issues == []


# ---------------------------------------------------------------- OP_NONDETERMINISTIC
def random_score(records):
    for r in records:
        r.payload = {**r.payload, "score": random.random()}
    return records


def raise_at_random(records):
    raise ValueError(f"unlucky {random.random()}")


def test_random_output_is_nondeterministic():
    report = validate_ops([kwargs_op(random_score)])
    assert errors(report) == ["OP_NONDETERMINISTIC"]
    assert "score" in report.errors[0].message  # it shows what differed
    assert "OP_NONDETERMINISTIC_STDLIB_CALL" in warning_codes(report)


def test_raising_differently_on_the_same_input_is_nondeterministic():
    report = validate_ops([kwargs_op(raise_at_random)])
    assert errors(report) == ["OP_NONDETERMINISTIC"]
    assert "raised ValueError" in report.errors[0].message
    assert "OP_REJECTS_GENERIC_PAYLOAD" not in warning_codes(report)


# ---------------------------------------------------------------- OP_CROSS_CALL_STATE
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


class RemembersLastBatch(BaseOp):
    """Leaks the previous call's first text into this call's records."""

    def __init__(self):
        super().__init__()
        self.previous = ""

    def traits(self):
        return OpTraits(preserves_cursor_order=True)

    def process_many(self, elems):
        previous, self.previous = self.previous, elems[0].payload["text"] + str(elems[0].meta.sample_id)
        for r in elems:
            r.payload = {**r.payload, "previous": previous}
        return elems


def counting_in_a_closure():
    calls = itertools.count()

    def numbered(records):
        n = next(calls)
        for r in records:
            r.payload = {**r.payload, "n": n}
        return records

    return numbered


@pytest.mark.parametrize("make, code", [
    (Counting, "OP_CROSS_CALL_STATE"), (RemembersLastBatch, "OP_CROSS_CALL_STATE"),
    # two fresh copies share what the code captures, so they differ: Zephon's OP_NONDETERMINISTIC
    (lambda: kwargs_op(counting_in_a_closure()), "OP_NONDETERMINISTIC"),
], ids=["counter on self", "last batch on self", "counter in a closure"])
def test_state_carried_between_calls_is_cross_call_state(make, code):
    report = validate_ops([make()])
    assert errors(report) == [code]
    assert "accumulator" in report.errors[0].message  # says where state belongs instead


def test_stateful_process_many_is_refused_at_iteration():
    p = pipe().add_op(Counting())
    report = p.validate()
    assert [i.code for i in report.errors] == ["OP_CROSS_CALL_STATE"]
    with pytest.raises(ValidationError, match="OP_CROSS_CALL_STATE"):
        iter(p)
    p.options(auto_validation="off")
    assert len(list(p)) == 8


# ---------------------------------------------------------------- OP_OUTPUT_NOT_STREAM_ITEM
def as_payload_dicts(records):
    return [r.payload for r in records]


def as_generator(records):
    return (r for r in records)


def payload_as_list(records):
    for r in records:
        r.payload = [r.payload["value"]]
    return records


@pytest.mark.parametrize("fn, said", [(as_payload_dicts, "dict at output[0]"), (as_generator, "generator"),
                                      (payload_as_list, "payload is a list")])
def test_output_that_is_not_a_list_of_records_is_reported(fn, said):
    report = validate_ops([kwargs_op(fn)])
    assert errors(report) == ["OP_OUTPUT_NOT_STREAM_ITEM"]
    assert said in report.errors[0].message and "SampleRecord" in report.errors[0].message


def test_kwargs_form_returning_dicts_is_reported():
    p = pipe().add_op("bad", process_many=lambda elems: [e.payload for e in elems], preserves_cursor_order=True)
    assert [i.code for i in p.validate().errors] == ["OP_OUTPUT_NOT_STREAM_ITEM"]


# ---------------------------------------------------------------- sample identity
def invent_ids(records):
    return [SampleRecord(SampleMeta(sample_id=(7, 7, i), lane_id=r.meta.lane_id, chunk_id=r.meta.chunk_id),
                         r.payload) for i, r in enumerate(records)]


def rebuild_meta(records):
    """Keeps the sample id but makes a new meta: a fan-out child's lineage is lost."""
    return [SampleRecord(SampleMeta(sample_id=r.meta.sample_id, lane_id=r.meta.lane_id, chunk_id=r.meta.chunk_id,
                                    chunk_offset=r.meta.chunk_offset), r.payload) for r in records]


def twice_same_meta(records):
    return [x for r in records for x in (r, SampleRecord(r.meta, dict(r.payload)))]


def test_invented_sample_ids_are_fabricated():
    report = validate_ops([kwargs_op(invent_ids)])
    assert errors(report) == ["OP_FABRICATES_SAMPLE_ID"]
    assert "(7, 7, 0)" in report.errors[0].message


def test_lineage_not_extending_the_inputs_is_not_via_child():
    assert errors(validate_ops([kwargs_op(rebuild_meta)])) == ["OP_LINEAGE_NOT_VIA_CHILD"]

    def other_branch(records):  # a child of (2,) re-labelled as a child of (3,)
        for r in records:
            r.meta = r.meta.with_lineage((3, 0))
        return records

    samples = lambda: records_like([{"text": "a", "value": 1}, {"text": "b", "value": 2}], lineage=(2,))  # noqa: E731
    report = validate_ops([kwargs_op(other_branch, validation_samples=samples)])
    assert errors(report) == ["OP_LINEAGE_NOT_VIA_CHILD"]
    assert "(3, 0)" in report.errors[0].message


def test_two_outputs_with_one_lineage_are_a_duplicate_fan_out():
    report = validate_ops([kwargs_op(twice_same_meta)])
    assert errors(report) == ["OP_FANOUT_DUPLICATE_LINEAGE"]
    assert "spawn_child" in report.errors[0].message


# ---------------------------------------------------------------- calibration replay
def count_the_call(records):
    for r in records:
        r.payload = {**r.payload, "in_call": len(records)}
    return records


def tag_lane(records):
    for r in records:
        r.payload = {**r.payload, "lane": r.meta.lane_id}
    return records


def test_calibration_replayable_op_whose_replay_differs_is_a_mismatch():
    report = validate_ops([kwargs_op(count_the_call, calibration_replayable=True)])
    assert errors(report) == ["OP_CALIBRATION_REPLAY_MISMATCH"]
    assert validate_ops([kwargs_op(count_the_call)]).issues == []  # undeclared: nothing promised
    # A process_one that does not do what process_many does; and a payload built from the lane.
    one = kwargs_op(per_record_score, calibration_replayable=True, process_one=lambda r: count_the_call([r]))
    assert errors(validate_ops([one])) == ["OP_CALIBRATION_REPLAY_MISMATCH"]
    assert errors(validate_ops([kwargs_op(tag_lane, calibration_replayable=True)])) == [
        "OP_CALIBRATION_REPLAY_MISMATCH"]


class Opaque:
    """A payload value calibration cannot compare (no structure it knows)."""


def opaque_payload(records):
    for r in records:
        r.payload = {**r.payload, "blob": Opaque()}
    return records


def needs_token_ids(records):
    for r in records:
        r.payload = {**r.payload, "n": len(r.payload["input_ids"])}
    return records


def test_calibration_that_cannot_be_checked_is_not_validated():
    report = validate_ops([kwargs_op(opaque_payload, calibration_replayable=True)])
    assert report.ok and warning_codes(report) == {"OP_CALIBRATION_REPLAY_NOT_VALIDATED"}
    report = validate_ops([kwargs_op(needs_token_ids, calibration_replayable=True)])
    assert report.ok
    assert warning_codes(report) == {"OP_CALIBRATION_REPLAY_NOT_VALIDATED", "OP_REJECTS_GENERIC_PAYLOAD"}


# ---------------------------------------------------------------- OP_VALIDATOR_CRASHED
class HoldsALock(BaseOp):
    """Builds an uncopyable resource in __init__ (it belongs in setup)."""

    def __init__(self):
        super().__init__()
        self.lock = threading.Lock()

    def traits(self):
        return OpTraits(preserves_cursor_order=True)

    def process_many(self, elems):
        return elems


def test_an_op_that_cannot_be_copied_is_reported_once_as_a_crash():
    report = validate_ops([HoldsALock()])
    assert errors(report) == ["OP_VALIDATOR_CRASHED"]
    assert "setup()" in report.errors[0].message and "lock" in report.errors[0].message


def test_a_crashing_check_is_reported_and_the_other_checks_still_run(monkeypatch):
    def broken(*args):
        raise RuntimeError("identity check bug")

    monkeypatch.setattr(validation.operators, "_identity_issues", broken)
    report = validate_ops([Counting(), kwargs_op(count_the_call, calibration_replayable=True)])
    assert [(i.op_name, i.code) for i in report.errors] == [
        ("Counting", "OP_CROSS_CALL_STATE"), ("Counting", "OP_VALIDATOR_CRASHED"),
        # the calibration check runs after the crashed one, and still finds its defect
        ("count_the_call", "OP_VALIDATOR_CRASHED"), ("count_the_call", "OP_CALIBRATION_REPLAY_MISMATCH")]
    crash = report.errors[1]
    assert "sample identity" in crash.message and "identity check bug" in crash.message


# ---------------------------------------------------------------- probe records
def test_an_op_that_rejects_the_synthetic_payload_is_not_validated_until_it_gives_samples():
    report = validate_ops([kwargs_op(needs_token_ids)])
    assert report.ok and warning_codes(report) == {"OP_REJECTS_GENERIC_PAYLOAD"}
    assert "KeyError" in report.warnings[0].message and "validation_samples" in report.warnings[0].message

    samples = lambda: records_like([{"input_ids": [1, 2, 3]}, {"input_ids": [4]}, {"input_ids": []}])  # noqa: E731
    assert validate_ops([kwargs_op(needs_token_ids, validation_samples=samples)]).issues == []

    def count_and_leak(records, state=[]):  # noqa: B006 - the defect under test
        state.append(1)
        for r in records:
            r.payload = {**r.payload, "n": len(r.payload["input_ids"]) + len(state)}
        return records

    # With samples it accepts, the checks run and find the defect.
    report = validate_ops([kwargs_op(count_and_leak, validation_samples=samples)])
    assert errors(report) == ["OP_NONDETERMINISTIC"]  # the default list is shared by fresh copies
    assert warning_codes(report) == {"OP_STATE_CHANGED_DURING_CALL"}


@pytest.mark.parametrize("factory, said", [
    (lambda: 1 / 0, "ZeroDivisionError"),
    (lambda: [], "list"),
    (lambda: [{"text": "a"}], "dict"),
    (lambda: [SampleRecord(SampleMeta(sample_id=(0, 0, 0), lane_id=0, chunk_id=0), "text")], "payload is a str"),
], ids=["raises", "empty", "dicts", "payload not a dict"])
def test_a_broken_validation_samples_factory_falls_back_to_synthetic_records(factory, said):
    report = validate_ops([kwargs_op(random_score, validation_samples=factory)])
    assert warning_codes(report) >= {"OP_VALIDATION_SAMPLES_FACTORY_FAILED"}
    assert said in next(i.message for i in report.warnings if i.code == "OP_VALIDATION_SAMPLES_FACTORY_FAILED")
    assert errors(report) == ["OP_NONDETERMINISTIC"]  # still checked, on the synthetic records


class ScoreWithSamples(QualityScoreOp):
    def validation_samples(self):
        return records_like([{"text": "a short one"}, {"text": "a much longer text than that"}])


class ScoreWithBrokenSamples(QualityScoreOp):
    def validation_samples(self):
        raise OSError("samples file missing")


def test_instance_runtime_checks_notice_comes_exactly_where_zephon_gives_it():
    assert warning_codes(validate_ops([QualityScoreOp("m")])) == {"OP_INSTANCE_RUNTIME_CHECKS_SKIPPED"}
    assert validate_ops([ScoreWithSamples("m")]).issues == []
    assert validate_ops([kwargs_op(per_record_score)]).issues == []  # the kwargs form: never
    assert warning_codes(validate_ops([ScoreWithBrokenSamples("m")])) == {
        "OP_INSTANCE_RUNTIME_CHECKS_SKIPPED", "OP_VALIDATION_SAMPLES_FACTORY_FAILED"}


class SizeWithoutSetup(BaseOp):
    """Its own setup (a model, say) that process_many does not need, and its own samples."""

    set_up = 0

    def traits(self):
        return OpTraits(preserves_cursor_order=True, calibration_replayable=True)

    def validation_samples(self):
        return records_like([{"text": "a"}, {"text": "bb"}, {"text": "ccc"}])

    def setup(self, ctx):
        SizeWithoutSetup.set_up += 1

    def process_many(self, elems):
        return [SampleRecord(r.meta, {"size": len(elems)}) for r in elems]  # depends on the batch


def test_an_op_with_its_own_setup_is_probed_without_it_when_it_can_be():
    SizeWithoutSetup.set_up = 0
    report = validate_ops([SizeWithoutSetup()])
    assert SizeWithoutSetup.set_up == 0              # setup may be costly: not called (as in Zephon)
    assert "OP_CALIBRATION_REPLAY_MISMATCH" in {i.code for i in report.issues}  # but the probes ran
    assert validate_ops([ScoreWithSamples("m")]).issues == []  # one that needs its setup gets it


def test_auto_validation_shows_a_report_of_warnings_only_and_runs_on():
    pipe = Pipeline(StaticMixtureWorkSource([Dataset.from_dict("d", {0: InMemoryShard([{"text": "x"}])})],
                                            {"d": 1.0})).add_op(QualityScoreOp("m"))
    with pytest.warns(UserWarning, match="OP_INSTANCE_RUNTIME_CHECKS_SKIPPED"):
        assert len(list(pipe)) == 1


# ---------------------------------------------------------------- state changed by a call
class MemoisesScores(BaseOp):
    """Deterministic, but caches on self: a warning, not an error."""

    def __init__(self):
        super().__init__()
        self.cache: dict[str, int] = {}

    def traits(self):
        return OpTraits(preserves_cursor_order=True)

    def process_many(self, elems):
        for r in elems:
            text = r.payload["text"]
            if text not in self.cache:
                self.cache[text] = len(text)
            r.payload = {**r.payload, "score": self.cache[text]}
        return elems


SEEN: list[int] = []


def logs_sizes(records):
    SEEN.append(len(records))
    return records


def logs_in_a_closure():
    sizes: list[int] = []

    def logged(records):
        sizes.append(len(records))
        return records

    return logged


def test_an_op_that_changes_its_attributes_mutates_self():
    report = validate_ops([MemoisesScores()])
    assert report.ok
    assert warning_codes(report) == {"OP_MUTATES_SELF", "OP_STATE_CHANGED_DURING_CALL", "OP_WRITES_TO_SELF",
                                     "OP_INSTANCE_RUNTIME_CHECKS_SKIPPED"}
    assert "'cache'" in next(i.message for i in report.warnings if i.code == "OP_MUTATES_SELF")


class Tally:
    def __init__(self) -> None:
        self.calls = 0

    def count(self, records):
        self.calls += 1
        return records


@pytest.mark.parametrize("make, where", [(lambda: kwargs_op(logs_sizes), "module-level 'SEEN'"),
                                         (lambda: kwargs_op(logs_in_a_closure()), "closure variable 'sizes'"),
                                         (lambda: kwargs_op(Tally().count), "the Tally object process_many")])
def test_state_captured_by_the_code_that_a_call_changes_is_reported(make, where):
    report = validate_ops([make()])
    assert report.ok and "OP_MUTATES_SELF" not in warning_codes(report)  # not the op's own attributes
    assert "OP_STATE_CHANGED_DURING_CALL" in warning_codes(report)
    assert where in next(i.message for i in report.warnings if i.code == "OP_STATE_CHANGED_DURING_CALL")


# ---------------------------------------------------------------- strict and auto-validation
class WritesSelfAndRandom(BaseOp):
    """Writes self and draws from the global random state (Zephon's fact-sheet example)."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def traits(self):
        return OpTraits(preserves_cursor_order=True)

    def process_many(self, elems):
        self.calls += 1
        for r in elems:
            r.payload = {**r.payload, "noise": random.random()}
        return elems


def test_strict_validate_lists_every_problem_at_once():
    p = (pipe().add_op(Counting()).add_op(Pure()).add_op("dicts", process_many=as_payload_dicts,
                                                           preserves_cursor_order=True)
         .add_op("ids", process_many=invent_ids, preserves_cursor_order=True))
    report = p.validate()
    assert [(i.code, i.op_name) for i in report.errors] == [
        ("OP_CROSS_CALL_STATE", "Counting"), ("OP_OUTPUT_NOT_STREAM_ITEM", "dicts"), ("OP_FABRICATES_SAMPLE_ID", "ids")]
    with pytest.raises(ValidationError) as raised:
        p.validate(strict=True)
    assert isinstance(raised.value, RuntimeError)
    assert raised.value.report.issues == report.issues
    for issue in report.issues:  # errors and warnings, one line each
        assert f"{issue.code} in {issue.op_name}" in str(raised.value)


def test_strict_auto_validation_blocks_an_op_writing_self_and_using_random():
    p = pipe().add_op(WritesSelfAndRandom())
    report = p.validate()
    # The two static findings are warnings (as in Zephon); the runtime check they point at fails.
    assert {"OP_WRITES_TO_SELF", "OP_NONDETERMINISTIC_STDLIB_CALL"} <= warning_codes(report)
    assert errors(report) == ["OP_NONDETERMINISTIC"]
    with pytest.raises(ValidationError, match="OP_NONDETERMINISTIC"):
        iter(p)


def test_warn_mode_warns_and_runs():
    p = pipe().add_op(Counting()).options(auto_validation="warn")
    with pytest.warns(UserWarning, match="OP_CROSS_CALL_STATE"):
        it = iter(p)
    assert len(list(it)) == 8


def test_off_mode_skips_validation(monkeypatch):
    calls = []
    monkeypatch.setattr("zephon_columnar.session.validate_ops", lambda ops: calls.append(ops) or ValidationReport())
    p = pipe().add_op(WritesSelfAndRandom()).options(auto_validation="off")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(list(p)) == 8
    assert calls == []
    p.options(auto_validation="strict")
    assert len(list(p)) == 8 and len(calls) == 1  # the same pipeline validates once switched back


def test_validation_gives_each_call_fresh_copies_of_the_records():
    given = records_like([{"text": "a", "value": 1}, {"text": "b", "value": 2}])
    kept = copy.deepcopy(given)
    assert validate_ops([kwargs_op(per_record_score, validation_samples=lambda: given)]).issues == []
    assert [(r.meta, r.payload) for r in given] == [(r.meta, r.payload) for r in kept]


# ---------------------------------------------------------------- tokenizer preflight
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


def test_auto_validation_runs_once_per_graph():
    calls = []

    def counted(records):
        calls.append(len(records))
        return records

    p = pipe().fetch(max_batch=4).add_op("counted", process_many=counted, preserves_cursor_order=True)
    list(p)
    first = len(calls)
    list(p)
    assert len(calls) - first == 2  # the second pass: one call per frame (2 frames of 4), no probes
    assert first > 2  # the first pass ran the validation probes too
    p.add_op("again", process_many=counted, preserves_cursor_order=True)
    before = len(calls)
    list(p)
    assert len(calls) - before > 4  # a new graph is validated again, then both ops run
