"""The operator checks, run on ``process_many`` of fresh probe copies: the output type (a list
of records), determinism across two fresh copies, cross-call state (A, B, A on one copy), the
op's attributes and the state its code captures changed by a call, sample-id and lineage
integrity, the warning for an op that rejects every probe payload, and, for
``calibration_replayable`` ops, the calibration replay checks of `calibration`."""

from __future__ import annotations

import collections
import types
from collections import Counter
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from zephon_columnar.validation.calibration import calibration_issues
from zephon_columnar.validation.probes import (
    CODE_TYPES,
    Outcome,
    call,
    fingerprint,
    fresh_probe,
    guarded,
    sample_key,
    shifted,
)
from zephon_columnar.validation.report import Issue, few
from zephon_columnar.validation.static import code_function, user_functions

if TYPE_CHECKING:
    from zephon_columnar.ops.base import BaseOp
    from zephon_columnar.records import SampleRecord


def check_operator(
    op: BaseOp, name: str, samples: list[SampleRecord], own_samples: bool, set_up: bool = True
) -> list[Issue]:
    """``process_many`` on fresh (set-up) copies: output type, determinism, cross-call state,
    state changed by a call, sample identity and calibration replay."""
    with ExitStack() as stack:
        first_probe = fresh_probe(op, name, stack, set_up)
        first = call(first_probe, samples)
        second_probe = fresh_probe(op, name, stack, set_up)
        attrs_before = {k: fingerprint(v) for k, v in vars(second_probe).items()}
        captured_before = _captured_state(second_probe)
        second = call(second_probe, samples)
        changed_attrs = _changed(attrs_before, {k: fingerprint(v) for k, v in vars(second_probe).items()})
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
            issues += guarded(name, "cross-call state", lambda: _cross_call_issues(first_probe, name, samples, first))
        if first.error is None:
            issues += guarded(name, "sample identity", lambda: _identity_issues(name, samples, first.output))
    issues += guarded(name, "calibration replay", lambda: calibration_issues(op, name, samples, set_up))
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


def _not_stream_items(outcome: Outcome) -> str | None:
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


def _differs(name: str, first: Outcome, second: Outcome, changed_captured: list[str]) -> Issue:
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


def _cross_call_issues(probe: BaseOp, name: str, samples: list[SampleRecord], first: Outcome) -> list[Issue]:
    """A, then B, then A again on one copy: the second A must give what the first did."""
    call(probe, shifted(samples))  # what B gives does not matter, only what it leaves behind
    again = call(probe, samples)
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
                    f"process_many changed the op's attributes {few(attrs, 6)}. Fine for a read-only cache (a "
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
    for label, fn, _ in user_functions(probe):
        code_fn = code_function(fn)
        if code_fn is None:
            continue
        owner = fn.__self__ if isinstance(fn, types.MethodType) else None if isinstance(fn, CODE_TYPES) else fn
        if owner is not None and owner is not probe:
            state[f"the {type(owner).__name__} object {label} belongs to"] = fingerprint(owner)
        for var, cell in zip(code_fn.__code__.co_freevars, code_fn.__closure__ or ()):
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if not isinstance(value, CODE_TYPES):
                state[f"closure variable {var!r} of {label}"] = fingerprint(value)
        defaults = (code_fn.__defaults__ or ()) + tuple((code_fn.__kwdefaults__ or {}).values())
        if any(isinstance(d, _MUTABLE_CONTAINERS) for d in defaults):
            state[f"default arguments of {label}"] = fingerprint(defaults)
        for var in _global_names(code_fn.__code__):
            value = code_fn.__globals__.get(var)
            if isinstance(value, _MUTABLE_CONTAINERS):
                state[f"module-level {var!r} used by {label}"] = fingerprint(value)
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
    inputs = Counter(sample_key(r) for r in samples)
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
                    f"output sample ids {few(fabricated)} are not among the inputs. Keep the input record's meta "
                    "(rebuild record.payload), or derive new records' meta with spawn_child(record.meta, i)."
                ),
            )
        )
    stray = [
        sample_key(r)
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
                    f"outputs (sample id, lineage) {few(stray)} do not extend their input's lineage. Derive a fan-out "
                    "child's meta with spawn_child(record.meta, i) (or record.meta.child(i)), which appends i."
                ),
            )
        )
    counts = Counter(sample_key(r) for r in records)
    duplicated = [k for k, n in counts.items() if n > max(1, inputs[k])]
    if duplicated:
        issues.append(
            Issue(
                "error",
                "OP_FANOUT_DUPLICATE_LINEAGE",
                name,
                (
                    f"several outputs share (sample id, lineage) {few(duplicated)}. Give each record made from one "
                    "input its own child index: spawn_child(record.meta, i) with i = 0, 1, 2, ..."
                ),
            )
        )
    return issues


def _records_in(output: Any) -> list[SampleRecord]:
    """The records of a ``process_many`` output (a `SampleBatch` counts as its records)."""
    from zephon_columnar.types import SampleBatch

    records: list[SampleRecord] = []
    for item in output:
        records.extend(item.records if isinstance(item, SampleBatch) else [item])
    return records
