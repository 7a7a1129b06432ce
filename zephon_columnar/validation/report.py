"""What validation reports: one `Issue` per finding (severity, Zephon's issue code, the op's
name, a message and a link to the docs, `DOC_LINK`), the `ValidationReport` collecting them
and its text form, and `ValidationError`, which strict entry points raise carrying the report.
Also the small formatting helper the checks' messages share (`few`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from zephon_columnar.errors import PipelineError

DOC_LINK = "docs/api.md#user-defined-operators-zephon_columnarops"


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
        return "\n".join(
            f"[{i.severity}] {i.code} in {i.op_name}: {i.message}" + (f" → {i.doc_link}" if i.doc_link else "")
            for i in self.issues
        )


class ValidationError(PipelineError):
    """Raised by strict validation entry points; ``report`` holds every finding. A
    `RuntimeError` (and a `PipelineError`: the pipeline cannot run as built)."""

    def __init__(self, report: ValidationReport) -> None:
        super().__init__(report.format())
        self.report = report


def few(items: list[Any], limit: int = 3) -> str:
    shown = ", ".join(repr(i) for i in items[:limit])
    return shown + (f" (+{len(items) - limit} more)" if len(items) > limit else "")
