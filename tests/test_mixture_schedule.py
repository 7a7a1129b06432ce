"""Scheduled mixtures through the whole pipeline: the delivered rows follow the schedule, and a
checkpoint anywhere (before, inside and after a transition) resumes exactly on every runner,
with prefetch and ``mtp_mode``, through tokenize/shuffle/pack, and elastically across a phase
boundary (2 -> 1 -> 4 data-parallel groups)."""

from __future__ import annotations

import io
import itertools
import json
from collections import Counter

import pytest

from tests._mixtures import NAMES, PLANS, source, token_source
from zephon_columnar import Pipeline
from zephon_columnar.errors import StarvedComponentWarning
from zephon_columnar.testing import assert_resumes_exactly, collect, signature


def test_delivered_rows_follow_the_schedule_phase_by_phase() -> None:
    # One lane: a record's chunk_id is the global chunk. Tolerance: per phase, each component's
    # rows are within 2 of the schedule's exact share of the phase's rows (the planner's bound).
    pipe = Pipeline(source(max_repeats=None, stop_after_passes=None)).options(runner="inline")
    records = list(itertools.islice(pipe, 140))
    by_chunk: dict[int, Counter[str]] = {}
    for r in records:
        by_chunk.setdefault(r.meta.chunk_id, Counter())[NAMES[r.meta.sample_id[0]]] += 1
    assert sorted(by_chunk) == list(range(14))
    warmup = sum((by_chunk[g] for g in range(4)), Counter())
    assert warmup == {"web": 40}
    # the ramp's chunks 4, 5 then the main mix 6..8: code's weight is 0.3 t, t = min(g - 3, 3) / 3
    main = sum((by_chunk[g] for g in range(4, 9)), Counter())
    for name, weight in (("code", 0.3), ("math", 0.2), ("web", None)):
        share = [weight * min(g - 3, 3) / 3 if weight else 1 - 0.5 * min(g - 3, 3) / 3 for g in range(4, 9)]
        assert abs(main[name] - 10 * sum(share)) <= 2, (name, main)
    assert all(by_chunk[g] == {"math": 10} for g in range(9, 14))


@pytest.mark.parametrize("plan", list(PLANS))
@pytest.mark.parametrize(
    "options",
    [
        {"runner": "inline"},
        {"runner": "threads", "prefetch_batches": 3},
        {"runner": "process", "max_workers": 2},
    ],
    ids=["inline", "threads-prefetch", "process"],
)
def test_resume_is_exact_before_inside_and_after_transitions(plan, options) -> None:
    def make() -> Pipeline:
        return PLANS[plan](Pipeline(source())).options(canonical_replicas=2, **options)

    full = assert_resumes_exactly(make, ks=[0, 4, 11, 19, 33], again=(1,))
    assert len(full) > 40


@pytest.mark.parametrize("plan", ["ensured", "tokens-packed"])
def test_resume_is_exact_under_token_unit_weights(plan) -> None:
    def make() -> Pipeline:
        return PLANS[plan](Pipeline(token_source())).options(canonical_replicas=2, runner="threads")

    full = assert_resumes_exactly(make, ks=[3, 17], again=(1,))
    assert len(full) > 20


def test_resume_is_exact_with_the_engine_in_a_side_process() -> None:
    def make() -> Pipeline:
        return PLANS["tokens-packed"](Pipeline(source())).options(mtp_mode=True, prefetch_batches=4)

    assert_resumes_exactly(make, ks=[7, 20], again=())


def build(groups: int, group: int) -> Pipeline:
    pipe = PLANS["shuffle"](Pipeline(source(chunk_size=6)))
    return pipe.options(runner="threads", canonical_replicas=4, world_size=groups, global_rank=group)


def test_elastic_two_one_four_groups_across_the_phase_boundaries() -> None:
    everything = Counter(collect(build(1, 0)))
    seen: Counter[tuple] = Counter()
    ckpt = None
    # 2 groups take 5 items each (inside the ramp), 1 group 9 more (past the anneal point), then 4
    for groups, per_group in ((2, 5), (1, 9), (4, None)):
        parts = []
        for g in range(groups):
            pipe = build(groups, g)
            if ckpt is not None:
                pipe.restore(ckpt)
            it = iter(pipe)
            items = [signature(x) for x in (it if per_group is None else (next(it) for _ in range(per_group)))]
            seen.update(items)
            if per_group is not None:
                parts.append(json.loads(json.dumps(pipe.checkpoint())))
            it.close()
        if parts:
            ckpt = Pipeline.merge_checkpoints(parts) if len(parts) > 1 else parts[0]
    assert seen == everything  # every item once, none repeated, whatever the groups


def endless(**kw) -> Pipeline:
    """web and code repeat; math (120 rows) is read once, then leaves ('redistribute'): from the
    main phase on, its share goes to the others but its target stays the schedule's."""
    from tests._mixtures import DATASETS, SCHEDULE
    from zephon_columnar import ScheduledMixtureWorkSource

    ws = ScheduledMixtureWorkSource(
        DATASETS,
        SCHEDULE[:3],
        chunk_size=10,
        seed=5,
        exhausted_policy={"web": "repeat", "code": "repeat", "math": "redistribute"},
        stop_after_passes=None,
        **kw,
    )
    return Pipeline(ws).shuffle(4, seed=0).batch(2).options(flush_every_k_chunks=2)


def test_what_users_see_the_realized_mixture_next_to_the_target() -> None:
    pipe = endless()
    with pytest.warns(Warning) as seen:
        out = io.StringIO()
        it = iter(pipe.show_progress(every_s=3600, file=out, use_tqdm=False))
        items = list(itertools.islice(it, 1500))
        it.close()  # the readout's last line
    starved = [w for w in seen if issubclass(w.category, StarvedComponentWarning)]
    # math ran out (120 rows, 'redistribute') while its target went on: warned once, naming it
    assert len(starved) == 1 and "'math' delivered" in str(starved[0].message), [str(w.message) for w in seen]
    assert "starved so far" in str(starved[0].message) and "target of" in str(starved[0].message)
    counters: Counter[str] = Counter()
    for record in pipe.metrics_snapshot().records:
        counters[record["name"]] += record["value"]
    read = {n: counters[f"component_rows_read.{n}"] for n in NAMES}
    target = {n: counters[f"component_rows_target.{n}"] for n in NAMES}
    assert sum(target.values()) == pytest.approx(sum(read.values()), abs=3)  # every chunk read aims for its rows
    assert read["math"] == 120 and target["math"] > 200  # it left; its target did not
    text = pipe.explain()
    assert f"math {read['math']:,}" in text and f", target {target['math'] / sum(target.values()):.0%}" in text
    assert f"Mixture now: about global chunk {counters['mixture_chunks_read']:,}" in text
    assert "from chunk 6 (linear ramp): code 0.300, math 0.200, web 0.500" in text
    last = out.getvalue().splitlines()[-1]
    share = {n: target[n] / sum(target.values()) for n in NAMES}
    assert f"(target {share['math']:.0%})" in last, last
    assert len(items) == 1500


def test_a_schedule_whose_future_changed_on_purpose_continues_the_past_exactly() -> None:
    from tests._mixtures import DATASETS, SCHEDULE
    from zephon_columnar import ScheduledMixtureWorkSource, SchedulePoint
    from zephon_columnar.errors import CheckpointError, ConfigurationWarning

    later_anneal = [*SCHEDULE[:3], SchedulePoint(at=14, weights={"math": 0.5, "code": 0.5})]  # was {math} at 9

    def build(schedule, **kw) -> Pipeline:
        ws = ScheduledMixtureWorkSource(DATASETS, schedule, chunk_size=10, seed=5, exhausted_policy="repeat",
                                        max_repeats=1, **kw)
        return PLANS["shuffle"](Pipeline(ws)).options(canonical_replicas=2, flush_every_k_chunks=2)

    new_full = collect(build(later_anneal))
    it, pipe = None, build(SCHEDULE)
    it = iter(pipe)
    head = [signature(next(it)) for _ in range(12)]  # each lane in its first flush epoch: chunks 0-3
    ckpt = json.loads(json.dumps(pipe.checkpoint()))
    it.close()
    assert head == new_full[:12]  # the schedules agree on what was read so far
    with pytest.raises(CheckpointError, match=r"differ from chunk 9 .*schedule_edits='future'"):
        build(later_anneal).restore(ckpt)  # by default, another schedule is refused, naming the chunk
    resumed = build(later_anneal, schedule_edits="future")
    with pytest.warns(ConfigurationWarning, match="continuing under this source's schedule"):
        resumed.restore(ckpt)
    assert head + collect(resumed) == new_full  # the past replays, the new future applies
    edited_past = [SchedulePoint(at=0, weights={"web": 0.5, "code": 0.5}), *SCHEDULE[1:]]
    with pytest.raises(CheckpointError, match=r"differ from chunk 0 .*replays the chunks before 4 as they were read"):
        build(edited_past, schedule_edits="future").restore(ckpt)


def test_ensure_mixture_holds_each_phase_to_the_schedules_target() -> None:
    # records over one lane: each record's chunk_id is its global chunk; ensure_mixture reads each
    # chunk's target (the schedule's weights there) and its output follows them phase by phase
    pipe = Pipeline(source(max_repeats=None, stop_after_passes=None)).ensure_mixture(weight_by="samples")
    records = list(itertools.islice(pipe.options(runner="inline"), 150))
    warmup = Counter(NAMES[r.meta.sample_id[0]] for r in records if r.meta.chunk_id < 4)
    main = Counter(NAMES[r.meta.sample_id[0]] for r in records if 6 <= r.meta.chunk_id < 9)
    assert set(warmup) == {"web"}
    total = sum(main.values())
    assert total >= 20
    for name, weight in (("web", 0.5), ("code", 0.3), ("math", 0.2)):
        assert abs(main[name] / total - weight) <= 0.1, main
