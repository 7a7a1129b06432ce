"""Validation reports (`Issue`, `ValidationReport`, `ValidationError`) and tokenizer preflight.

Checks aggregate their findings into a report so a user sees every problem at once; strict
entry points raise `ValidationError` carrying the report.

Example:
    >>> report = ValidationReport([Issue("error", "TOKENIZER_PREFLIGHT_FAILED", "tokenize", "no such file")])
    >>> report.ok
    False
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from zephon_columnar.pipeline import Pipeline

DOC_LINK = "docs/concepts.md#operators"


@dataclass(frozen=True)
class Issue:
    severity: Literal["error", "warning"]
    code: str
    op_name: str
    message: str
    doc_link: str = DOC_LINK


@dataclass
class ValidationReport:
    issues: list[Issue] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def errors(self) -> list[Issue]:
        return [i for i in self.issues if i.severity == "error"]

    @property
    def warnings(self) -> list[Issue]:
        return [i for i in self.issues if i.severity == "warning"]

    def format(self) -> str:
        if not self.issues:
            return "validation: no issues"
        return "\n".join(f"[{i.severity}] {i.code} in {i.op_name}: {i.message}" for i in self.issues)


class ValidationError(RuntimeError):
    """Raised by strict validation entry points; ``report`` holds every finding."""

    def __init__(self, report: ValidationReport) -> None:
        super().__init__(report.format())
        self.report = report


def preflight_tokenizers(pipeline: "Pipeline") -> ValidationReport:
    """Load every tokenizer configured on ``pipeline`` (in copies of its operators) and report
    ``TOKENIZER_PREFLIGHT_FAILED`` for each one that fails. Operators without a tokenizer are
    skipped."""
    report = ValidationReport()
    for op in pipeline._ops:  # noqa: SLF001 - the pipeline's own operator list
        preflight = getattr(op, "preflight", None)
        if preflight is None:
            continue
        try:
            op.clone().preflight()
        except Exception as err:  # report every failure, whatever its type
            report.issues.append(Issue("error", "TOKENIZER_PREFLIGHT_FAILED", op.op_name(), f"{type(err).__name__}: {err}"))
    return report


def _synthetic_frame(op: Any) -> Any:
    """The op's own validation samples as a frame, or synthetic ``{'text', 'value'}`` rows on
    two lanes."""
    import numpy as np
    import pyarrow as pa

    from zephon_columnar import frame as F
    from zephon_columnar.types import SampleBatch

    samples = op.validation_samples()
    if samples:
        return SampleBatch(samples).table
    n = 6
    book = F.pointer_frame(lane=0, chunk_id=0, offsets=np.arange(n), pointers=np.array([[0, 0, i] for i in range(n)]),
                           components=np.zeros(n, np.int32))
    book = book.set_column(0, F.LANE, pa.array(np.arange(n, dtype=np.int32) % 2))
    return F.with_payload(book, pa.table({"text": [f"sample text {i}" for i in range(n)], "value": list(range(n))}))


def validate_ops(ops: list[Any]) -> ValidationReport:
    """Smoke-test user operators: same input twice gives the same output, and an earlier call
    does not change a later one. Built-in operators are skipped."""
    from zephon_columnar.errors import WrongTypeError

    report = ValidationReport()
    for op in ops:
        if getattr(op, "builtin", False):
            continue
        name = op.op_name()
        try:
            frame = _synthetic_frame(op)
        except Exception as err:
            report.issues.append(Issue("warning", "OP_VALIDATION_SAMPLES_FACTORY_FAILED", name, str(err)))
            continue
        probe = op.clone()
        try:
            from zephon_columnar.ops.base import OpContext

            probe.setup(OpContext())
            first = probe.process_frame(frame)
            other = probe.process_frame(frame.slice(0, max(1, frame.num_rows // 2)))
            second = probe.process_frame(frame)
        except WrongTypeError as err:
            code = "OP_OUTPUT_NOT_STREAM_ITEM" if "SampleRecord" in str(err) else "OP_REJECTS_GENERIC_PAYLOAD"
            report.issues.append(Issue("error" if code == "OP_OUTPUT_NOT_STREAM_ITEM" else "warning", code, name, str(err)))
            continue
        except Exception as err:  # the op cannot run on these samples: say so, do not guess
            report.issues.append(Issue("warning", "OP_REJECTS_GENERIC_PAYLOAD", name,
                                       f"{type(err).__name__}: {err}; pass validation_samples to check it"))
            continue
        del other
        if not first.equals(second):
            again = op.clone()
            again.setup(OpContext())
            fresh = again.process_frame(frame)
            code = "OP_CROSS_CALL_STATE" if fresh.equals(first) else "OP_NONDETERMINISTIC"
            report.issues.append(Issue("error", code, name,
                                       "the same input gave different outputs; process_frame/process_many "
                                       "must be a pure function of its input (keep state in an accumulator)"))
    return report
