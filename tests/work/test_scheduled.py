"""`ScheduledMixtureWorkSource`: chunks follow the schedule and the trainer's changes, lanes
split one global stream, states restore exactly (changes included), and bad schedules, changes
and states are refused naming what is wrong."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.work._helpers import drain, json_round_trip, make_ds, take
from tests.work.test_schedule import schedules as any_schedule
from zephon_columnar.errors import CheckpointError, ConfigError, DataDroppedWarning
from zephon_columnar.work import TokenEstimation
from zephon_columnar.work.schedule import MixtureChange, MixtureSchedule, ScheduledWeights, SchedulePoint
from zephon_columnar.work.scheduled_mixture import ScheduledMixtureWorkSource

NAMES = ["a", "b", "c"]

WARMUP_MAIN_ANNEAL = [
    SchedulePoint(at=0, weights={"a": 0.9, "b": 0.1}),
    SchedulePoint(at=4, weights={"a": 0.5, "b": 0.3, "c": 0.2}, ramp="linear"),
    SchedulePoint(at=10, weights={"c": 1.0}),
]


def source(schedule=WARMUP_MAIN_ANNEAL, rows=(500, 300, 200), **kw) -> ScheduledMixtureWorkSource:
    datasets = [make_ds(n, [r // 2, r - r // 2]) for n, r in zip(NAMES, rows)]
    kw = {"chunk_size": 10, "seed": 3, "exhausted_policy": "repeat", "stop_after_passes": None, **kw}
    return ScheduledMixtureWorkSource(datasets, schedule, **kw)


def counts(chunk) -> dict[str, int]:
    return {n: len(p) for n, p in chunk.components.items()}


@st.composite
def schedules(draw) -> MixtureSchedule:
    """`tests.work.test_schedule`'s schedules; a dataset no point weights enters at a last point."""
    schedule = draw(any_schedule())
    points = list(schedule.points)
    if set(schedule.components) != set(NAMES):
        points.append(SchedulePoint(at=points[-1].at + 1, weights=dict.fromkeys(NAMES, 1.0)))
    return MixtureSchedule(points)


@settings(max_examples=40, deadline=None)
@given(schedule=schedules(), chunk_size=st.integers(1, 23))
def test_the_realized_mixture_follows_the_schedule_within_two_rows(schedule, chunk_size) -> None:
    # Tolerance: after every chunk, each component's rows so far are within 2 of the sum of its
    # exact share of each chunk (the accumulators carry the rest from chunk to chunk).
    ws = source(schedule, chunk_size=chunk_size)
    expected = dict.fromkeys(NAMES, Fraction(0))
    got = dict.fromkeys(NAMES, 0)
    for g, chunk in enumerate(take(ws, 60)):
        assert chunk.global_index == g and len(chunk) == chunk_size
        weights = schedule.weights_at(g)
        for n in NAMES:
            expected[n] += weights[n] * chunk_size
            got[n] += counts(chunk).get(n, 0)
            assert abs(got[n] - expected[n]) <= 2, (g, n, got, expected)
            if weights[n] == 0:
                assert n not in chunk.components  # a component out of the mixture is never drawn


def test_a_ramp_moves_the_shares_chunk_by_chunk_and_phases_hold() -> None:
    chunks = take(source(chunk_size=100), 12)
    a_share = [counts(c).get("a", 0) for c in chunks]
    assert a_share[:5] == [90, 80, 70, 60, 50]  # the ramp from point 0 reaches point 1 at chunk 4
    assert a_share[4:10] == [50] * 6  # the main phase holds until the anneal point (10)
    assert [counts(c) for c in chunks[10:]] == [{"c": 100}] * 2  # anneal: c only


def test_lanes_split_the_global_stream() -> None:
    base = [(c.global_index, counts(c), c.ordered()[0].tolist()) for c in take(source(), 30)]
    lanes = []
    for lane in range(3):
        ws = source().clone_for_lane(lane, 3)
        lanes += [(c.global_index, counts(c), c.ordered()[0].tolist()) for c in take(ws, 10)]
    assert sorted(lanes, key=lambda c: c[0]) == base


@pytest.mark.parametrize("stop", [0, 3, 4, 7, 10, 11])
def test_a_state_restores_exactly_before_inside_and_after_transitions(stop) -> None:
    ws = source().with_mixture_change(at=6, weights={"b": 1.0})
    take(ws, stop)
    state = json_round_trip(ws.state_dict())
    rest = [c.ordered()[0].tolist() for c in take(ws, 15)]
    fresh = source()  # built without the change: the state brings it
    fresh.load_state_dict(state)
    assert fresh.changes == ws.changes
    assert [c.ordered()[0].tolist() for c in take(fresh, 15)] == rest


def test_a_change_holds_from_its_chunk_until_the_schedules_next_point() -> None:
    plain = [counts(c) for c in take(source(chunk_size=10), 12)]
    changed = source(chunk_size=10).with_mixture_change(at=2, weights={"b": 1, "c": 1})
    got = [counts(c) for c in take(changed, 12)]
    assert got[:2] == plain[:2]
    assert got[2:4] == [{"b": 5, "c": 5}] * 2  # the ramp gives way to the change...
    assert got[4:] == plain[4:] and plain[10:] == [{"c": 10}] * 2  # ...until the schedule's next point (4)


def test_changes_are_refused_out_of_order_before_the_position_or_naming_unknown_components() -> None:
    ws = source()
    take(ws, 3)
    with pytest.raises(ValueError, match=r"already planned chunk 2; pass at >= 3"):
        ws.with_mixture_change(at=2, weights={"a": 1})
    with pytest.raises(KeyError, match=r"unknown component\(s\) \['web'\]"):
        ws.with_mixture_change(at=5, weights={"web": 1})
    with pytest.raises(ValueError, match=r"weight of 'a' is -1"):
        ws.with_mixture_change(at=5, weights={"a": -1})
    with pytest.raises(ValueError, match="in order of at"):
        ws.with_mixture_change(at=6, weights={"a": 1}).with_mixture_change(at=5, weights={"b": 1})
    twice = ws.with_mixture_change(at=5, weights={"a": 1}).with_mixture_change(at=5, weights={"b": 1})
    assert [c.weights for c in twice.changes] == [{"a": 1}, {"b": 1}]  # both recorded...
    assert [counts(c) for c in take(twice, 3)][-1] == {"b": 10}  # ...the later governs chunk 5


def test_a_state_under_another_schedule_or_contradicting_changes_is_refused() -> None:
    ws = source().with_mixture_change(at=3, weights={"a": 1})
    take(ws, 4)
    state = ws.state_dict()
    other = [SchedulePoint(at=0, weights={"a": 0.9, "b": 0.1}), SchedulePoint(at=5, weights=dict.fromkeys(NAMES, 1))]
    differ = r"schedules differ from chunk 1 \(checkpoint: a 0.8, b 0.15, c 0.05; here: a 0.9, b 0.1\)"
    with pytest.raises(CheckpointError, match=differ):
        source(other).load_state_dict(state)
    with pytest.raises(CheckpointError, match="contradict this source's"):
        source().with_mixture_change(at=3, weights={"b": 1}).load_state_dict(state)


def test_the_schedule_must_weight_exactly_the_datasets() -> None:
    with pytest.raises(ConfigError, match=r"never weighted: \['c'\]"):
        source([SchedulePoint(at=0, weights={"a": 1, "b": 1})])
    with pytest.raises(ConfigError, match=r"unknown: \['web'\]"):
        source([SchedulePoint(at=0, weights=dict.fromkeys([*NAMES, "web"], 1))])
    with pytest.raises(ConfigError, match="for fixed weights use StaticMixtureWorkSource"):
        source({"a": 1})


def test_a_pass_floor_waits_for_a_dataset_that_enters_later() -> None:
    # a for 5 chunks (20 of its 30 rows: the schedule then leaves it out, so it no longer holds up
    # the end), c from chunk 5: the stream ends once c's one pass is read, each row once
    schedule = [SchedulePoint(at=0, weights={"a": 1, "b": 0}), SchedulePoint(at=5, weights={"c": 1})]
    ws = source(schedule, rows=(30, 40, 20), chunk_size=4, exhausted_policy=None, stop_after_passes=1)
    left = (
        r"stopped weighting \['a', 'b'\] before they completed .*unread in the pass they were in: \{'a': 10, 'b': 40\}"
    )
    with pytest.warns(DataDroppedWarning, match=left):
        chunks = drain(ws)
    seen = {n: [tuple(r) for c in chunks for r in c.component_arrays.get(n, [])] for n in NAMES}
    assert len(seen["c"]) == 20 and len(set(seen["c"])) == 20
    assert len(seen["a"]) == len(set(seen["a"])) == 20 and len(chunks) == 10
    assert "b" not in {n for c in chunks for n in c.components}


def test_a_redistributing_dataset_that_runs_out_mid_phase_leaves_its_share_to_the_others() -> None:
    schedule = [SchedulePoint(at=0, weights={"a": 1, "b": 1, "c": 2})]
    ws = source(schedule, rows=(500, 500, 30), exhausted_policy={"a": "repeat", "b": "repeat", "c": "redistribute"})
    chunks = take(ws, 12)
    assert sum(counts(c).get("c", 0) for c in chunks) == 30  # one pass, then it leaves
    assert all(len(c) == 10 for c in chunks)  # the others fill its share
    assert counts(chunks[-1]) == {"a": 5, "b": 5}
    # the target stays the schedule's: c, gone, falls behind it (the realized mixture says so)
    assert chunks[-1].target_mixture == {"a": 0.25, "b": 0.25, "c": 0.5}


def test_token_unit_weights_are_the_chunks_targets() -> None:
    # a's rows are as long as b's (same stored bytes per row): token weights are sample weights
    ws = source(
        [SchedulePoint(at=0, weights={"a": 1, "c": 1}), SchedulePoint(at=2, weights={"b": 3, "c": 1})],
        token_estimation=TokenEstimation(primer=0.25),
    )
    ws.prime()
    chunks = take(ws, 4)
    assert [c.target_mixture for c in chunks] == [{"a": 0.5, "c": 0.5}] * 2 + [{"b": 0.75, "c": 0.25}] * 2
    assert ws.state_dict()["token_ratios"] is not None


def test_scheduled_weights_segments() -> None:
    schedule = MixtureSchedule(WARMUP_MAIN_ANNEAL)
    weights = ScheduledWeights(schedule, [MixtureChange(at=6, weights={"b": 1})])
    assert weights.segment(3)[0] == ("ramp", 3) and weights.segment(5)[0] == ("phase", 1)
    assert weights.segment(7) == (("change", 0), {"a": 0, "b": 1, "c": 0})
    assert weights.ahead(7) == {"b", "c"} and weights.ahead(0) == set(NAMES)


def test_explain_shows_the_schedule_and_the_phase_now() -> None:
    ws = source().with_mixture_change(at=12, weights={"a": 1})
    take(ws, 5)
    text = "\n".join(ws.describe_data())
    assert "from chunk 4 (linear ramp): a 0.500, b 0.300, c 0.200 <- now" in text
    assert "changed at chunk 12: a 1.000" in text and text.startswith("ScheduledMixtureWorkSource:")


def test_a_new_epoch_starts_the_schedule_over_without_the_changes() -> None:
    ws = source().with_mixture_change(at=2, weights={"b": 1})
    again = ws.for_epoch(1)
    assert again.changes == () and again.recipe()["epoch"] == 1
    assert [counts(c) for c in take(again, 3)] == [counts(c) for c in take(source().for_epoch(1), 3)]


def test_a_phase_whose_datasets_all_ran_out_ends_the_stream_and_says_what_was_not_reached() -> None:
    schedule = [SchedulePoint(at=0, weights={"c": 1}), SchedulePoint(at=50, weights={"a": 1, "b": 1})]
    ws = source(schedule, rows=(100, 100, 30), exhausted_policy={"a": "repeat", "b": "repeat", "c": "redistribute"})
    with pytest.warns(DataDroppedWarning, match=r"ended at chunk 3: .*\(\['c'\]\) has run out .*weight \['a', 'b'\]"):
        chunks = drain(ws)
    assert sum(len(c) for c in chunks) == 30
