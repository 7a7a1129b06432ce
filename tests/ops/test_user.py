"""User-defined operators: add_op in both forms, Zephon accumulators run by the engine, the
columnar hook, map_batch, and the traits the engine reads."""

from __future__ import annotations

from collections import Counter, defaultdict

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.errors import PipelineError
from zephon_columnar.ops import (
    Accumulator,
    BaseOp,
    ColumnarOp,
    CountingAccumulator,
    OpContext,
    OpTraits,
    tombstones_for_record,
)
from zephon_columnar.records import SampleRecord, spawn_child
from zephon_columnar.testing import assert_resumes_exactly, collect
from zephon_columnar.types import SampleBatch

RUNNERS = ["inline", "threads", "process"]
DS = Dataset.from_tables("d", [pa.table({"text": [f"doc {s}-{i} " + "x" * (i % 7) for i in range(60)],
                                          "value": list(range(s * 60, s * 60 + 60))}) for s in range(3)])


def build(runner: str = "inline", lanes: int = 2, **opts) -> Pipeline:
    ws = StaticMixtureWorkSource([DS], {"d": 1.0}, chunk_size=16, seed=5)
    opts.setdefault("canonical_replicas", lanes)
    return Pipeline(ws).options(runner=runner, max_workers=2, **opts)


def values(items) -> list[int]:
    out = []
    for item in items:
        records = item.records if isinstance(item, SampleBatch) else [item]
        out += [r.payload["value"] for r in records]
    return out


# ---------------------------------------------------------------- the contract
def test_a_baseop_without_traits_or_process_many_cannot_be_made():
    class NoTraits(BaseOp):
        def process_many(self, elems):
            return elems

    class NoProcess(BaseOp):
        def traits(self):
            return OpTraits(preserves_cursor_order=True)

    for cls, missing in ((NoTraits, "traits"), (NoProcess, "process_many")):
        with pytest.raises(TypeError, match=missing):
            cls()


def test_optraits_needs_preserves_cursor_order_and_is_frozen():
    with pytest.raises(TypeError):
        OpTraits()  # type: ignore[call-arg]
    t = OpTraits(preserves_cursor_order=True, parallelism=4, requires_serial_state=True)
    assert t.workers() == 1  # serial state pins the op to one worker
    with pytest.raises(AttributeError):
        t.parallelism = 2  # type: ignore[misc]


class TagEach(BaseOp):
    """One row out per row in, declared or not (``emits``)."""

    def __init__(self, emits=None):
        super().__init__()
        self.emits = emits

    def traits(self):
        extra = {} if self.emits is None else {"emits": self.emits}
        return OpTraits(preserves_cursor_order=True, **extra)

    def process_many(self, records):
        for r in records:
            r.payload = {**r.payload, "tag": r.payload["value"] % 3}
        return records


@pytest.mark.parametrize("form", ["instance", "kwargs"])
def test_a_user_operator_that_declares_one_row_per_row_resumes_by_input_position(form):
    def make(emits):
        if form == "instance":
            return build().add_op(TagEach(emits)).batch(4)
        extra = {} if emits is None else {"emits": emits}
        return build().add_op("tag", process_many=TagEach().process_many, preserves_cursor_order=True, **extra).batch(4)

    # Zephon's operators do not say: the engine assumes any number of rows and replays a chunk.
    assert make(None).spec.build_engine().resume_by_input is False
    for emits in ("one", "at_most_one"):
        assert make(emits).spec.build_engine().resume_by_input is True
        assert collect(make(emits)) == collect(make(None))
        assert_resumes_exactly(lambda emits=emits: make(emits), ks=[0, 1, 5, 13])


def test_an_operator_that_makes_more_rows_than_it_declares_is_an_error():
    def twice(records):
        return [
            SampleRecord(payload=r.payload, meta=spawn_child(r.meta, i, is_last_child=i == 1))
            for r in records
            for i in range(2)
        ]

    pipe = build().add_op("twice", process_many=twice, preserves_cursor_order=True, emits="at_most_one")
    with pytest.raises(PipelineError, match=r"declares emits='at_most_one' \(OpTraits\) but made 128 rows of 64"):
        list(pipe)
    with pytest.raises(ValueError, match="emits='two'"):
        build().add_op("twice", process_many=twice, preserves_cursor_order=True, emits="two")


def test_kwargs_form_needs_preserves_cursor_order_and_rejects_what_it_does_not_know():
    with pytest.raises(ValueError, match="preserves_cursor_order"):
        build().add_op("score", process_many=lambda rs: rs)
    with pytest.raises(TypeError, match="unexpected keyword"):
        build().add_op("score", process_many=lambda rs: rs, preserves_cursor_order=True, max_batch=3)
    with pytest.raises(ValueError, match="exactly one of process_many"):
        build().add_op("score", preserves_cursor_order=True)


def test_instance_form_refuses_kwargs_form_arguments():
    with pytest.raises(ValueError, match="parallelism"):
        build().add_op(Tag(), parallelism=4)


# ---------------------------------------------------------------- the guide's operators
class Tag(BaseOp):
    """Set up once per worker copy: every record it writes says how often its copy was set up."""

    def __init__(self) -> None:
        super().__init__()
        self.setups = 0

    def setup(self, ctx: OpContext) -> None:
        super().setup(ctx)
        self.setups += 1

    def traits(self):
        return OpTraits(preserves_cursor_order=True, parallelism=2)

    def accumulator(self, *, deterministic, ctx):
        return CountingAccumulator(max_batch=5)

    def process_many(self, elems):
        for r in elems:
            r.payload = {**r.payload, "setups": self.setups, "group": len(elems)}
        return elems


@pytest.mark.parametrize("runner", RUNNERS)
def test_instance_form_is_copied_per_worker_and_set_up_once(runner):
    op = Tag()
    rows = [r.payload for r in build(runner).add_op(op)]
    assert op.setups == 0  # the driver's instance is configuration only
    assert len(rows) == 180 and {r["setups"] for r in rows} == {1}
    assert max(r["group"] for r in rows) == 5


@pytest.mark.parametrize("runner", RUNNERS)
def test_counting_accumulator_sizes_calls_without_changing_data(runner):
    plain = values(build(runner))
    pipe = build(runner).add_op("quality", process_many=_quality, preserves_cursor_order=True, parallelism=2,
                                accumulator=lambda: CountingAccumulator(max_batch=8))
    pipe = pipe.map_transform(lambda p: p if p["quality"] % 2 else None)
    assert "quality@p2[calls of 8]" in pipe.explain()
    got = [r.payload for r in pipe]
    assert all(r["calls"] <= 8 for r in got) and max(r["calls"] for r in got) == 8
    assert [r["value"] for r in got] == [v for v in plain if v % 2]


def _quality(records):
    for r in records:
        r.payload = {**r.payload, "quality": r.payload["value"], "calls": len(records)}
    return records


class HoldAndDrop(Accumulator):
    """Buffers each lane's records, drops multiples of 3 (with tombstones), emits groups of 4
    newest first: holds, reorders and drops."""

    def __init__(self) -> None:
        self.buffers = defaultdict(list)

    def push_many(self, elems):
        ready = []
        for r in elems:
            lane = r.meta.lane_id
            if r.payload["value"] % 3 == 0:
                ready.append((tombstones_for_record(r), lane))
                continue
            self.buffers[lane].append(r)
            if len(self.buffers[lane]) == 4:
                ready.append((self.buffers.pop(lane)[::-1], lane))
        return ready

    def flush(self, *, reset=False, lane_id=None):
        lanes = list(self.buffers) if lane_id is None else [lane_id]
        return [(self.buffers.pop(lane)[::-1], lane) for lane in lanes if self.buffers.get(lane)]

    def has_pending_data(self, lane_id=None):
        return bool(self.buffers.get(lane_id)) if lane_id is not None else any(self.buffers.values())


def _mark(records):
    for r in records:
        r.payload = {**r.payload, "seen": len(records)}
    return records


def with_hold_and_drop(runner="inline", parallelism=1, lanes=2, **opts):
    return build(runner, lanes=lanes, flush_every_k_chunks=2, **opts).add_op(
        "hold", process_many=_mark, preserves_cursor_order=False, parallelism=parallelism,
        accumulator=HoldAndDrop).batch(3, drop_last=False)


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("parallelism", [1, 4])
def test_a_custom_accumulator_holds_reorders_and_drops_deterministically(runner, parallelism):
    reference = collect(with_hold_and_drop())
    got = collect(with_hold_and_drop(runner, parallelism))
    assert got == reference
    seen = values(with_hold_and_drop(runner, parallelism))
    assert sorted(seen) == [v for v in range(180) if v % 3]  # every kept record once, the rest dropped
    assert seen != sorted(seen)  # held and reversed


@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_a_custom_accumulator_resumes_exactly(runner):
    assert_resumes_exactly(lambda: with_hold_and_drop(runner, parallelism=2), ks=[0, 1, 4, 9, 17])


class StampAnnounced(Accumulator):
    """Passes records through, stamping each with the components announced to this accumulator
    (``on_source_exhausted``; a fresh one after every flush point), and logs rows and
    announcements in order in ``log``."""

    log: list[tuple[str, int, int]] = []  # ("row", lane, value) / ("exhausted", lane, component id)

    def __init__(self) -> None:
        self.announced: set[int] = set()

    def push_many(self, elems):
        for r in elems:
            r.payload = {**r.payload, "announced": sorted(self.announced)}
            StampAnnounced.log.append(("row", r.meta.lane_id, r.payload["value"]))
        return [(list(elems), 0)] if elems else []

    def flush(self, *, reset=False, lane_id=None):
        return []

    def on_source_exhausted(self, lane_id, component_id):
        self.announced.add(component_id)
        StampAnnounced.log.append(("exhausted", lane_id, component_id))
        return []


def with_exhaustion(runner="inline", lanes=2, chunk_size=8):
    small, large = (Dataset.from_tables(name, [pa.table({"value": list(range(base, base + n))})])
                    for name, base, n in (("small", 0, 20), ("large", 1000, 100)))
    ws = StaticMixtureWorkSource([small, large], {"small": 0.5, "large": 0.5}, chunk_size=chunk_size, seed=3,
                                 exhausted_policy="redistribute")
    return Pipeline(ws).add_op("stamp", process_many=lambda rs: rs, preserves_cursor_order=True,
                               accumulator=StampAnnounced).batch(3, drop_last=False).options(
        runner=runner, canonical_replicas=lanes, flush_every_k_chunks=2, max_workers=2)


@pytest.mark.parametrize("runner", ["inline", "threads"])  # the log is kept in this process
@pytest.mark.parametrize("chunk_size", [3, 8])
def test_a_component_that_runs_out_is_announced_once_per_lane_between_its_rows_and_the_rest(runner, chunk_size):
    StampAnnounced.log = []
    values = sorted(r.payload["value"] for b in with_exhaustion(runner, chunk_size=chunk_size) for r in b.records)
    assert values == list(range(20)) + list(range(1000, 1100))
    ends = []
    for lane in (0, 1):
        events = [(kind, x) for kind, lane_id, x in StampAnnounced.log if lane_id == lane]
        # "small" (id 0) runs out mid-stream: announced once to each lane, after its rows there
        at = events.index(("exhausted", 0))
        assert events.count(("exhausted", 0)) == 1
        assert not any(kind == "row" and x < 1000 for kind, x in events[at:])
        assert any(kind == "row" for kind, x in events[at:])                    # large rows came after it
        ends += [events[-1]] if ("exhausted", 1) in events else []
    # "large" (id 1) runs out in the last chunk: announced once, to its lane, after every row
    assert ends == [("exhausted", 1)]
    assert sum(e == ("exhausted", 1, 1) or e == ("exhausted", 0, 1) for e in StampAnnounced.log) == 1


def test_the_process_runner_delivers_what_the_inline_runner_does_with_announcements():
    assert collect(with_exhaustion("process")) == collect(with_exhaustion("inline"))


@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_announcements_resume_exactly(runner):
    assert_resumes_exactly(lambda: with_exhaustion(runner), ks=[0, 1, 3, 6, 9, 14])


def test_checkpoints_stay_bounded_when_an_operator_drops_with_tombstones():
    import json

    sizes = []
    pipe = with_hold_and_drop(lanes=1)
    it = iter(pipe)
    for i, _ in enumerate(it):
        if i % 5 == 0:
            sizes.append(len(json.dumps(pipe.checkpoint())))
    assert len(sizes) >= 6 and max(sizes) - min(sizes) < 200  # does not grow with the records dropped


@pytest.mark.parametrize("groups", [2, 4])
def test_user_accumulators_give_the_same_global_steps_on_any_number_of_groups(groups):
    def run(n, g):
        return collect(with_hold_and_drop(lanes=4, world_size=n, global_rank=g))

    single = run(1, 0)
    parts = [run(groups, g) for g in range(groups)]
    assert Counter(s for p in parts for s in p) == Counter(single)
    for p in parts:  # each lane's items, in the lane's order, whichever group serves it
        for lane in {sig[1] for sig in p}:
            assert [sig for sig in p if sig[1] == lane] == [sig for sig in single if sig[1] == lane]


def test_an_accumulator_that_keeps_data_after_a_reset_flush_is_an_error():
    class Sticky(HoldAndDrop):
        def flush(self, *, reset=False, lane_id=None):
            return []

    pipe = build(flush_every_k_chunks=2).add_op("sticky", process_many=_mark, preserves_cursor_order=False,
                                                accumulator=Sticky)
    with pytest.raises(RuntimeError, match="sticky.*pending data"):
        collect(pipe)


def test_an_accumulator_that_mixes_lanes_is_an_error():
    shared: list = []  # one buffer behind every lane's accumulator: a batch then holds two lanes' records

    class Mixer(CountingAccumulator):
        def push_many(self, elems):
            shared.extend(elems)
            if len({r.meta.lane_id for r in shared}) < 2:
                return []
            batch = shared[:]
            shared.clear()
            return [(batch, 0)]

    pipe = build().add_op("mix", process_many=_mark, preserves_cursor_order=True, accumulator=lambda: Mixer(2))
    with pytest.raises(PipelineError, match="mix.*lane"):
        collect(pipe)


def test_the_accumulator_factory_may_take_deterministic_and_ctx():
    seen = []

    def factory(*, deterministic, ctx):
        seen.append((deterministic, ctx.get("lane_id")))
        return HoldAndDrop()

    pipe = build(flush_every_k_chunks=2).add_op("hold", process_many=_mark, preserves_cursor_order=False,
                                                accumulator=factory)
    assert values(pipe)
    assert {d for d, _ in seen} == {True} and {lane for _, lane in seen} >= {0, 1}


# ---------------------------------------------------------------- the columnar hook
class LengthScore(ColumnarOp):
    def traits(self):
        return OpTraits(preserves_cursor_order=True, parallelism=2)

    def process_columns(self, batch):
        return batch.append_column("score", pc.multiply(pc.utf8_length(batch.column("text")), 10))


@pytest.mark.parametrize("runner", RUNNERS)
def test_the_columnar_hook_scores_batches_like_the_record_form(runner):
    def by_records(records):
        for r in records:
            r.payload = {**r.payload, "score": len(r.payload["text"]) * 10}
        return records

    columnar = build(runner).add_op(LengthScore()).batch(4)
    assert "LengthScore@p2[columnar]" in columnar.explain()
    records = build(runner).add_op("score", process_many=by_records, preserves_cursor_order=True).batch(4)
    assert collect(columnar) == collect(records)


def test_the_columnar_hook_filters_and_fans_out_with_row_indices():
    def keep_even_twice_odd(df: pl.DataFrame):
        rows = [i for i, v in enumerate(df["value"].to_list()) for _ in range(1 if v % 2 == 0 else 2)]
        out = df[rows].with_columns(pl.Series("copy", [0] * len(rows)))
        return out, rows

    pipe = build().add_op("split", process_columns=keep_even_twice_odd, columns_format="polars",
                          preserves_cursor_order=True)
    records = list(pipe)
    counts = Counter(r.payload["value"] for r in records)
    assert set(counts.values()) == {1, 2} and all(counts[v] == 1 + v % 2 for v in counts)
    odd = [r for r in records if r.payload["value"] % 2]
    assert {r.meta.lineage for r in odd} == {(0,), (1,)}  # fan-out children are told apart
    assert all(r.meta.lineage == () for r in records if r.payload["value"] % 2 == 0)
    assert_resumes_exactly(lambda: build().add_op("split", process_columns=keep_even_twice_odd,
                                                  columns_format="polars", preserves_cursor_order=True).batch(5),
                           ks=[0, 3, 11])


def test_the_columnar_hook_must_say_how_rows_map_when_their_count_changes():
    pipe = build().add_op("half", process_columns=lambda b: b.slice(0, b.num_rows // 2), preserves_cursor_order=True)
    with pytest.raises(TypeError, match="half.*\\(batch, rows\\)"):
        collect(pipe)
    back = build().add_op("back", process_columns=lambda b: (b, list(range(b.num_rows))[::-1]),
                          preserves_cursor_order=True)
    with pytest.raises(TypeError, match="input order"):
        collect(back)
    reserved = build().add_op("bad", process_columns=lambda b: b.append_column("__lane", b.column("value")),
                              preserves_cursor_order=True)
    with pytest.raises(TypeError, match="reserved"):
        collect(reserved)


# ---------------------------------------------------------------- map_batch, traits, options
def test_map_batch_transforms_and_drops_delivered_batches_and_resumes():
    def only_full_with_sum(batch):
        if len(batch) < 4:
            return None
        total = sum(r.payload["value"] for r in batch.records)
        records = list(batch.records)
        for r in records:
            r.payload = {**r.payload, "batch_sum": total}
        return SampleBatch(records)

    def make():
        return build(flush_every_k_chunks=1).filter(lambda p: p["value"] % 5 != 0).batch(4, drop_last=False) \
            .map_batch(only_full_with_sum)

    batches = list(make())
    assert batches and all(len(b) == 4 for b in batches)
    assert all(r.payload["batch_sum"] == sum(x.payload["value"] for x in b.records) for b in batches
               for r in b.records)
    assert "map_batch" in make().explain()
    assert_resumes_exactly(make, ks=[0, 2, 7])
    kept = build().batch(4, drop_last=False).map_batch(lambda b: None, drop_none=False)
    assert len(list(kept)) == len(list(build().batch(4, drop_last=False)))


def test_map_batch_before_batch_is_refused_at_build_time():
    with pytest.raises(ValueError, match="map_batch.*batch\\(\\) first"):
        build().map_batch(lambda b: b)
    with pytest.raises(ValueError, match="only map_batch may follow"):
        build().batch(2).map_transform(lambda p: p)


def test_map_transform_drop_none_false_keeps_rows_unchanged():
    pipe = build().map_transform(lambda p: None if p["value"] % 2 else {**p, "even": True}, drop_none=False)
    records = list(pipe)
    assert len(records) == 180
    assert all((r.payload.get("even") is True) == (r.payload["value"] % 2 == 0) for r in records)


def test_requires_serial_state_pins_parallelism_to_one():
    pipe = build("threads").add_op("serial", process_many=_mark, preserves_cursor_order=True, parallelism=4,
                                   requires_serial_state=True)
    assert "serial@p1" in pipe.explain()


def test_an_op_that_reorders_within_calls_resumes_by_replay():
    def reverse(records):
        return records[::-1]

    def make():
        return build().add_op("reverse", process_many=reverse, preserves_cursor_order=False).batch(3)

    assert values(make()) != sorted(values(make()))
    assert_resumes_exactly(make, ks=[1, 5, 13])


def test_is_indexable_follows_the_ops_traits():
    assert build().is_indexable  # a finite StaticMixtureWorkSource stream has sample positions
    assert build().add_op("score", process_columns=_score_columns, preserves_cursor_order=True).is_indexable
    assert not build().add_op("score", process_columns=_score_columns, preserves_cursor_order=True,
                                  indexable=False).is_indexable
    assert not build().add_op("held", process_many=_mark, accumulator=HoldAndDrop,
                                  preserves_cursor_order=True).is_indexable


# ---------------------------------------------------------------- every form, runner and parallelism
def _score_records(records):
    for r in records:
        r.payload = {**r.payload, "score": len(r.payload["text"]) * 7 + r.payload["value"] % 11}
    return records


def _score_columns(batch):
    lengths = pc.utf8_length(batch.column("text")).to_numpy()
    return batch.append_column("score", pa.array(lengths * 7 + batch.column("value").to_numpy() % 11))


FORMS = {
    "records+counting": dict(process_many=_score_records, accumulator=lambda: CountingAccumulator(max_batch=7)),
    "columnar": dict(process_columns=_score_columns),
    "buffer+drop": dict(process_many=_mark, accumulator=HoldAndDrop),
}


def with_form(form: str, runner: str = "inline", parallelism: int = 1, **opts) -> Pipeline:
    return build(runner, flush_every_k_chunks=2, **opts).add_op(
        form, preserves_cursor_order=form != "buffer+drop", parallelism=parallelism, **FORMS[form]).batch(4)


def test_the_record_and_columnar_forms_score_alike():
    def scores(form):
        return [r.payload["score"] for b in with_form(form) for r in b.records]

    assert scores("columnar") == scores("records+counting")


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("parallelism", [1, 4])
def test_every_form_gives_the_same_batches_on_every_runner_and_parallelism(form, runner, parallelism):
    reference = collect(with_form(form))
    assert len(reference) >= 30
    assert collect(with_form(form, runner, parallelism)) == reference


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("runner", RUNNERS)
def test_every_form_resumes_exactly(form, runner):
    ks = [0, 7] if runner == "process" else [0, 1, 7, 22]
    assert_resumes_exactly(lambda: with_form(form, runner, parallelism=2), ks=ks)


@pytest.mark.parametrize("form", FORMS)
def test_every_form_gives_the_same_global_steps_on_1_2_and_4_groups(form):
    def run(n, g):
        return collect(with_form(form, canonical_replicas=4, world_size=n, global_rank=g))

    single = run(1, 0)
    for groups in (2, 4):
        parts = [run(groups, g) for g in range(groups)]
        assert Counter(s for p in parts for s in p) == Counter(single)
        for p in parts:
            for lane in {sig[1] for sig in p}:
                assert [sig for sig in p if sig[1] == lane] == [sig for sig in single if sig[1] == lane]


def test_explain_says_placement_has_no_effect():
    text = build("threads").map_transform(lambda p: p, placement="remote").explain()
    assert "placement= arguments have no effect" in text and "'threads' runner" in text
