"""The accumulator contract checks, on the accumulator an op builds with
``accumulator(deterministic=True, ctx=...)``: samples are conserved over ``push_many`` +
``flush`` (a tombstone counts as the sample it closes), ``flush(reset=True)`` leaves it fresh,
``has_pending_data`` is truthful, records keep their lane and batches are lane-pure, and
``flush(lane_id=L)`` drains lane L and touches no other lane. Also the helpers that build an
accumulator and read its ready batches, which calibration replay uses too."""

from __future__ import annotations

import copy
import functools
import inspect
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from zephon_columnar.validation.probes import NoProbe, fresh_probe, guarded, output_keys, sample_key, shifted
from zephon_columnar.validation.report import Issue, few

if TYPE_CHECKING:
    from zephon_columnar.ops.accumulators import Accumulator
    from zephon_columnar.ops.base import BaseOp
    from zephon_columnar.records import SampleRecord


def _accumulator_ctx() -> dict[str, Any]:
    """What the factory gets as ``ctx``: deterministic mode, and the keys of this engine's context
    that are not lane-specific (the validator's accumulator sees every lane, as Zephon's does)."""
    return {"deterministic": True, "seed": 0, "component_names": {}}


def new_accumulator(probe: BaseOp) -> Accumulator[Any]:
    from zephon_columnar.ops.user import accumulator_of

    return accumulator_of(probe, _accumulator_ctx())


class _Malformed(Exception):
    """An accumulator returned something other than ready batches (the engine raises on it)."""


def ready_batches(result: Any, what: str) -> list[tuple[list[SampleRecord], Any]]:
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


def _samples_closed(record: SampleRecord) -> list[tuple[Any, tuple[int, ...]]]:
    """The samples a record stands for: itself, or for a tombstone the samples it closes."""
    if record.meta.tombstone:
        return [
            (ref.cursor.sample_id, tuple(ref.cursor.lineage))
            for ref in record.meta.contribution_refs()
            if ref.is_last_child
        ]
    return [sample_key(record)]


def check_accumulator(op: BaseOp, name: str, samples: list[SampleRecord]) -> list[Issue]:
    """The op's accumulator on the probe records: conservation, reset, has_pending_data, lanes,
    per-lane flush. Stops after the factory or push/flush raising (the rest would too)."""
    with ExitStack() as stack:
        try:
            probe = fresh_probe(op, name, stack)
        except NoProbe:
            return []  # the operator checks reported why
        try:
            new_accumulator(probe)
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
            return new_accumulator(probe)

        issues = guarded(name, "accumulator conservation", lambda: _acc_conservation(factory, name, samples))
        if any(i.code == "ACC_PUSH_OR_FLUSH_RAISED" for i in issues):
            return issues
        for what, check in (
            ("accumulator reset", _acc_reset_is_fresh),
            ("has_pending_data", _acc_pending_is_truthful),
            ("accumulator lanes", _acc_keeps_lanes),
            ("per-lane flush", _acc_flushes_per_lane),
        ):
            issues += guarded(name, what, functools.partial(check, factory, name, samples))
        return issues


def _acc_conservation(factory: Callable[[], Any], name: str, samples: list[SampleRecord]) -> list[Issue]:
    """Every pushed sample comes out of ``push_many`` + ``flush()`` once (or its tombstone)."""
    acc = factory()
    try:
        out = _emitted(
            ready_batches(acc.push_many(copy.deepcopy(samples)), "push_many") + ready_batches(acc.flush(), "flush()")
        )
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
    pushed = Counter(sample_key(r) for r in samples)
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
                f"{few(lost) or 'none'}; extra {few(gained) or 'none'}). Emit every record pushed exactly once by "
                "the end of flush(); to drop one, emit tombstones_for_record(record) for it."
            ),
        )
    ]


def _batch_shape(batches: list[tuple[list[SampleRecord], Any]]) -> list[Any]:
    """Ready batches as comparable values: lane label and each record's identity and content."""
    return [(repr(lane), output_keys(records)) for records, lane in batches]


def _acc_reset_is_fresh(factory: Callable[[], Any], name: str, samples: list[SampleRecord]) -> list[Issue]:
    """After A, ``flush(reset=True)``, B gives what a new accumulator gives for B."""
    second = shifted(samples)
    used = factory()
    used.push_many(copy.deepcopy(samples))
    try:
        used.flush(reset=True)
        after_reset = ready_batches(used.push_many(copy.deepcopy(second)), "push_many") + ready_batches(
            used.flush(), "flush()"
        )
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
    new = ready_batches(fresh.push_many(copy.deepcopy(second)), "push_many") + ready_batches(fresh.flush(), "flush()")
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
    lane_of = {sample_key(r): r.meta.lane_id for r in samples}

    def came_out(records: list[SampleRecord]) -> list[Any]:  # the lanes they were pushed on
        return [lane_of[k] for r in records for k in _samples_closed(r) if k in lane_of]

    acc = factory()
    lies = []
    if acc.has_pending_data():
        lies.append("a new accumulator says it has pending data")
    held: Counter[Any] = Counter()
    for part in (samples[:1], samples[1:]):
        held.update(r.meta.lane_id for r in part)
        held.subtract(came_out(_emitted(ready_batches(acc.push_many(copy.deepcopy(part)), "push_many"))))
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
    held.subtract(came_out(_emitted(ready_batches(acc.flush(), "flush()"))))
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
    lane_of = {sample_key(r): r.meta.lane_id for r in samples}
    acc = factory()
    out = _emitted(
        ready_batches(acc.push_many(copy.deepcopy(samples)), "push_many") + ready_batches(acc.flush(), "flush()")
    )
    moved = [
        (sample_key(r), lane_of[sample_key(r)], r.meta.lane_id)
        for r in out
        if sample_key(r) in lane_of and r.meta.lane_id != lane_of[sample_key(r)]
    ]
    if moved:
        issues.append(
            Issue(
                "error",
                "ACC_MUTATES_LANE_ID",
                name,
                (
                    f"records came out on another lane (sample, pushed on, emitted on): {few(moved)}. An accumulator "
                    "must not change record.meta.lane_id: lanes are the engine's."
                ),
            )
        )
    problems = []
    mixed_input = _interleaved(copy.deepcopy(samples))
    acc = factory()
    ready, flushed = ready_batches(acc.push_many(mixed_input), "push_many"), ready_batches(acc.flush(), "flush()")
    # One batch of exactly what was pushed is the passthrough shape: its input's lanes are upstream's concern.
    passthrough = len(ready) == 1 and not flushed and len(ready[0][0]) == len(mixed_input)
    batches = [] if passthrough else ready + flushed
    for lane in dict.fromkeys(r.meta.lane_id for r in samples):
        acc = factory()  # one lane at a time, as this engine feeds it
        own = [r for r in copy.deepcopy(samples) if r.meta.lane_id == lane]
        batches += ready_batches(acc.push_many(own), "push_many") + ready_batches(acc.flush(), "flush()")
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
    lane_of = {sample_key(r): r.meta.lane_id for r in samples}
    lanes = list(dict.fromkeys(lane_of.values()))
    target, others = lanes[0], lanes[1:]
    pushed_out = _emitted(ready_batches(acc.push_many(copy.deepcopy(samples)), "push_many"))
    try:
        pending_before = {lane for lane in others if acc.has_pending_data(lane)}
        emitted = _emitted(
            ready_batches(acc.flush(reset=True, lane_id=target), f"flush(reset=True, lane_id={target!r})")
        )
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
