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

import ast
import builtins
import collections
import copy
import functools
import hashlib
import inspect
import linecache
import pickle
import sys
import types
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from zephon_columnar.errors import PipelineError
from zephon_columnar.ops.tokenizer import TokenizerOwner

if TYPE_CHECKING:
    from zephon_columnar.ops.accumulators import Accumulator
    from zephon_columnar.ops.base import BaseOp
    from zephon_columnar.pipeline import Pipeline
    from zephon_columnar.records import SampleRecord

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


# ====================================================================== entry point
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
    issues = _guarded(name, "static scan", lambda: _check_source(op, name))
    samples, own_samples, sample_issues = _probe_records(op, name)
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
        set_up = _call(op.clone(), samples).error is not None
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
    issues += _guarded(name, "operator", lambda: _check_operator(op, name, samples, own_samples, set_up))
    if set_up:  # an accumulator may need what setup builds: not probed on copies without it
        issues += _guarded(name, "accumulator", lambda: _check_accumulator(op, name, samples))
    return issues


def _name_of(op: Any) -> str:
    try:
        return str(op.op_name())
    except Exception:  # noqa: BLE001 - a user's op_name() may raise anything: its class names it then
        return type(op).__name__


class _NoProbe(Exception):
    """A set-up copy of the op could not be made; ``issue`` says why."""

    def __init__(self, issue: Issue) -> None:
        super().__init__(issue.message)
        self.issue = issue


def _guarded(name: str, what: str, check: Callable[[], list[Issue]]) -> list[Issue]:
    """``check()``, or the issue saying why it could not run: validation reports, never raises."""
    try:
        return check()
    except _NoProbe as err:
        return [err.issue]
    except Exception as err:  # noqa: BLE001 - validation reports, never raises: whatever a check raised is reported
        return [
            Issue(
                "error",
                "OP_VALIDATOR_CRASHED",
                name,
                (
                    f"the {what} check crashed with {type(err).__name__}: {err}; the op could not be fully validated. "
                    "Fix what the message points at, or set options(auto_validation='off') to skip validation."
                ),
            )
        ]


def _own_setup(op: BaseOp) -> bool:
    """Whether ``op`` is a `BaseOp` instance with its own ``setup`` (not the kwargs form)."""
    from zephon_columnar.ops.base import BaseOp
    from zephon_columnar.ops.user import FunctionOp

    return not isinstance(op, FunctionOp) and type(op).setup is not BaseOp.setup


def _fresh_probe(op: BaseOp, name: str, stack: ExitStack, set_up: bool = True) -> BaseOp:
    """A copy of ``op`` set up as the engine sets up a worker's copy (torn down with ``stack``),
    or, with ``set_up=False``, just a copy (see `_validate_op`)."""
    from zephon_columnar.ops.base import OpContext

    try:
        probe = op.clone()
    except Exception as err:
        raise _NoProbe(
            Issue(
                "error",
                "OP_VALIDATOR_CRASHED",
                name,
                (
                    f"copying the operator failed (clone() raised {type(err).__name__}: {err}); the engine copies it "
                    "for every worker, so it would fail too. Build unpicklable resources (locks, clients, models) in "
                    "setup(), not __init__."
                ),
            )
        ) from err
    if not set_up:
        return probe
    try:
        probe.setup(OpContext())
    except Exception as err:
        raise _NoProbe(
            Issue(
                "warning",
                "OP_REJECTS_GENERIC_PAYLOAD",
                name,
                (
                    f"!! NOT VALIDATED !! setup(OpContext()) raised {type(err).__name__}: {err}, so no runtime check "
                    "ran. Make setup() work without engine services, or validate the op in a test of your own."
                ),
            )
        ) from err
    stack.callback(_teardown, probe)
    return probe


def _teardown(probe: BaseOp) -> None:
    try:
        probe.teardown()
    except Exception:  # noqa: BLE001, S110 - a probe's teardown failing says nothing about the op's data
        pass


# ====================================================================== probe records
def _synthetic_records(n_lanes: int = 3, per_lane: int = 4) -> list[SampleRecord]:
    """``{'text', 'value'}`` records on lanes 0..n_lanes-1, sample ids ``(0, lane, offset)`` (the
    inputs Zephon probes with). The last record of each lane is a fan-out child (lineage
    ``(0,)``, made with `spawn_child`), so an op that rebuilds meta and loses lineage shows."""
    from zephon_columnar.records import SampleMeta, SampleRecord, spawn_child

    records = []
    for lane in range(n_lanes):
        for i in range(per_lane):
            meta = SampleMeta(sample_id=(0, lane, i), lane_id=lane, chunk_id=i // 2, chunk_offset=i)
            if i == per_lane - 1:
                meta = spawn_child(meta, 0, is_last_child=True)
            records.append(SampleRecord(meta, {"text": f"sample_{lane}_{i}", "value": i}))
    return records


def _probe_records(op: BaseOp, name: str) -> tuple[list[SampleRecord], bool, list[Issue]]:
    """(records to probe with, whether they are the op's own, issues): ``validation_samples()``
    when it gives a usable list, else the synthetic records."""
    from zephon_columnar.records import SampleMeta, SampleRecord

    def failed(why: str) -> tuple[list[SampleRecord], bool, list[Issue]]:
        return (
            _synthetic_records(),
            False,
            [
                Issue(
                    "warning",
                    "OP_VALIDATION_SAMPLES_FACTORY_FAILED",
                    name,
                    (
                        f"validation_samples() {why}; the synthetic {{'text', 'value'}} records were used instead. "
                        "Return a non-empty list of SampleRecord(SampleMeta(...), payload_dict) shaped like the op's "
                        "input."
                    ),
                )
            ],
        )

    try:
        samples = op.validation_samples()
    except Exception as err:  # noqa: BLE001 - a user's factory may raise anything; reported below
        return failed(f"raised {type(err).__name__}: {err}")
    if samples is None:
        return _synthetic_records(), False, []
    if not isinstance(samples, (list, tuple)) or not samples:
        return failed(f"returned {type(samples).__name__} {samples!r:.60}")
    for r in samples:
        if not isinstance(r, SampleRecord) or not isinstance(r.meta, SampleMeta):
            return failed(f"returned a list holding {type(r).__name__} (not a SampleRecord with a SampleMeta)")
        if not r.meta.tombstone and not isinstance(r.payload, dict):
            return failed(f"returned a record whose payload is a {type(r.payload).__name__} (a payload is a dict)")
    return list(samples), True, []


def _shifted(samples: list[SampleRecord]) -> list[SampleRecord]:
    """Copies of ``samples`` under other sample ids (dataset id + 1): a second, distinct input."""
    out = copy.deepcopy(samples)
    for r in out:
        sid = r.meta.sample_id
        if isinstance(sid, tuple) and sid and isinstance(sid[0], int):
            r.meta = replace(r.meta, sample_id=(sid[0] + 1, *sid[1:]))
    return out


def _records_in(output: Any) -> list[SampleRecord]:
    """The records of a ``process_many`` output (a `SampleBatch` counts as its records)."""
    from zephon_columnar.types import SampleBatch

    records: list[SampleRecord] = []
    for item in output:
        records.extend(item.records if isinstance(item, SampleBatch) else [item])
    return records


def _key(record: SampleRecord) -> tuple[Any, tuple[int, ...]]:
    return (record.meta.sample_id, tuple(record.meta.lineage))


def _samples_closed(record: SampleRecord) -> list[tuple[Any, tuple[int, ...]]]:
    """The samples a record stands for: itself, or for a tombstone the samples it closes."""
    if record.meta.tombstone:
        return [
            (ref.cursor.sample_id, tuple(ref.cursor.lineage))
            for ref in record.meta.contribution_refs()
            if ref.is_last_child
        ]
    return [_key(record)]


# ====================================================================== fingerprints
class _HashSink:
    """A file that hashes what is written to it: pickling into it costs no memory."""

    def __init__(self) -> None:
        self.hash = hashlib.blake2b(digest_size=16)

    def write(self, data: bytes) -> int:
        self.hash.update(data)
        return len(data)


_CODE_TYPES = (
    types.FunctionType,
    types.MethodType,
    types.BuiltinFunctionType,
    types.ModuleType,
    type,
    functools.partial,
)


def _fingerprint(value: Any) -> str | None:
    """A digest of ``value``'s whole state (pickle, else cloudpickle), or None when neither can
    serialise it. Code (functions, modules, classes) is fingerprinted by identity: replacing it is
    a change, what it captures is `_captured_state`'s business."""
    if isinstance(value, _CODE_TYPES):
        return f"{type(value).__name__}@{id(value)}"
    picklers: list[Any] = [pickle.Pickler]
    try:
        import cloudpickle

        picklers.append(cloudpickle.CloudPickler)
    except ImportError:  # pragma: no cover - cloudpickle is a dependency
        pass
    for pickler in picklers:
        sink = _HashSink()
        try:
            pickler(sink, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
        except Exception:  # noqa: BLE001, S112 - pickling may fail in any way: try the next pickler
            continue
        return sink.hash.hexdigest()
    return None


def _output_keys(output: Any) -> list[Any]:
    """What two outputs are compared by: each item's sample id, lineage and full content."""
    from zephon_columnar.records import SampleRecord

    if not isinstance(output, (list, tuple)):
        return [("value", _fingerprint(output))]
    keys: list[tuple[Any, ...]] = []
    for item in output:
        if isinstance(item, SampleRecord):
            keys.append(
                (
                    repr(item.meta.sample_id),
                    repr(item.meta.lineage),
                    _fingerprint(item.meta),
                    _content_key(item.payload),
                )
            )
        else:
            keys.append((type(item).__name__, _fingerprint(item)))
    return keys


def _content_key(value: Any) -> Any:
    """A comparable key of a payload: by value where `_payload_key` knows the types (two equal
    tensors pickle to different bytes), else its fingerprint."""
    try:
        return _payload_key(value)
    except TypeError:
        return _fingerprint(value)


@dataclass
class _Outcome:
    """What one ``process_many`` call did: its output, or the exception it raised."""

    output: Any = None
    error: Exception | None = None

    def same_as(self, other: _Outcome) -> bool:
        if (self.error is None) != (other.error is None):
            return False
        if self.error is not None and other.error is not None:
            return type(self.error) is type(other.error) and str(self.error) == str(other.error)
        return _output_keys(self.output) == _output_keys(other.output)

    def describe(self) -> str:
        if self.error is not None:
            return f"raised {type(self.error).__name__}: {self.error}"
        return f"returned {len(self.output) if isinstance(self.output, (list, tuple)) else 1} items"

    def difference(self, other: _Outcome) -> str:
        """Where ``other`` first departs from this outcome, in words."""
        if (
            self.error is not None
            or other.error is not None
            or not (isinstance(self.output, (list, tuple)) and isinstance(other.output, (list, tuple)))
        ):
            return f"first {self.describe()}, then {other.describe()}"
        if len(self.output) != len(other.output):
            return f"first {len(self.output)} items, then {len(other.output)}"
        mine, theirs = _output_keys(self.output), _output_keys(other.output)
        i = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), 0)
        pair = [getattr(x, "payload", x) for x in (self.output[i], other.output[i])]
        if _content_key(pair[0]) == _content_key(pair[1]):  # the payloads agree: the meta differs
            pair = [getattr(x, "meta", x) for x in (self.output[i], other.output[i])]
        return f"item {i}: first {pair[0]!r:.120}, then {pair[1]!r:.120}"


def _call(probe: BaseOp, samples: list[SampleRecord]) -> _Outcome:
    try:
        return _Outcome(output=probe.process_many(copy.deepcopy(samples)))
    except Exception as err:  # noqa: BLE001 - the op's own failure: classified by the caller
        return _Outcome(error=err)


# ====================================================================== operator checks
def _check_operator(
    op: BaseOp, name: str, samples: list[SampleRecord], own_samples: bool, set_up: bool = True
) -> list[Issue]:
    """``process_many`` on fresh (set-up) copies: output type, determinism, cross-call state,
    state changed by a call, sample identity and calibration replay."""
    with ExitStack() as stack:
        first_probe = _fresh_probe(op, name, stack, set_up)
        first = _call(first_probe, samples)
        second_probe = _fresh_probe(op, name, stack, set_up)
        attrs_before = {k: _fingerprint(v) for k, v in vars(second_probe).items()}
        captured_before = _captured_state(second_probe)
        second = _call(second_probe, samples)
        changed_attrs = _changed(attrs_before, {k: _fingerprint(v) for k, v in vars(second_probe).items()})
        changed_captured = _changed(captured_before, _captured_state(second_probe))

        if first.error is not None and first.same_as(second):
            return _rejected(op, name, first.error, own_samples)
        wrong = _not_stream_items(first) or _not_stream_items(second)
        if wrong:
            return [
                Issue(
                    "error",
                    "OP_OUTPUT_NOT_STREAM_ITEM",
                    name,
                    (
                        f"process_many returned {wrong}; it must return a list of SampleRecord. Rebuild record.payload "
                        "and return the record that carried it (spawn_child for extra records, tombstones_for_record "
                        "to drop one), not dicts or tensors."
                    ),
                )
            ]
        issues = _state_change_issues(name, changed_attrs, changed_captured)
        if not first.same_as(second):
            issues.append(_differs(name, first, second, changed_captured))
        else:
            issues += _guarded(name, "cross-call state", lambda: _cross_call_issues(first_probe, name, samples, first))
        if first.error is None:
            issues += _guarded(name, "sample identity", lambda: _identity_issues(name, samples, first.output))
    issues += _guarded(name, "calibration replay", lambda: _calibration_issues(op, name, samples, set_up))
    return issues


def _rejected(op: BaseOp, name: str, err: Exception, own_samples: bool) -> list[Issue]:
    """The op raised the same way on both probes: nothing could be checked (not evidence of a bug)."""
    what = "its validation_samples()" if own_samples else "the synthetic {'text': str, 'value': int} records"
    issues = [
        Issue(
            "warning",
            "OP_REJECTS_GENERIC_PAYLOAD",
            name,
            (
                f"!! NOT VALIDATED !! process_many raised {type(err).__name__}: {err} on {what}, every time, so "
                "determinism, cross-call state, state changes and sample identity were not checked. Give the op "
                "validation_samples() (override it, or add_op(..., validation_samples=lambda: [...])) with records "
                "shaped like its input."
            ),
        )
    ]
    if _declares_calibration(op):
        issues.append(
            Issue(
                "warning",
                "OP_CALIBRATION_REPLAY_NOT_VALIDATED",
                name,
                (
                    "calibration_replayable=True could not be checked: process_many raised on the probe records. "
                    "Supply validation_samples() the op accepts."
                ),
            )
        )
    return issues


def _declares_calibration(op: BaseOp) -> bool:
    try:
        return bool(op.traits().calibration_replayable)
    except Exception:  # noqa: BLE001 - a user's traits() may raise anything: then it declares nothing
        return False


def _not_stream_items(outcome: _Outcome) -> str | None:
    """What is wrong with the shape of a successful output (None: a list of records)."""
    from zephon_columnar.records import SampleMeta, SampleRecord
    from zephon_columnar.types import SampleBatch

    if outcome.error is not None:
        return None
    out = outcome.output
    if not isinstance(out, (list, tuple)):
        return f"a {type(out).__name__} (not a list)"
    for i, item in enumerate(out):
        if isinstance(item, SampleBatch):
            continue
        if not isinstance(item, SampleRecord):
            return f"a {type(item).__name__} at output[{i}]"
        if not isinstance(item.meta, SampleMeta):
            return f"a SampleRecord whose meta is a {type(item.meta).__name__} at output[{i}]"
        if not item.meta.tombstone and not isinstance(item.payload, dict):
            return (
                f"a SampleRecord whose payload is a {type(item.payload).__name__} at output[{i}] (this engine "
                "keeps payloads as dicts of fields)"
            )
    return None


def _differs(name: str, first: _Outcome, second: _Outcome, changed_captured: list[str]) -> Issue:
    """Two fresh copies gave different results for the same input: unseeded randomness, or
    state they share (captured by the op's code) carried from one call to the next."""
    seen = first.difference(second)
    if changed_captured:  # Zephon's code for it; the message says where the difference comes from
        return Issue(
            "error",
            "OP_NONDETERMINISTIC",
            name,
            (
                f"the same input gave different results on two fresh copies of the op ({seen}), and a call changed "
                f"state its code captures ({', '.join(changed_captured)}): output depends on earlier calls. Keep state "
                "across calls in the accumulator (accumulator()), which the engine rebuilds at every flush point."
            ),
        )
    return Issue(
        "error",
        "OP_NONDETERMINISTIC",
        name,
        (
            f"two identical process_many calls on fresh copies of the op differ ({seen}). Derive randomness from "
            "a seed and the record (e.g. random.Random(hash(record.meta.sample_id))), never from the clock or the "
            "global random state."
        ),
    )


def _cross_call_issues(probe: BaseOp, name: str, samples: list[SampleRecord], first: _Outcome) -> list[Issue]:
    """A, then B, then A again on one copy: the second A must give what the first did."""
    _call(probe, _shifted(samples))  # what B gives does not matter, only what it leaves behind
    again = _call(probe, samples)
    if again.same_as(first):
        return []
    return [
        Issue(
            "error",
            "OP_CROSS_CALL_STATE",
            name,
            (
                f"the same input gave a different result after another call ({first.difference(again)}): "
                "process_many carries state from one call to the next. Keep state across calls "
                "in the accumulator (accumulator()), which the engine rebuilds at every flush point."
            ),
        )
    ]


def _changed(before: dict[str, str | None], after: dict[str, str | None]) -> list[str]:
    """Names whose fingerprint changed, appeared or disappeared (unfingerprintable ones skipped)."""
    names = [n for n in before if n not in after] + [n for n in after if n not in before]
    names += [n for n in before if n in after and None not in (before[n], after[n]) and before[n] != after[n]]
    return sorted(names)


def _state_change_issues(name: str, attrs: list[str], captured: list[str]) -> list[Issue]:
    """Warnings for state one call changed: the op's attributes, and what its code captures."""
    issues = []
    if attrs:
        issues.append(
            Issue(
                "warning",
                "OP_MUTATES_SELF",
                name,
                (
                    f"process_many changed the op's attributes {_few(attrs, 6)}. Fine for a read-only cache (a "
                    "tokenizer warming up); samples seen or counters belong in the accumulator (accumulator())."
                ),
            )
        )
    if attrs or captured:
        where = [f"attribute {a!r}" for a in attrs] + captured
        issues.append(
            Issue(
                "warning",
                "OP_STATE_CHANGED_DURING_CALL",
                name,
                (
                    f"one process_many call changed {', '.join(where)}. Such state differs between workers (each has "
                    "its own copy of the op; process workers also copy what its code captures) and is lost on restart: "
                    "keep it in the accumulator (accumulator())."
                ),
            )
        )
    return issues


_MUTABLE_CONTAINERS = (list, dict, set, bytearray, collections.deque)


def _captured_state(probe: BaseOp) -> dict[str, str | None]:
    """Fingerprints of what the op's user code holds on to outside its attributes: the object a
    given method is bound to, closure cells, default arguments, and the module-level containers
    it names."""
    state: dict[str, str | None] = {}
    for label, fn, _ in _user_functions(probe):
        code_fn = _code_function(fn)
        if code_fn is None:
            continue
        owner = fn.__self__ if isinstance(fn, types.MethodType) else None if isinstance(fn, _CODE_TYPES) else fn
        if owner is not None and owner is not probe:
            state[f"the {type(owner).__name__} object {label} belongs to"] = _fingerprint(owner)
        for var, cell in zip(code_fn.__code__.co_freevars, code_fn.__closure__ or ()):
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if not isinstance(value, _CODE_TYPES):
                state[f"closure variable {var!r} of {label}"] = _fingerprint(value)
        defaults = (code_fn.__defaults__ or ()) + tuple((code_fn.__kwdefaults__ or {}).values())
        if any(isinstance(d, _MUTABLE_CONTAINERS) for d in defaults):
            state[f"default arguments of {label}"] = _fingerprint(defaults)
        for var in _global_names(code_fn.__code__):
            value = code_fn.__globals__.get(var)
            if isinstance(value, _MUTABLE_CONTAINERS):
                state[f"module-level {var!r} used by {label}"] = _fingerprint(value)
    return state


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):  # nested functions and comprehensions
            names |= _global_names(const)
    return names


def _identity_issues(name: str, samples: list[SampleRecord], output: Any) -> list[Issue]:
    """Outputs keep their input's sample id, and a fan-out child's lineage extends its parent's
    (``spawn_child``), one distinct lineage per child."""
    lineages: dict[Any, set[tuple[int, ...]]] = collections.defaultdict(set)
    for r in samples:
        lineages[r.meta.sample_id].add(tuple(r.meta.lineage))
    inputs = Counter(_key(r) for r in samples)
    records = _records_in(output)
    issues = []
    fabricated = [r.meta.sample_id for r in records if r.meta.sample_id not in lineages]
    if fabricated:
        issues.append(
            Issue(
                "error",
                "OP_FABRICATES_SAMPLE_ID",
                name,
                (
                    f"output sample ids {_few(fabricated)} are not among the inputs. Keep the input record's meta "
                    "(rebuild record.payload), or derive new records' meta with spawn_child(record.meta, i)."
                ),
            )
        )
    stray = [
        _key(r)
        for r in records
        if r.meta.sample_id in lineages
        and not any(tuple(r.meta.lineage)[: len(parent)] == parent for parent in lineages[r.meta.sample_id])
    ]
    if stray:
        issues.append(
            Issue(
                "error",
                "OP_LINEAGE_NOT_VIA_CHILD",
                name,
                (
                    f"outputs (sample id, lineage) {_few(stray)} do not extend their input's lineage. Derive a fan-out "
                    "child's meta with spawn_child(record.meta, i) (or record.meta.child(i)), which appends i."
                ),
            )
        )
    counts = Counter(_key(r) for r in records)
    duplicated = [k for k, n in counts.items() if n > max(1, inputs[k])]
    if duplicated:
        issues.append(
            Issue(
                "error",
                "OP_FANOUT_DUPLICATE_LINEAGE",
                name,
                (
                    f"several outputs share (sample id, lineage) {_few(duplicated)}. Give each record made from one "
                    "input its own child index: spawn_child(record.meta, i) with i = 0, 1, 2, ..."
                ),
            )
        )
    return issues


def _few(items: list[Any], limit: int = 3) -> str:
    shown = ", ".join(repr(i) for i in items[:limit])
    return shown + (f" (+{len(items) - limit} more)" if len(items) > limit else "")


# ---------------------------------------------------------------------- calibration replay
def _calibration_issues(op: BaseOp, name: str, samples: list[SampleRecord], set_up: bool = True) -> list[Issue]:
    """A ``calibration_replayable`` op gives the same records (sample id and payload, drops
    included) whether called on the whole batch, one record at a time (``process_one``), on
    records with placeholder scheduling metadata, or in its accumulator's groups."""
    with ExitStack() as stack:
        if not _fresh_probe(op, name, stack, set_up).traits().calibration_replayable:
            return []
    baseline: Counter[Any] | None = None
    for mode in ("batch", "per-record process_one", "placeholder metadata", "accumulator groups"):
        with ExitStack() as stack:
            probe = _fresh_probe(op, name, stack, set_up)
            try:
                records = _replay(probe, mode, samples)
            except _AccumulatorUnusable:
                continue  # the accumulator checks report it
            except Exception as err:  # noqa: BLE001 - a user's operator may raise anything; reported below
                why = f"{mode} processing raised {type(err).__name__}: {err}"
                return _replay_unchecked(name, why) if baseline is None else _replay_mismatch(name, why)
        if records is None:
            return _replay_mismatch(name, f"{mode} processing returned something other than a list of SampleRecord")
        try:
            signature = Counter(
                (repr(r.meta.sample_id), _payload_key(r.payload)) for r in records if not r.meta.tombstone
            )
        except TypeError as err:
            return _replay_unchecked(name, str(err))
        if baseline is None:
            baseline = signature
        elif signature != baseline:
            return _replay_mismatch(name, f"{mode} processing changed payloads or record counts")
    return []


class _AccumulatorUnusable(Exception):
    pass


def _replay(probe: BaseOp, mode: str, samples: list[SampleRecord]) -> list[SampleRecord] | None:
    """The records ``probe`` emits for ``samples`` processed in ``mode`` (None: not records)."""
    from zephon_columnar.records import SampleRecord

    records = copy.deepcopy(samples)
    if mode == "batch":
        groups = [probe.process_many(records)]
    elif mode == "per-record process_one":
        groups = [probe.process_one(r) for r in records]
    elif mode == "placeholder metadata":
        groups = [probe.process_many([_placeholder(r) for r in records])]
    else:
        try:
            acc = _new_accumulator(probe)
            batches = _ready(acc.push_many(records), "push_many") + _ready(acc.flush(), "flush")
        except Exception as err:
            raise _AccumulatorUnusable() from err
        groups = [probe.process_many(batch) for batch, _ in batches]
    if any(not isinstance(g, (list, tuple)) for g in groups):
        return None
    out = [r for g in groups for r in g]
    return out if all(isinstance(r, SampleRecord) for r in out) else None


def _placeholder(record: SampleRecord) -> SampleRecord:
    """``record`` with the placeholder scheduling metadata calibration replays with (lane 0,
    chunk 0): only its identity (sample id, lineage, tags) is kept."""
    meta = replace(
        record.meta, lane_id=0, chunk_id=0, chunk_offset=0, component_sample_counts={0: 1}, component_token_counts=None
    )
    if meta.contributors:
        meta = meta.with_contributors(
            replace(ref, cursor=replace(ref.cursor, chunk_id=0, chunk_offset=0)) for ref in meta.contributors
        )
    return replace(record, meta=meta)


def _payload_key(value: Any) -> Any:
    """A hashable key of a payload value, independent of dict order and of array storage."""
    if value is None or type(value) in (str, bytes, int, float, complex, bool):
        return pickle.dumps(value)
    if type(value) in (list, tuple):
        return type(value).__name__, tuple(_payload_key(v) for v in value)
    if isinstance(value, dict):
        return "dict", frozenset((_payload_key(k), _payload_key(v)) for k, v in value.items())
    import numpy as np

    if isinstance(value, (np.ndarray, np.generic)):
        data = _payload_key(value.tolist()) if value.dtype.hasobject else value.tobytes()
        return "ndarray", str(value.dtype), value.shape, data
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        flat = value.detach().cpu().contiguous().reshape(-1)
        return "tensor", str(value.dtype), tuple(value.shape), flat.view(torch.uint8).numpy().tobytes()
    raise TypeError(f"payload values of type {type(value).__name__} cannot be compared")


def _replay_unchecked(name: str, why: str) -> list[Issue]:
    return [
        Issue(
            "warning",
            "OP_CALIBRATION_REPLAY_NOT_VALIDATED",
            name,
            (
                f"calibration_replayable=True could not be checked: {why}. Supply validation_samples() the op accepts "
                "without engine services, with payloads of scalars, lists, dicts, arrays or tensors."
            ),
        )
    ]


def _replay_mismatch(name: str, why: str) -> list[Issue]:
    return [
        Issue(
            "error",
            "OP_CALIBRATION_REPLAY_MISMATCH",
            name,
            (
                f"calibration_replayable=True but {why} compared with one call on the whole batch. Replay must give "
                "the same payloads and record counts per sample however records are grouped and whatever their lane or "
                "chunk; declare calibration_replayable=False if the op depends on them."
            ),
        )
    ]


# ====================================================================== accumulator checks
def _accumulator_ctx() -> dict[str, Any]:
    """What the factory gets as ``ctx``: deterministic mode, and the keys of this engine's context
    that are not lane-specific (the validator's accumulator sees every lane, as Zephon's does)."""
    return {"deterministic": True, "seed": 0, "component_names": {}}


def _new_accumulator(probe: BaseOp) -> Accumulator[Any]:
    from zephon_columnar.ops.user import accumulator_of

    return accumulator_of(probe, _accumulator_ctx())


class _Malformed(Exception):
    """An accumulator returned something other than ready batches (the engine raises on it)."""


def _ready(result: Any, what: str) -> list[tuple[list[SampleRecord], Any]]:
    """``result`` as ready batches ``(records, lane_id)``, or `_Malformed` saying what it is."""
    from zephon_columnar.records import SampleMeta, SampleRecord

    if not isinstance(result, (list, tuple)):
        raise _Malformed(f"{what} returned a {type(result).__name__}; return a list of (records, lane_id) pairs")
    batches = []
    for item in result:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], (list, tuple))):
            raise _Malformed(
                f"{what} returned a list holding {type(item).__name__}; each ready batch is a (records, lane_id) pair"
            )
        records, lane = item
        for r in records:
            if not isinstance(r, SampleRecord) or not isinstance(r.meta, SampleMeta):
                raise _Malformed(
                    f"{what} returned a ready batch holding {type(r).__name__}; batches hold the "
                    "SampleRecords that were pushed"
                )
        batches.append((list(records), lane))
    return batches


def _emitted(batches: list[tuple[list[SampleRecord], Any]]) -> list[SampleRecord]:
    return [r for records, _ in batches for r in records]


def _check_accumulator(op: BaseOp, name: str, samples: list[SampleRecord]) -> list[Issue]:
    """The op's accumulator on the probe records: conservation, reset, has_pending_data, lanes,
    per-lane flush. Stops after the factory or push/flush raising (the rest would too)."""
    with ExitStack() as stack:
        try:
            probe = _fresh_probe(op, name, stack)
        except _NoProbe:
            return []  # the operator checks reported why
        try:
            _new_accumulator(probe)
        except Exception as err:  # noqa: BLE001 - a user's accumulator factory may raise anything; reported below
            return [
                Issue(
                    "error",
                    "ACC_FACTORY_RAISED",
                    name,
                    (
                        f"the accumulator factory failed: {type(err).__name__}: {err}. It must build an Accumulator "
                        f"when called with deterministic=True and ctx={_accumulator_ctx()} (no lane_id)."
                    ),
                )
            ]

        def factory() -> Accumulator[Any]:
            return _new_accumulator(probe)

        issues = _guarded(name, "accumulator conservation", lambda: _acc_conservation(factory, name, samples))
        if any(i.code == "ACC_PUSH_OR_FLUSH_RAISED" for i in issues):
            return issues
        for what, check in (
            ("accumulator reset", _acc_reset_is_fresh),
            ("has_pending_data", _acc_pending_is_truthful),
            ("accumulator lanes", _acc_keeps_lanes),
            ("per-lane flush", _acc_flushes_per_lane),
        ):
            issues += _guarded(name, what, functools.partial(check, factory, name, samples))
        return issues


def _acc_conservation(factory: Callable[[], Any], name: str, samples: list[SampleRecord]) -> list[Issue]:
    """Every pushed sample comes out of ``push_many`` + ``flush()`` once (or its tombstone)."""
    acc = factory()
    try:
        out = _emitted(_ready(acc.push_many(copy.deepcopy(samples)), "push_many") + _ready(acc.flush(), "flush()"))
    except Exception as err:  # noqa: BLE001 - a user's accumulator may raise anything; reported below
        return [
            Issue(
                "error",
                "ACC_PUSH_OR_FLUSH_RAISED",
                name,
                (
                    f"push_many/flush failed on the probe records: {type(err).__name__}: {err}. An accumulator groups "
                    "any records it is given; if it needs particular fields, give the op validation_samples()."
                ),
            )
        ]
    pushed = Counter(_key(r) for r in samples)
    got = Counter(k for r in out for k in _samples_closed(r))
    lost, gained = list((pushed - got).elements()), list((got - pushed).elements())
    if not lost and not gained:
        return []
    return [
        Issue(
            "error",
            "ACC_FLUSH_LOSES_SAMPLES",
            name,
            (
                f"push_many + flush() took {sum(pushed.values())} samples and gave back {sum(got.values())} (lost "
                f"{_few(lost) or 'none'}; extra {_few(gained) or 'none'}). Emit every record pushed exactly once by "
                "the end of flush(); to drop one, emit tombstones_for_record(record) for it."
            ),
        )
    ]


def _batch_shape(batches: list[tuple[list[SampleRecord], Any]]) -> list[Any]:
    """Ready batches as comparable values: lane label and each record's identity and content."""
    return [(repr(lane), _output_keys(records)) for records, lane in batches]


def _acc_reset_is_fresh(factory: Callable[[], Any], name: str, samples: list[SampleRecord]) -> list[Issue]:
    """After A, ``flush(reset=True)``, B gives what a new accumulator gives for B."""
    second = _shifted(samples)
    used = factory()
    used.push_many(copy.deepcopy(samples))
    try:
        used.flush(reset=True)
        after_reset = _ready(used.push_many(copy.deepcopy(second)), "push_many") + _ready(used.flush(), "flush()")
    except Exception as err:  # noqa: BLE001 - a user's accumulator may raise anything; reported below
        return [
            Issue(
                "error",
                "ACC_RESET_RAISED",
                name,
                (
                    f"flush(reset=True), or using the accumulator after it, failed: {type(err).__name__}: {err}. After "
                    "a reset the accumulator must work exactly as a new one."
                ),
            )
        ]
    fresh = factory()
    new = _ready(fresh.push_many(copy.deepcopy(second)), "push_many") + _ready(fresh.flush(), "flush()")
    if _batch_shape(after_reset) == _batch_shape(new):
        return []
    return [
        Issue(
            "error",
            "ACC_RESET_NOT_FRESH",
            name,
            (
                f"after flush(reset=True) the same pushes gave {len(after_reset)} ready batches of "
                f"{[len(b) for b, _ in after_reset]} records, a new accumulator {len(new)} of "
                f"{[len(b) for b, _ in new]} (or their records differ). flush(reset=True) must clear every buffer and "
                "counter, as in __init__."
            ),
        )
    ]


def _acc_pending_is_truthful(factory: Callable[[], Any], name: str, samples: list[SampleRecord]) -> list[Issue]:
    """``has_pending_data()`` is True exactly while pushed samples have not come out (per lane
    too), and False once ``flush()`` gave back everything."""
    lane_of = {_key(r): r.meta.lane_id for r in samples}

    def came_out(records: list[SampleRecord]) -> list[Any]:  # the lanes they were pushed on
        return [lane_of[k] for r in records for k in _samples_closed(r) if k in lane_of]

    acc = factory()
    lies = []
    if acc.has_pending_data():
        lies.append("a new accumulator says it has pending data")
    held: Counter[Any] = Counter()
    for part in (samples[:1], samples[1:]):
        held.update(r.meta.lane_id for r in part)
        held.subtract(came_out(_emitted(_ready(acc.push_many(copy.deepcopy(part)), "push_many"))))
        holding, pending = sum(held.values()) > 0, bool(acc.has_pending_data())
        if holding != pending:
            lies.append(
                f"after pushing {len(part)} more it holds {max(0, sum(held.values()))} samples but "
                f"has_pending_data() is {pending}"
            )
    if _accepts_lane_id(acc.has_pending_data):
        wrong = [lane for lane in sorted(held) if (held[lane] > 0) != bool(acc.has_pending_data(lane))]
        if wrong:
            lies.append(f"has_pending_data(lane_id) is wrong for lanes {wrong}")
    held.subtract(came_out(_emitted(_ready(acc.flush(), "flush()"))))
    if sum(held.values()) <= 0 and acc.has_pending_data():
        lies.append("flush() gave back every sample, yet has_pending_data() is still True")
    if not lies:
        return []
    return [
        Issue(
            "error",
            "ACC_HAS_PENDING_LIES",
            name,
            (
                f"has_pending_data() disagrees with what the accumulator holds: {'; '.join(lies)}. Return True exactly "
                "while records pushed (for lane_id: on that lane) have not been emitted; the engine flushes by it."
            ),
        )
    ]


def _interleaved(samples: list[SampleRecord]) -> list[SampleRecord]:
    """``samples`` round-robin across their lanes, so one push spans lanes record by record."""
    by_lane: dict[Any, list[SampleRecord]] = {}
    for r in samples:
        by_lane.setdefault(r.meta.lane_id, []).append(r)
    rounds = max((len(v) for v in by_lane.values()), default=0)
    return [lane[i] for i in range(rounds) for lane in by_lane.values() if i < len(lane)]


def _acc_keeps_lanes(factory: Callable[[], Any], name: str, samples: list[SampleRecord]) -> list[Issue]:
    """Records keep their lane, and every ready batch holds one lane's records labelled with it."""
    issues = []
    lane_of = {_key(r): r.meta.lane_id for r in samples}
    acc = factory()
    out = _emitted(_ready(acc.push_many(copy.deepcopy(samples)), "push_many") + _ready(acc.flush(), "flush()"))
    moved = [
        (_key(r), lane_of[_key(r)], r.meta.lane_id)
        for r in out
        if _key(r) in lane_of and r.meta.lane_id != lane_of[_key(r)]
    ]
    if moved:
        issues.append(
            Issue(
                "error",
                "ACC_MUTATES_LANE_ID",
                name,
                (
                    f"records came out on another lane (sample, pushed on, emitted on): {_few(moved)}. An accumulator "
                    "must not change record.meta.lane_id: lanes are the engine's."
                ),
            )
        )
    problems = []
    mixed_input = _interleaved(copy.deepcopy(samples))
    acc = factory()
    ready, flushed = _ready(acc.push_many(mixed_input), "push_many"), _ready(acc.flush(), "flush()")
    # One batch of exactly what was pushed is the passthrough shape: its input's lanes are upstream's concern.
    passthrough = len(ready) == 1 and not flushed and len(ready[0][0]) == len(mixed_input)
    batches = [] if passthrough else ready + flushed
    for lane in dict.fromkeys(r.meta.lane_id for r in samples):
        acc = factory()  # one lane at a time, as this engine feeds it
        own = [r for r in copy.deepcopy(samples) if r.meta.lane_id == lane]
        batches += _ready(acc.push_many(own), "push_many") + _ready(acc.flush(), "flush()")
    for records, _wait_ns in batches:
        lanes = sorted({r.meta.lane_id for r in records}, key=repr)
        if len(lanes) > 1:
            problems.append(f"a batch mixes lanes {lanes}")
    if problems:
        issues.append(
            Issue(
                "error",
                "ACC_BATCH_NOT_LANE_PURE",
                name,
                (
                    f"{'; '.join(dict.fromkeys(problems))}. Buffer per lane (records' meta.lane_id) and return each "
                    "ready batch as (one lane's records, wait_ns)."
                ),
            )
        )
    return issues


def _accepts_lane_id(method: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return True  # cannot tell: let the call decide
    return any(p.name == "lane_id" or p.kind is p.VAR_KEYWORD for p in params)


def _acc_flushes_per_lane(factory: Callable[[], Any], name: str, samples: list[SampleRecord]) -> list[Issue]:
    """``flush(reset=True, lane_id=L)`` empties lane L and neither emits nor drops another lane
    (the engine flushes each lane at its own flush points)."""
    acc = factory()
    if not (_accepts_lane_id(acc.flush) and _accepts_lane_id(acc.has_pending_data)):
        return [_no_per_lane_flush(name, "flush() or has_pending_data() takes no lane_id")]
    lane_of = {_key(r): r.meta.lane_id for r in samples}
    lanes = list(dict.fromkeys(lane_of.values()))
    target, others = lanes[0], lanes[1:]
    pushed_out = _emitted(_ready(acc.push_many(copy.deepcopy(samples)), "push_many"))
    try:
        pending_before = {lane for lane in others if acc.has_pending_data(lane)}
        emitted = _emitted(_ready(acc.flush(reset=True, lane_id=target), f"flush(reset=True, lane_id={target!r})"))
    except TypeError as err:
        return [_no_per_lane_flush(name, f"calling it with lane_id raised TypeError: {err}")]
    except Exception as err:  # noqa: BLE001 - a user's accumulator may raise anything; reported below
        return [
            Issue(
                "error",
                "ACC_PUSH_OR_FLUSH_RAISED",
                name,
                (
                    f"flush(reset=True, lane_id={target!r}) failed: {type(err).__name__}: {err}; the engine flushes "
                    "one lane at a time this way."
                ),
            )
        ]
    came_out = [lane_of.get(k) for r in pushed_out + emitted for k in _samples_closed(r)]
    never_out = sum(lane == target for lane in lane_of.values()) - came_out.count(target)
    issues = []
    if acc.has_pending_data(target):
        if never_out > 0:
            issues.append(
                Issue(
                    "error",
                    "ACC_PER_LANE_FLUSH_NOT_DRAINED",
                    name,
                    (
                        f"after flush(reset=True, lane_id={target!r}) lane {target!r} still has pending data "
                        f"({never_out} of its samples never came out). A per-lane flush must emit (or drop, with "
                        "tombstones) everything that lane holds."
                    ),
                )
            )
        else:
            issues.append(
                Issue(
                    "error",
                    "ACC_HAS_PENDING_LIES",
                    name,
                    (
                        f"has_pending_data({target!r}) is True after flush(reset=True, lane_id={target!r}) gave back "
                        f"every sample of lane {target!r}. Answer for the lane asked about only."
                    ),
                )
            )
    leaked = sorted({lane_of.get(k, r.meta.lane_id) for r in emitted for k in _samples_closed(r)} - {target}, key=repr)
    drained = sorted((lane for lane in pending_before if not acc.has_pending_data(lane)), key=repr)
    if leaked or drained:
        issues.append(
            Issue(
                "error",
                "ACC_FLUSH_LEAKS_OTHER_LANES",
                name,
                (
                    f"flush(reset=True, lane_id={target!r}) "
                    + ", ".join(
                        x
                        for x in (
                            f"emitted records of lanes {leaked}" if leaked else "",
                            f"emptied lanes {drained}" if drained else "",
                        )
                        if x
                    )
                    + ". Flush only the lane asked for: other lanes are at other points of their streams."
                ),
            )
        )
    return issues


def _no_per_lane_flush(name: str, why: str) -> Issue:
    return Issue(
        "error",
        "ACC_NO_PER_LANE_FLUSH",
        name,
        (
            f"the accumulator cannot flush one lane: {why}. Define flush(self, *, reset=False, lane_id=None) and "
            "has_pending_data(self, lane_id=None), acting on that lane only when lane_id is given."
        ),
    )


# ====================================================================== static scan
#: Methods whose call changes the object they are called on.
_MUTATING_METHODS = frozenset(
    {
        "append",
        "extend",
        "insert",
        "pop",
        "popitem",
        "remove",
        "clear",
        "update",
        "setdefault",
        "add",
        "discard",
        "sort",
        "reverse",
        "__setitem__",
        "__delitem__",
    }
)


def _check_source(op: BaseOp, name: str) -> list[Issue]:
    """Warnings from the source of the op's pure part: writes to ``self``, and calls that read
    the clock or unseeded randomness."""
    issues = []
    for label, fn, is_method in _user_functions(op):
        found = _function_source(fn, is_method)
        if found is None:
            continue  # no source to read (REPL, exec, builtin): nothing to say
        writes = _self_writes(found.node, found.receiver) if found.receiver else []
        if writes:
            issues.append(
                Issue(
                    "warning",
                    "OP_WRITES_TO_SELF",
                    name,
                    (
                        f"{label} writes to {found.receiver} ({found.show(writes)}). Configuration belongs in "
                        "__init__, per-worker resources in setup(), and state across calls in the accumulator "
                        "(accumulator())."
                    ),
                )
            )
        calls = _nondeterministic_calls(found.node, found.fn)
        if calls:
            issues.append(
                Issue(
                    "warning",
                    "OP_NONDETERMINISTIC_STDLIB_CALL",
                    name,
                    (
                        f"{label} reads the clock or unseeded randomness ({found.show(calls)}), which breaks replay. "
                        "Seed a generator from the record (random.Random(hash(record.meta.sample_id))) or from a seed "
                        "given to __init__; keep the clock out of the data."
                    ),
                )
            )
    return issues


def _user_functions(op: BaseOp) -> list[tuple[str, Any, bool]]:
    """(label, callable, whether it is a method of the op) for the op's user-written pure part:
    the kwargs form's functions, or an instance's own process_many / process_one /
    process_columns (this library's defaults are skipped)."""
    from zephon_columnar.ops.user import FunctionOp

    if isinstance(op, FunctionOp):
        given = (
            ("process_many", op._process_many),  # noqa: SLF001 - the functions FunctionOp wraps
            ("process_columns", op._process_columns),  # noqa: SLF001
            ("process_one", op._process_one),  # noqa: SLF001
        )
        return [(label, fn, False) for label, fn in given if fn is not None]
    out = []
    for label in ("process_many", "process_one", "process_columns"):
        fn = inspect.getattr_static(type(op), label, None)
        if isinstance(fn, (staticmethod, classmethod)):
            fn = fn.__func__
        if isinstance(fn, types.FunctionType) and not (fn.__module__ or "").startswith("zephon_columnar."):
            out.append((label, fn, True))
    return out


def _code_function(fn: Any) -> types.FunctionType | None:
    """The Python function whose code runs when ``fn`` is called (None: not Python code)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if isinstance(fn, types.MethodType):
        fn = fn.__func__
    if not isinstance(fn, types.FunctionType) and callable(fn):
        fn = getattr(type(fn), "__call__", None)  # noqa: B004 - not a callable() test: a callable object's class's __call__
    return fn if isinstance(fn, types.FunctionType) else None


@dataclass(frozen=True)
class _Source:
    """A user function's parsed source: its ``def``/``lambda`` node, the function, the name of
    its receiver (``self``; None for a plain function) and its file's lines."""

    node: ast.AST
    fn: types.FunctionType
    receiver: str | None
    lines: list[str]

    def show(self, line_numbers: list[int], limit: int = 4) -> str:
        shown = ", ".join(f"line {n}: {self.lines[n - 1].strip()[:80]}" for n in line_numbers[:limit])
        return shown + (f" (+{len(line_numbers) - limit} more)" if len(line_numbers) > limit else "")


def _function_source(fn: Any, is_method: bool) -> _Source | None:
    """``fn``'s `_Source`, or None when its source cannot be read."""
    code_fn = _code_function(fn)
    if code_fn is None:
        return None
    bound = is_method or isinstance(fn, types.MethodType) or not isinstance(fn, (types.FunctionType, functools.partial))
    params = code_fn.__code__.co_varnames[: code_fn.__code__.co_argcount]
    receiver = params[0] if bound and params else None
    try:
        path = inspect.getsourcefile(code_fn)
    except TypeError:
        return None
    lines = linecache.getlines(path, code_fn.__globals__) if path else []
    if not lines:
        return None
    tree = _parsed("".join(lines))
    if tree is None:
        return None
    code = code_fn.__code__
    matches = [n for n in ast.walk(tree) if _defines(n, code)]
    return _Source(matches[0], code_fn, receiver, lines) if len(matches) == 1 else None


@functools.lru_cache(maxsize=16)
def _parsed(source: str) -> ast.AST | None:
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):
        return None


def _defines(node: ast.AST, code: types.CodeType) -> bool:
    """Whether ``node`` is the ``def`` or ``lambda`` that compiled to ``code``."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        return node.name == code.co_name and first == code.co_firstlineno
    if isinstance(node, ast.Lambda):
        args = [a.arg for a in node.args.posonlyargs + node.args.args]
        return (
            code.co_name == "<lambda>"
            and node.lineno == code.co_firstlineno
            and args == list(code.co_varnames[: code.co_argcount])
        )
    return False


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _self_writes(tree: ast.AST, receiver: str) -> list[int]:
    """Lines where ``tree`` stores into ``receiver.<attr>`` (assignment, augmented assignment,
    del, item store), mutates it in place (``self.seen.append(...)``) or calls setattr on it."""
    hits = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, (ast.Attribute, ast.Subscript))
            and isinstance(node.ctx, (ast.Store, ast.Del))
            and _root_name(node) == receiver
        ):
            hits.add(node.lineno)
        elif isinstance(node, ast.Call):
            func = node.func
            if (
                isinstance(func, ast.Attribute)
                and func.attr in _MUTATING_METHODS
                and not isinstance(func.value, ast.Name)
                and _root_name(func.value) == receiver
            ) or (
                isinstance(func, ast.Name)
                and func.id in ("setattr", "delattr")
                and node.args
                and isinstance(node.args[0], ast.Name)
                and node.args[0].id == receiver
            ):
                hits.add(node.lineno)
    return sorted(hits)


@dataclass(frozen=True)
class _Rule:
    """A call that reads the clock or unseeded randomness; with ``max_args`` set, only when
    given at most that many arguments (``random.Random()`` is unseeded, ``random.Random(7)``
    is not; ``time.localtime()`` reads the clock, ``time.localtime(t)`` does not)."""

    name: str
    max_args: int | None = None


@functools.lru_cache(maxsize=1)
def _nondeterministic_rules() -> dict[str, _Rule]:
    """The qualified names the static scan flags."""
    import random
    import secrets

    rules = [
        _Rule(f"random.{n}")
        for n in dir(random)
        if not n.startswith("_")
        and n not in ("Random", "SystemRandom", "seed", "getstate", "setstate")
        and callable(getattr(random, n))
        and not isinstance(getattr(random, n), type)
    ]
    rules += [_Rule("random.SystemRandom"), _Rule("random.Random", 0), _Rule("random.seed", 0)]
    rules += [
        _Rule(f"time.{n}")
        for n in (
            "time",
            "time_ns",
            "monotonic",
            "monotonic_ns",
            "perf_counter",
            "perf_counter_ns",
            "process_time",
            "process_time_ns",
            "thread_time",
            "thread_time_ns",
        )
    ]
    rules += [_Rule(f"time.{n}", 0) for n in ("ctime", "localtime", "gmtime", "asctime")] + [_Rule("time.strftime", 1)]
    rules += [_Rule("uuid.uuid1"), _Rule("uuid.uuid4"), _Rule("os.urandom")]
    rules += [
        _Rule(f"secrets.{n}")
        for n in dir(secrets)
        if not n.startswith("_") and callable(getattr(secrets, n)) and n not in ("compare_digest",)
    ]
    try:
        import numpy.random as npr

        seeded = ("default_rng", "RandomState", "seed")
        kept = (
            "Generator",
            "SeedSequence",
            "BitGenerator",
            "MT19937",
            "PCG64",
            "PCG64DXSM",
            "Philox",
            "SFC64",
            "get_state",
            "set_state",
            "get_bit_generator",
            "set_bit_generator",
        )
        rules += [
            _Rule(f"numpy.random.{n}", 0 if n in seeded else None) for n in getattr(npr, "__all__", ()) if n not in kept
        ]
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    return {r.name: r for r in rules}


@functools.lru_cache(maxsize=1)
def _rules_by_object() -> dict[int, str]:
    """id(the object) -> qualified name, for every flagged name that resolves to an object: calls
    through aliases (``from random import random as r``) are found by identity."""
    import importlib

    found: dict[int, str] = {}
    for qualname in _nondeterministic_rules():
        module, _, attr = qualname.rpartition(".")
        try:
            found[id(getattr(importlib.import_module(module), attr))] = qualname
        except (ImportError, AttributeError):
            continue
    return found


def _nondeterministic_calls(tree: ast.AST, fn: types.FunctionType) -> list[int]:
    """Lines of calls in ``tree`` to a flagged function, however its module was imported."""
    rules = _nondeterministic_rules()
    imports = _local_imports(tree)
    hits = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        qualname = _qualified_call(node.func, fn, imports)
        rule = rules.get(qualname) if qualname else None
        if rule and (rule.max_args is None or len(node.args) + len(node.keywords) <= rule.max_args):
            hits.add(node.lineno)
    return sorted(hits)


def _local_imports(tree: ast.AST) -> dict[str, str]:
    """Names bound by ``import`` statements inside the function -> what they name."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    bound[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return bound


def _qualified_call(func: ast.AST, fn: types.FunctionType, imports: dict[str, str]) -> str | None:
    """The qualified name a called expression ``a.b.c`` refers to, resolved through the
    function's local imports, closure and globals (None: not a dotted name)."""
    parts: list[str] = []
    while isinstance(func, ast.Attribute):
        parts.insert(0, func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return None
    root, rest = func.id, parts
    if root in imports:
        return _canonical(".".join([imports[root], *rest]))
    scope = dict(zip(fn.__code__.co_freevars, [_cell(c) for c in fn.__closure__ or ()]))
    missing = object()
    obj = scope.get(root, fn.__globals__.get(root, getattr(builtins, root, missing)))
    if obj is missing:  # unknown name: trust the spelling (``random.random()``)
        return _canonical(".".join([root, *rest]))
    for attr in rest:
        if not isinstance(obj, types.ModuleType):
            return None  # a method of some object (a seeded generator): not a module function
        obj = getattr(obj, attr, missing)
        if obj is missing:
            return None
    return _rules_by_object().get(id(obj))


def _cell(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:
        return None


def _canonical(dotted: str) -> str:
    return "numpy." + dotted[len("np.") :] if dotted.startswith("np.") else dotted


__all__ = ["Issue", "ValidationError", "ValidationReport", "preflight_tokenizers", "validate_ops"]
