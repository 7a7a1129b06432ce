"""The validation harness of user operators (``Pipeline.validate``, auto-validation on the
first ``iter()``) and the tokenizer preflight.

Contract: `validate_ops(ops)` returns a `ValidationReport` holding every finding about the
``add_op`` operators in ``ops`` (built-ins, ``builtin=True``, are skipped), one `Issue` per
problem, so a user sees them all at once; it never raises because of an operator. Strict entry
points raise `ValidationError` (a `RuntimeError`, and a `PipelineError`) carrying the report.
Errors are contract violations the engine would turn into wrong data or a failure; warnings are
suspicious patterns or checks that could not run. Passing is necessary, not sufficient: it is a
smoke test on a dozen records.

What runs, per operator (the issue codes are Zephon 0.2.0's):

- *Static scan* (warnings): the source of ``process_many`` / ``process_one`` /
  ``process_columns`` (the class's methods, or the functions given to the kwargs form) is
  parsed and searched for writes to ``self`` (``OP_WRITES_TO_SELF``) and for calls that read
  the clock or unseeded randomness: ``random``, ``time``, ``uuid``, ``secrets``,
  ``os.urandom``, ``numpy.random`` (``OP_NONDETERMINISTIC_STDLIB_CALL``). No source (a REPL
  lambda, a builtin): no scan.
- *Probe records*: the op's ``validation_samples()``, else 12 synthetic records
  ``{'text': str, 'value': int}`` on lanes 0, 1 and 2, the last of each lane a fan-out child
  (lineage ``(0,)``) so lost lineage shows (``OP_VALIDATION_SAMPLES_FACTORY_FAILED``
  when the factory raises or returns something else than a non-empty list of records). Every
  call gets fresh deep copies (ops rebuild payloads in place).
- *Operator checks* (``process_many``), each on a fresh ``op.clone()`` set up with
  ``setup(OpContext())``: the output type, determinism (two fresh copies, same input),
  cross-call state (an A, B, A probe on one copy), instance state and captured state (closure
  cells, default arguments, module-level containers the code names) before and after a call,
  sample-id and lineage integrity, and calibration replay for ``calibration_replayable`` ops.
  An op that raises the same way on both probes could not be validated
  (``OP_REJECTS_GENERIC_PAYLOAD``, a warning): the engine reports the real error when it runs.
- *Accumulator checks* (``accumulator(deterministic=True, ctx=...)``): samples conserved over
  ``push_many`` + ``flush`` (a tombstone counts as the sample it closes), ``flush(reset=True)``
  leaves it fresh, ``has_pending_data`` is truthful, lanes are kept and batches lane-pure, and
  ``flush(lane_id=L)`` drains lane L and touches no other lane.

Zephon runs only the static checks on a `BaseOp` instance without ``validation_samples()``
(``OP_INSTANCE_RUNTIME_CHECKS_SKIPPED``, a warning). Here that holds when the op has its own
``setup`` (every probe is a set-up copy, and setup may load a model); an instance without one
is cheap to copy, so it gets every check on the synthetic records, with the same warning.
A check that itself crashes is reported as ``OP_VALIDATOR_CRASHED``.

Layout: `report` holds the report types (`Issue`, `ValidationReport`, `ValidationError`);
`probes` the probe copies, probe records, fingerprints and probe calls the checks share;
`operators`, `calibration`, `accumulators` and `static` the checks themselves. This module
runs them per operator (`validate_ops`) and holds the tokenizer preflight.

Example:
    >>> from zephon_columnar.ops.user import FunctionOp
    >>> def as_dicts(records):
    ...     return [r.payload for r in records]
    >>> def shout(records):
    ...     for r in records:
    ...         r.payload = {**r.payload, "text": r.payload["text"].upper()}
    ...     return records
    >>> report = validate_ops([FunctionOp("as_dicts", process_many=as_dicts, preserves_cursor_order=True),
    ...                        FunctionOp("shout", process_many=shout, preserves_cursor_order=True)])
    >>> [(i.code, i.op_name) for i in report.issues]
    [('OP_OUTPUT_NOT_STREAM_ITEM', 'as_dicts')]
    >>> report.ok
    False

"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zephon_columnar.ops.tokenize.owner import TokenizerOwner
from zephon_columnar.validation.accumulators import check_accumulator
from zephon_columnar.validation.operators import check_operator
from zephon_columnar.validation.probes import call, guarded, probe_records
from zephon_columnar.validation.report import DOC_LINK, Issue, ValidationError, ValidationReport
from zephon_columnar.validation.static import check_source

if TYPE_CHECKING:
    from zephon_columnar.ops.base import BaseOp
    from zephon_columnar.pipeline import Pipeline


def preflight_tokenizers(pipeline: Pipeline) -> ValidationReport:
    """Load every tokenizer configured on ``pipeline`` (in copies of its operators) and report
    ``TOKENIZER_PREFLIGHT_FAILED`` for each one that fails. Operators without a tokenizer are
    skipped."""
    report = ValidationReport()
    for op in pipeline.spec.ops:
        if not isinstance(op, TokenizerOwner):
            continue
        try:
            op.clone().preflight()
        except Exception as err:  # noqa: BLE001 - report every failure, whatever its type
            report.issues.append(
                Issue("error", "TOKENIZER_PREFLIGHT_FAILED", op.op_name(), f"{type(err).__name__}: {err}")
            )
    return report


def validate_ops(ops: list[Any]) -> ValidationReport:
    """Every finding about the user operators in ``ops`` (see the module docstring)."""
    report = ValidationReport()
    for op in ops:
        if getattr(op, "builtin", False):
            continue
        report.issues.extend(_validate_op(op))
    return report


def _validate_op(op: BaseOp) -> list[Issue]:
    from zephon_columnar.ops.user import FunctionOp

    name = _name_of(op)
    issues = guarded(name, "static scan", lambda: check_source(op, name))
    samples, own_samples, sample_issues = probe_records(op, name)
    issues += sample_issues
    set_up = True
    if _own_setup(op):
        # Its setup may load a model: with no samples of its own nothing is probed; with them,
        # copies are probed without setup (as in Zephon) unless process_many cannot run so.
        if not own_samples:
            issues.append(
                Issue(
                    "warning",
                    "OP_INSTANCE_RUNTIME_CHECKS_SKIPPED",
                    name,
                    (
                        "this BaseOp instance has its own setup() and no validation_samples(), so only the static "
                        "checks ran: determinism, cross-call state, sample identity and calibration replay need probe "
                        "calls, and setup may be costly. Override validation_samples() to return a few SampleRecords "
                        "shaped like the op's real input to have them checked at run time."
                    ),
                )
            )
            return issues
        set_up = call(op.clone(), samples).error is not None
    if not isinstance(op, FunctionOp) and not own_samples:
        issues.append(
            Issue(
                "warning",
                "OP_INSTANCE_RUNTIME_CHECKS_SKIPPED",
                name,
                (
                    "this BaseOp instance has no validation_samples(), so Zephon would run only the static checks on "
                    "it; here the runtime checks ran on synthetic {'text', 'value'} records, which may not look like "
                    "its data. Override validation_samples() to return a few SampleRecords shaped like the op's real "
                    "input."
                ),
            )
        )
    issues += guarded(name, "operator", lambda: check_operator(op, name, samples, own_samples, set_up))
    if set_up:  # an accumulator may need what setup builds: not probed on copies without it
        issues += guarded(name, "accumulator", lambda: check_accumulator(op, name, samples))
    return issues


def _name_of(op: Any) -> str:
    try:
        return str(op.op_name())
    except Exception:  # noqa: BLE001 - a user's op_name() may raise anything: its class names it then
        return type(op).__name__


def _own_setup(op: BaseOp) -> bool:
    """Whether ``op`` is a `BaseOp` instance with its own ``setup`` (not the kwargs form)."""
    from zephon_columnar.ops.base import BaseOp
    from zephon_columnar.ops.user import FunctionOp

    return not isinstance(op, FunctionOp) and type(op).setup is not BaseOp.setup


__all__ = ["DOC_LINK", "Issue", "ValidationError", "ValidationReport", "preflight_tokenizers", "validate_ops"]
