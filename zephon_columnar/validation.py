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
from typing import TYPE_CHECKING, Literal

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
