"""The static scan of the validation harness: writes to ``self`` and calls that read the clock
or unseeded randomness, found in the source of an operator's pure part. The ops here do the
flagged thing where it cannot change their output, so only the static warnings fire."""

from __future__ import annotations

import inspect
import random
import time
import uuid
from random import random as draw

import numpy as np
import pyarrow.compute as pc

from zephon_columnar.ops import BaseOp, ColumnarOp, OpContext, OpTraits
from zephon_columnar.ops.user import FunctionOp
from zephon_columnar.validation import ValidationReport, validate_ops


def codes(report: ValidationReport) -> set[str]:
    return {i.code for i in report.issues}


def message(report: ValidationReport, code: str) -> str:
    return next(i.message for i in report.issues if i.code == code)


def kwargs_op(fn, **kw) -> FunctionOp:
    return FunctionOp(fn.__name__, process_many=fn, preserves_cursor_order=True, **kw)


def line_of(fn, text: str) -> int:
    """The file line of ``fn``'s source line holding ``text``."""
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


class _Op(BaseOp):
    def traits(self):
        return OpTraits(preserves_cursor_order=True)


# ---------------------------------------------------------------- OP_WRITES_TO_SELF
class WritesInADeadBranch(_Op):
    def __init__(self):
        super().__init__()
        self.total = 0  # __init__ may write self
        self.seen: list[int] = []
        self.by_text: dict[str, int] = {}

    def setup(self, ctx: OpContext) -> None:
        super().setup(ctx)
        self.ready = True  # so may setup

    def process_many(self, elems):
        if not elems:  # never taken on the probe records: only the source shows these
            self.total += 1
            self.seen.append(0)
            self.by_text["x"] = 1
            setattr(self, "flag", True)
            self.config.limit = 3
        return elems


def test_writes_to_self_in_the_pure_part_are_warned_about_with_their_lines():
    report = validate_ops([WritesInADeadBranch()])
    assert codes(report) == {"OP_WRITES_TO_SELF", "OP_INSTANCE_RUNTIME_CHECKS_SKIPPED"}  # nothing at runtime
    said = message(report, "OP_WRITES_TO_SELF")
    fn = WritesInADeadBranch.process_many
    for text in ("self.total += 1", "self.seen.append(0)", 'self.by_text["x"] = 1', 'setattr(self, "flag", True)'):
        assert f"line {line_of(fn, text)}: {text}" in said
    assert "(+1 more)" in said  # the nested attribute, past the four shown
    assert "self.ready" not in said and "self.total = 0" not in said  # setup and __init__ may write self


class PassesConfigAlong(_Op):
    """Reads self, writes only locals and records: nothing to report."""

    def __init__(self):
        super().__init__()
        self.suffix = "!"

    def process_many(self, elems):
        suffix = self.suffix
        extra = {"n": len(elems)}
        extra.update({"k": 1})
        for r in elems:
            r.payload = {**r.payload, "text": r.payload["text"] + suffix}
        return elems


class ColumnarCounter(ColumnarOp):
    def __init__(self):
        super().__init__()
        self.batches = 0

    def traits(self):
        return OpTraits(preserves_cursor_order=True)

    def process_columns(self, batch):
        if batch.num_rows < 0:
            self.batches += 1
        return batch.append_column("len", pc.utf8_length(batch.column("text")))


class Scorer:
    """A kwargs-form op given a bound method: its receiver is scanned as self."""

    def __init__(self):
        self.calls = 0

    def score(self, records):
        if not records:
            self.calls += 1
        return records


def test_reads_of_self_pass_and_every_form_of_the_pure_part_is_scanned():
    assert codes(validate_ops([PassesConfigAlong()])) == {"OP_INSTANCE_RUNTIME_CHECKS_SKIPPED"}
    report = validate_ops([ColumnarCounter()])
    assert "OP_WRITES_TO_SELF" in codes(report)
    assert message(report, "OP_WRITES_TO_SELF").startswith("process_columns writes to self")
    report = validate_ops([FunctionOp("scorer", process_many=Scorer().score, preserves_cursor_order=True)])
    assert codes(report) == {"OP_WRITES_TO_SELF"}


# ---------------------------------------------------------------- OP_NONDETERMINISTIC_STDLIB_CALL
def times_itself(records):
    started = time.time()  # read, never written into the records
    del started
    return records


def names_a_batch(records):
    batch_id = uuid.uuid4()
    return records if batch_id else []


def aliased_draw(records):
    if draw() > 2:  # `from random import random as draw`: never true
        return []
    return records


def imports_inside(records):
    import random as rnd

    if rnd.choice([1, 2]) > 5:
        return []
    return records


def numpy_global_state(records):
    if np.random.rand() > 2:
        return []
    return records


def test_calls_that_read_the_clock_or_unseeded_randomness_are_warned_about():
    for fn, text in ((times_itself, "time.time()"), (names_a_batch, "uuid.uuid4()"), (aliased_draw, "draw()"),
                     (imports_inside, "rnd.choice([1, 2])"), (numpy_global_state, "np.random.rand()")):
        report = validate_ops([kwargs_op(fn)])
        assert codes(report) == {"OP_NONDETERMINISTIC_STDLIB_CALL"}, fn.__name__
        assert f"line {line_of(fn, text)}:" in message(report, "OP_NONDETERMINISTIC_STDLIB_CALL")


def seeded_and_harmless(records):
    rng = random.Random(7)  # seeded: deterministic
    generator = np.random.default_rng(11)
    time.sleep(0)
    for r in records:
        r.payload = {**r.payload, "noise": rng.random() + float(generator.random()),
                     "stamp": time.strftime("%Y", time.gmtime(0))}
    return records


def unseeded_constructors(records):
    rng = random.Random()
    generator = np.random.default_rng()
    if rng.random() > 2 or generator.random() > 2:
        return []
    return records


def test_seeded_generators_pass_and_unseeded_constructors_are_flagged():
    assert validate_ops([kwargs_op(seeded_and_harmless)]).issues == []
    said = message(validate_ops([kwargs_op(unseeded_constructors)]), "OP_NONDETERMINISTIC_STDLIB_CALL")
    assert "random.Random()" in said and "np.random.default_rng()" in said


class StampsTime(_Op):
    def process_many(self, elems):
        if time.monotonic() < 0:
            return []
        return elems


def test_methods_of_an_instance_and_lambdas_are_scanned():
    assert "OP_NONDETERMINISTIC_STDLIB_CALL" in codes(validate_ops([StampsTime()]))
    lam = FunctionOp("lam", process_many=lambda rs: rs if time.time() > 0 else [], preserves_cursor_order=True)
    assert codes(validate_ops([lam])) == {"OP_NONDETERMINISTIC_STDLIB_CALL"}


def test_code_without_source_is_skipped_silently():
    namespace: dict = {}
    exec(compile("import time\ndef stamp(records):\n    time.time()\n    return records\n", "<no file>", "exec"),
         namespace)
    assert validate_ops([kwargs_op(namespace["stamp"])]).issues == []
    assert validate_ops([kwargs_op(list)]).issues == []  # a builtin: no source, and a list back
