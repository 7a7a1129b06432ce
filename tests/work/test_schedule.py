"""`MixtureSchedule`: exact weights per global chunk, phases and linear ramps, components that
enter and leave, and bad points refused with the point named."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_columnar.work.schedule import MixtureSchedule, SchedulePoint

NAMES = ["a", "b", "c"]


@st.composite
def schedules(draw) -> MixtureSchedule:
    gaps = draw(st.lists(st.integers(1, 50), min_size=0, max_size=4))
    at = [0]
    for gap in gaps:
        at.append(at[-1] + gap)
    points = []
    for i, chunk in enumerate(at):
        names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=3, unique=True))
        weights = {n: draw(st.floats(0.01, 10)) for n in names}
        ramp = "step" if i == 0 else draw(st.sampled_from(["step", "linear"]))
        points.append(SchedulePoint(at=chunk, weights=weights, ramp=ramp))
    return MixtureSchedule(points)


@settings(max_examples=60, deadline=None)
@given(schedule=schedules(), offset=st.integers(0, 300))
def test_weights_sum_to_one_and_follow_the_points(schedule: MixtureSchedule, offset: int) -> None:
    points = schedule.points
    chunk = offset
    weights = schedule.weights_at(chunk)
    assert sum(weights.values()) == 1 and all(w >= 0 for w in weights.values())
    i = schedule.phase_at(chunk)
    assert points[i].at <= chunk and (i + 1 == len(points) or chunk < points[i + 1].at)
    for j, point in enumerate(points):  # at a point, exactly its normalized weights
        total = sum(Fraction(w) for w in point.weights.values())
        at_point = schedule.weights_at(point.at)
        assert at_point == {n: Fraction(point.weights.get(n, 0)) / total for n in schedule.components}, j
    if i + 1 < len(points) and points[i + 1].ramp == "linear":
        # on a ramp each weight lies between its two ends
        start, end = schedule.weights_at(points[i].at), schedule.weights_at(points[i + 1].at)
        assert all(min(start[n], end[n]) <= weights[n] <= max(start[n], end[n]) for n in weights)
    else:
        assert weights == schedule.weights_at(points[i].at)  # a phase holds its point's weights


def test_a_ramp_is_a_straight_line_and_components_enter_and_leave() -> None:
    s = MixtureSchedule([
        SchedulePoint(at=0, weights={"web": 1.0}),
        SchedulePoint(at=10, weights={"web": 0.5, "code": 0.5}, ramp="linear"),
        SchedulePoint(at=20, weights={"math": 1.0}),
    ])
    assert s.components == ["code", "math", "web"]
    assert s.weights_at(0) == {"code": 0, "math": 0, "web": 1}
    assert s.weights_at(4) == {"code": Fraction(1, 5), "math": 0, "web": Fraction(4, 5)}
    steps = [s.weights_at(g)["code"] for g in range(11)]
    assert len({b - a for a, b in zip(steps, steps[1:])}) == 1  # equal steps: a straight line
    assert s.weights_at(19) == {"code": Fraction(1, 2), "math": 0, "web": Fraction(1, 2)}  # a phase holds
    assert s.weights_at(20) == {"code": 0, "math": 1, "web": 0}  # code and web leave, math enters
    assert s.weights_at(10**9) == s.weights_at(20)


def test_float_weights_are_taken_exactly() -> None:
    s = MixtureSchedule([SchedulePoint(at=0, weights={"a": 0.1, "b": 0.2})])
    assert s.weights_at(0)["a"] == Fraction(0.1) / (Fraction(0.1) + Fraction(0.2))


@pytest.mark.parametrize(
    ("points", "message"),
    [
        ([], "at least one SchedulePoint"),
        ([SchedulePoint(at=5, weights={"a": 1.0})], r"point 0 \(at=5\): .*the first point must be at chunk 0"),
        ([SchedulePoint(at=0, weights={"a": 1.0}), SchedulePoint(at=0, weights={"a": 1.0})], "point 1.*increasing"),
        ([SchedulePoint(at=0, weights={"a": -1.0})], "weight of 'a' is -1.0"),
        ([SchedulePoint(at=0, weights={"a": float("nan")})], "weight of 'a' is nan"),
        ([SchedulePoint(at=0, weights={"a": 0.0})], "sum to 0"),
        ([SchedulePoint(at=0, weights={"a": 1.0}, ramp="linear")], "nothing to ramp from"),
        ([SchedulePoint(at=0, weights={"a": 1.0}), SchedulePoint(at=3, weights={"a": 1.0}, ramp="smooth")],
         "ramp='smooth'"),
        ([SchedulePoint(at=-1, weights={"a": 1.0})], "int >= 0"),
    ],
)
def test_bad_points_are_refused_naming_the_point(points, message) -> None:
    with pytest.raises(ValueError, match=message):
        MixtureSchedule(points)


@pytest.mark.parametrize(
    "point",
    [SchedulePoint(at=0.5, weights={"a": 1.0}), SchedulePoint(at=0, weights={1: 1.0}),
     SchedulePoint(at=0, weights={"a": "1"}), SchedulePoint(at=True, weights={"a": 1.0})],
)
def test_a_point_of_the_wrong_type_is_a_type_error(point) -> None:
    with pytest.raises(TypeError, match=r"MixtureSchedule point 0"):
        MixtureSchedule([point])


def test_the_fingerprint_is_json_normal_and_tells_schedules_apart() -> None:
    import json

    one = MixtureSchedule([SchedulePoint(at=0, weights={"b": 1.0, "a": 2.0})])
    two = MixtureSchedule([SchedulePoint(at=0, weights={"a": 2.0, "b": 1.0}), SchedulePoint(at=5, weights={"a": 1.0})])
    assert json.loads(json.dumps(one.fingerprint())) == [{"at": 0, "ramp": "step", "weights": {"a": 2.0, "b": 1.0}}]
    assert one.fingerprint() != two.fingerprint()
