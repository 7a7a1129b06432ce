"""The accumulator checks of the validation harness: one accumulator per defect, reported with
its code; the accumulators this library ships, and a correct custom one, pass."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import pytest

from zephon_columnar import Dataset, InMemoryShard, Pipeline, StaticMixtureWorkSource
from zephon_columnar.ops import Accumulator, BaseOp, CountingAccumulator, OpTraits, PassthroughAccumulator
from zephon_columnar.ops import tombstones_for_record
from zephon_columnar.ops.user import FunctionOp
from zephon_columnar.validation import ValidationError, ValidationReport, validate_ops


def mark(records):
    for r in records:
        r.payload = {**r.payload, "seen": len(records)}
    return records


def report_for(factory) -> ValidationReport:
    return validate_ops([FunctionOp("acc", process_many=mark, preserves_cursor_order=False, accumulator=factory)])


def errors(report: ValidationReport) -> list[str]:
    return [i.code for i in report.errors]


class PerLane(Accumulator):
    """A correct custom accumulator: per-lane buffers emitted by 3, multiples of 3 dropped with
    tombstones, a per-lane flush; the defective ones below each change one thing."""

    def __init__(self) -> None:
        self.buffers: dict[int, list] = defaultdict(list)

    def _take(self, lane):
        return self.buffers.pop(lane, [])

    def push_many(self, elems):
        ready = []
        for r in elems:
            lane = r.meta.lane_id
            if r.payload["value"] % 3 == 0:
                ready.append((tombstones_for_record(r), lane))
                continue
            self.buffers[lane].append(r)
            if len(self.buffers[lane]) == 3:
                ready.append((self._take(lane), lane))
        return ready

    def flush(self, *, reset=False, lane_id=None):
        lanes = list(self.buffers) if lane_id is None else [lane_id]
        return [(batch, lane) for lane in lanes if (batch := self._take(lane))]

    def has_pending_data(self, lane_id=None):
        if lane_id is None:
            return any(self.buffers.values())
        return bool(self.buffers.get(lane_id))


@pytest.mark.parametrize("factory", [PassthroughAccumulator, lambda: CountingAccumulator(max_batch=64),
                                     lambda: CountingAccumulator(max_batch=2), PerLane],
                         ids=["passthrough", "counting 64", "counting 2", "custom per lane"])
def test_correct_accumulators_pass(factory):
    assert report_for(factory).issues == []


def test_an_accumulator_factory_that_fails_is_reported():
    def raising():
        raise RuntimeError("no GPU here")

    report = report_for(raising)
    assert errors(report) == ["ACC_FACTORY_RAISED"] and "no GPU here" in report.errors[0].message
    report = report_for(lambda: [])  # not an Accumulator at all
    assert errors(report) == ["ACC_FACTORY_RAISED"] and "Accumulator" in report.errors[0].message


class PushRaises(PerLane):
    def push_many(self, elems):
        raise KeyError("quality")


class ReturnsRecordsNotBatches(PerLane):
    def push_many(self, elems):
        return list(elems)


def test_push_or_flush_failing_is_reported_and_stops_the_accumulator_checks():
    report = report_for(PushRaises)
    assert errors(report) == ["ACC_PUSH_OR_FLUSH_RAISED"] and "KeyError" in report.errors[0].message
    report = report_for(ReturnsRecordsNotBatches)
    assert errors(report) == ["ACC_PUSH_OR_FLUSH_RAISED"] and "(records, lane_id)" in report.errors[0].message


class ResetRaises(PerLane):
    def flush(self, *, reset=False, lane_id=None):
        if reset:
            raise RuntimeError("reset not supported")
        return super().flush(lane_id=lane_id)


def test_a_reset_flush_that_raises_is_reported():
    report = report_for(ResetRaises)
    assert "ACC_RESET_RAISED" in errors(report)
    assert "reset not supported" in next(i.message for i in report.errors if i.code == "ACC_RESET_RAISED")


class DropsSilently(PerLane):
    """Leaves multiples of 3 out without a tombstone."""

    def push_many(self, elems):
        return super().push_many([r for r in elems if r.payload["value"] % 3])


def test_samples_lost_over_push_and_flush_are_reported():
    report = report_for(lambda: CountingAccumulator(max_batch=64, drop_last=True))
    assert errors(report) == ["ACC_FLUSH_LOSES_SAMPLES"]
    assert "took 12 samples and gave back 0" in report.errors[0].message
    report = report_for(DropsSilently)
    assert "ACC_FLUSH_LOSES_SAMPLES" in errors(report)
    assert "gave back 6" in report.errors[0].message  # PerLane's tombstones count as their samples


class CountsAcrossResets(PerLane):
    """Cuts a lane's batch at every 3rd record it ever saw: the count survives a reset."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[int, int] = defaultdict(int)

    def push_many(self, elems):
        ready = []
        for r in elems:
            lane = r.meta.lane_id
            self.buffers[lane].append(r)
            self.seen[lane] += 1
            if self.seen[lane] % 3 == 0:
                ready.append((self._take(lane), lane))
        return ready


def test_state_kept_across_a_reset_flush_is_not_fresh():
    report = report_for(CountsAcrossResets)
    assert errors(report) == ["ACC_RESET_NOT_FRESH"]
    assert "new accumulator" in report.errors[0].message


class AlwaysSaysEmpty(PerLane):
    def has_pending_data(self, lane_id=None):
        return False


class NeverPendingPerLane(PerLane):
    """Right about the whole accumulator, wrong about each lane."""

    def has_pending_data(self, lane_id=None):
        return any(self.buffers.values()) if lane_id is None else False


class SaysPendingForOtherLanes(PerLane):
    """Answers about every lane whichever lane is asked about."""

    def has_pending_data(self, lane_id=None):
        return any(self.buffers.values())


def lies_message(report: ValidationReport) -> str:
    return next(i.message for i in report.errors if i.code == "ACC_HAS_PENDING_LIES")


def test_has_pending_data_that_lies_is_reported():
    report = report_for(AlwaysSaysEmpty)
    assert errors(report) == ["ACC_HAS_PENDING_LIES"]
    assert "it holds 6 samples but has_pending_data() is False" in lies_message(report)
    report = report_for(NeverPendingPerLane)
    assert errors(report) == ["ACC_HAS_PENDING_LIES"] and "for lanes [0, 1, 2]" in lies_message(report)
    # After lane 0 was flushed, has_pending_data(0) still reports lanes 1 and 2: a lie, not a failed flush.
    report = report_for(SaysPendingForOtherLanes)
    assert errors(report) == ["ACC_HAS_PENDING_LIES"] and "lane asked about" in lies_message(report)


class MovesToLaneZero(PassthroughAccumulator):
    def push_many(self, elems):
        moved = [replace(r, meta=replace(r.meta, lane_id=0)) for r in elems]
        return [(moved, 0)] if moved else []


class OneBufferForAllLanes(PerLane):
    """Buffers by arrival, not by lane."""

    def push_many(self, elems):
        ready = []
        for r in elems:
            self.buffers[0].append(r)
            if len(self.buffers[0]) == 5:
                ready.append((self._take(0), r.meta.lane_id))
        return ready


def test_a_changed_lane_is_reported():
    report = report_for(MovesToLaneZero)
    assert errors(report) == ["ACC_MUTATES_LANE_ID"]


def test_a_batch_mixing_lanes_is_not_lane_pure():
    report = report_for(OneBufferForAllLanes)
    assert "ACC_BATCH_NOT_LANE_PURE" in errors(report)
    assert "mixes lanes" in next(i.message for i in report.errors if i.code == "ACC_BATCH_NOT_LANE_PURE")


class WaitTimes(CountingAccumulator):
    """Zephon's ready-batch shape: (one lane's records, nanoseconds waited), never a lane label."""

    def push_many(self, elems):
        return [(batch, 1234) for batch, _ in super().push_many(elems)]


def test_the_second_element_of_a_ready_batch_is_a_wait_time_not_a_lane():
    assert "ACC_BATCH_NOT_LANE_PURE" not in errors(report_for(lambda: WaitTimes(2)))


class NoLaneArgument(PerLane):
    def flush(self, *, reset=False):
        return super().flush()

    def has_pending_data(self):
        return super().has_pending_data()


class IgnoresTheLaneFlush(PerLane):
    """flush(lane_id=L) emits nothing: lane L stays pending."""

    def flush(self, *, reset=False, lane_id=None):
        return [] if lane_id is not None else super().flush()


class FlushesEveryLane(PerLane):
    def flush(self, *, reset=False, lane_id=None):
        return super().flush()


def test_per_lane_flush_defects_are_reported():
    assert errors(report_for(NoLaneArgument)) == ["ACC_NO_PER_LANE_FLUSH"]
    report = report_for(IgnoresTheLaneFlush)
    assert errors(report) == ["ACC_PER_LANE_FLUSH_NOT_DRAINED"] and "pending data" in report.errors[0].message
    report = report_for(FlushesEveryLane)
    assert errors(report) == ["ACC_FLUSH_LEAKS_OTHER_LANES"]
    assert "emitted records of lanes [1, 2]" in report.errors[0].message


class InstanceWithBadAccumulator(BaseOp):
    """The instance form: its accumulator is checked too (on a set-up copy)."""

    def traits(self):
        return OpTraits(preserves_cursor_order=True)

    def accumulator(self, *, deterministic, ctx):
        return FlushesEveryLane()

    def process_many(self, elems):
        return elems


def test_instance_form_accumulators_are_checked_and_strict_iteration_is_refused():
    ds = Dataset.from_dict("d", {0: InMemoryShard([{"text": f"t{i}", "value": i} for i in range(8)])})
    p = Pipeline(StaticMixtureWorkSource([ds], {"d": 1.0}, chunk_size=4)).add_op(InstanceWithBadAccumulator())
    assert errors(p.validate()) == ["ACC_FLUSH_LEAKS_OTHER_LANES"]
    with pytest.raises(ValidationError, match="ACC_FLUSH_LEAKS_OTHER_LANES in InstanceWithBadAccumulator"):
        iter(p)


def test_the_factory_gets_deterministic_mode_and_a_context():
    seen = []

    def factory(*, deterministic, ctx):
        seen.append((deterministic, dict(ctx)))
        return PerLane()

    assert report_for(factory).issues == []
    assert seen and all(d is True and c.get("deterministic") is True and "lane_id" not in c for d, c in seen)
