"""StaticMixtureWorkSource: quotas, passes, exhaustion policies, state, validation."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_columnar.errors import CheckpointError, ConfigError, ConfigurationWarning, DataDroppedWarning
from zephon_columnar.work import MixtureSpec, StaticMixtureWorkSource, WorkChunk

from ._helpers import (
    drain,
    json_round_trip,
    make_ds,
    per_dataset,
    same_chunks,
    source,
    take,
)


def pairs(ptrs: np.ndarray) -> list[tuple[int, int]]:
    return [tuple(p) for p in ptrs[:, 1:].tolist()]


def all_pairs(ds) -> set[tuple[int, int]]:
    return {(s, r) for s, n in enumerate(ds.counts().tolist()) for r in range(n)}


def assert_passes_are_permutations(ds, ptrs: np.ndarray) -> None:
    """Split a dataset's draws into passes: full passes hold every row once, a partial one
    holds no row twice."""
    total = len(ds)
    got = pairs(ptrs)
    for p in range(0, len(got), total):
        chunk = got[p:p + total]
        assert len(set(chunk)) == len(chunk), f"row repeated inside pass {p // total}"
        if len(chunk) == total:
            assert set(chunk) == all_pairs(ds)


SHUFFLES = [dict(), dict(shuffle_shards=False), dict(shuffle_within_shard=True),
            dict(shuffle_block_size=5), dict(shuffle_block_size="auto"), dict(shuffle_block_size="global")]


# ---------------------------------------------------------------- one pass, exactly once
@pytest.mark.parametrize("knobs", SHUFFLES)
def test_one_dataset_delivers_every_row_once_and_a_partial_last_chunk(knobs):
    ds = make_ds("a", [7, 0, 13, 5])
    chunks = drain(source([ds], {"a": 1}, chunk_size=8, **knobs))
    assert [len(c) for c in chunks] == [8, 8, 8, 1]
    assert [c.global_index for c in chunks] == [0, 1, 2, 3]
    ptrs = per_dataset(chunks, "a")
    assert ptrs.dtype == np.int64 and (ptrs[:, 0] == 0).all()
    assert sorted(pairs(ptrs)) == sorted(all_pairs(ds))


def test_dataset_smaller_than_chunk_size_is_one_partial_chunk():
    ds = make_ds("tiny", [3, 2])
    ws = source([ds], {"tiny": 1})                 # default chunk_size 16384
    assert ws.total_samples == 5 and len(ws) == 5
    chunks = drain(ws)
    assert [len(c) for c in chunks] == [5]
    assert ws.next_chunk() is None and ws.next_chunk() is None


def test_zephon_reference_counts():
    a, b = make_ds("a", [40]), make_ds("b", [40])
    assert source([a, b], {"a": 1, "b": 1}, chunk_size=16).total_samples == 80
    assert source([a, b], {"a": 1, "b": 1}, chunk_size=16, stop_after_passes=2).total_samples == 160


def test_last_chunk_scales_finished_datasets_by_the_same_fraction():
    big, small = make_ds("big", [100]), make_ds("small", [20])
    chunks = drain(source([big, small], {"big": 1, "small": 1}, chunk_size=16))
    assert [len(c) for c in chunks] == [16] * 12 + [8]
    last = chunks[-1]
    assert len(last.components["big"]) == 4      # exactly the 4 rows big still lacked
    assert len(last.components["small"]) == 4    # round(f * 8) with f = 4/8
    assert len(per_dataset(chunks, "big")) == 100


@given(
    sizes=st.lists(st.integers(1, 60), min_size=1, max_size=4),
    raw=st.lists(st.integers(1, 5), min_size=4, max_size=4),
    chunk=st.integers(1, 40),
    passes=st.integers(1, 3),
    seed=st.integers(0, 3),
)
@settings(max_examples=60, deadline=None)
def test_stop_after_passes_every_dataset_completes_its_passes(sizes, raw, chunk, passes, seed):
    dss = [make_ds(f"d{i}", [n // 2, n - n // 2]) for i, n in enumerate(sizes)]
    weights = {ds.name: raw[i] for i, ds in enumerate(dss)}
    ws = source(dss, weights, chunk_size=chunk, seed=seed, stop_after_passes=passes)
    expected_total = ws.total_samples
    chunks = drain(ws)
    assert all(len(c) == chunk for c in chunks[:-1]) and 0 < len(chunks[-1]) <= chunk
    assert sum(map(len, chunks)) == expected_total
    drawn = {ds.name: per_dataset(chunks, ds.name) for ds in dss}
    for ds in dss:
        assert len(drawn[ds.name]) >= passes * len(ds)
        assert_passes_are_permutations(ds, drawn[ds.name])
    # the dataset(s) that finished last stop exactly at the end of pass N
    assert any(len(drawn[ds.name]) == passes * len(ds) for ds in dss)


def test_repeat_without_a_cap_repeats_forever():
    ws = source([make_ds("a", [5])], {"a": 1}, chunk_size=4, exhausted_policy="repeat")
    assert ws.total_samples == math.inf
    with pytest.raises(TypeError, match="infinite work source"):
        len(ws)
    assert len(take(ws, 50)) == 50


def test_stop_after_passes_none_without_a_policy_stops_every_dataset():
    # Zephon: no floor and no exhausted_policy means 'stop' for every dataset.
    ws = source([make_ds("a", [5])], {"a": 1}, chunk_size=4, stop_after_passes=None)
    assert ws.recipe()["exhausted_policy"] == {"a": "stop"}
    with pytest.warns(DataDroppedWarning, match="rows not read"):
        assert [len(c) for c in drain(ws)] == [4]


# ---------------------------------------------------------------- ratios and determinism
@given(
    raw=st.lists(st.sampled_from([0.001, 0.01, 0.1, 0.3, 1.0, 2.5]), min_size=1, max_size=5),
    chunk=st.integers(1, 50),
)
@settings(max_examples=40, deadline=None)
def test_long_run_ratio_is_exact_within_two_samples_at_every_chunk(raw, chunk):
    dss = [make_ds(f"d{i}", [10**6]) for i in range(len(raw))]
    ws = source(dss, {ds.name: w for ds, w in zip(dss, raw)}, chunk_size=chunk, exhausted_policy="repeat")
    w = np.array(raw) / sum(raw)
    got = np.zeros(len(raw))
    for m in range(1, 121):
        c = ws.next_chunk()
        assert len(c) == chunk
        got += [len(c.components.get(ds.name, ())) for ds in dss]
        assert np.abs(got - m * chunk * w).max() < 2


def quotas(chunks, names):
    return [[len(c.components.get(n, ())) for n in names] for c in chunks]


def test_bresenham_quotas_largest_remainder_ties_to_the_lower_index():
    dss = [make_ds(n, [1000]) for n in "abc"]
    ws = source(dss, {"a": 0.5, "b": 0.25, "c": 0.25}, chunk_size=6, exhausted_policy="repeat")
    # acc 3/1.5/1.5 -> 3/1/1 and the spare slot to b (tie with c); then acc 3/1/2 exactly
    assert quotas(take(ws, 3), "abc") == [[3, 2, 1], [3, 1, 2], [3, 2, 1]]
    ws = source(dss, {"a": 0.7, "b": 0.2, "c": 0.1}, chunk_size=16, exhausted_policy="repeat")
    # acc 11.2/3.2/1.6 -> 11/3/1 and the spare slot to the largest remainder, c
    assert quotas(take(ws, 1), "abc") == [[11, 3, 2]]
    equal = source(dss, {"a": 1, "b": 1, "c": 1}, chunk_size=1, exhausted_policy="repeat")
    assert quotas(take(equal, 6), "abc") == [[1, 0, 0], [0, 1, 0], [0, 0, 1]] * 2


def test_same_arguments_same_chunks_other_seed_other_order():
    def build(seed):
        return source([make_ds("a", [30, 20]), make_ds("b", [11])], {"a": 2, "b": 1},
                      chunk_size=9, seed=seed, shuffle_within_shard=True)

    first, again, other = drain(build(4)), drain(build(4)), drain(build(5))
    assert same_chunks(first, again)
    assert [len(c) for c in first] == [len(c) for c in other]
    assert not same_chunks(first, other)


def test_chunks_are_keyed_by_name_in_dataset_order_with_dataset_ids():
    dss = [make_ds("web", [50]), make_ds("code", [50]), make_ds("math", [50])]
    ws = source(dss, {"math": 0.2, "web": 0.5, "code": 0.3}, chunk_size=10)
    c = ws.next_chunk()
    assert c.component_names == ("web", "code", "math")
    for i, name in enumerate(c.component_names):
        assert (c.component_arrays[name][:, 0] == i).all()
    # sample units: the counted composition is the target, so none is stated (as in Zephon) ...
    assert c.target_mixture is None and c.mixture == {"web": 0.5, "code": 0.3, "math": 0.2}
    assert c.seed == 0 and c.source_exhausted == ()
    # ... unless a dataset redistributes, whose sparse last chunks would mislead
    stated = source(dss, {"math": 0.2, "web": 0.5, "code": 0.3}, chunk_size=10, exhausted_policy="redistribute")
    assert stated.next_chunk().target_mixture == {"web": 0.5, "code": 0.3, "math": 0.2}
    assert ws.component_ids() == ws.dataset_ids == {"web": 0, "code": 1, "math": 2}
    assert ws.datasets_by_id == {0: dss[0], 1: dss[1], 2: dss[2]}
    assert ws.chunk_size_hint() == 10


@pytest.mark.parametrize("knobs", [{}, {"shuffle_within_shard": True, "shuffle_block_size": 7}])
def test_pointers_carry_the_datasets_shard_ids_not_positions(knobs):
    from zephon_columnar.io.dataset import Dataset

    positional = make_ds("m", [5, 7, 3])
    tables = positional.format.tables
    given = Dataset.from_tables("m", tables, shard_ids=[2, 5, 9])
    ids = np.array([2, 5, 9])
    for lane in (None, (1, 2)):
        a = source([positional], {"m": 1.0}, chunk_size=4, seed=3, **knobs)
        b = source([given], {"m": 1.0}, chunk_size=4, seed=3, **knobs)
        if lane is not None:
            a, b = a.clone_for_lane(*lane), b.clone_for_lane(*lane)
        want, got = drain(a), drain(b)
        assert len(got) == len(want) > 0
        for cw, cg in zip(want, got):
            pw, pg = cw.component_arrays["m"], cg.component_arrays["m"]
            # same data order; the shard column holds ids()[position]
            assert pg[:, 0].tolist() == pw[:, 0].tolist() and pg[:, 2].tolist() == pw[:, 2].tolist()
            assert pg[:, 1].tolist() == ids[pw[:, 1]].tolist()


# ---------------------------------------------------------------- exhaustion policies
@pytest.mark.parametrize("reshuffle", [True, False])
def test_repeat_restarts_each_pass_reshuffled_or_not(reshuffle):
    ds = make_ds("a", [6, 4])
    ws = source([ds], {"a": 1}, chunk_size=3, exhausted_policy="repeat", reshuffle_on_repeat=reshuffle,
                shuffle_within_shard=True)
    assert ws.total_samples == math.inf
    drawn = pairs(per_dataset(take(ws, 20), "a"))
    passes = [drawn[i:i + 10] for i in range(0, 60, 10)]
    assert all(set(p) == all_pairs(ds) for p in passes)
    assert (passes[0] != passes[1]) == reshuffle
    assert ws.continues_after_exhaustion() == frozenset()  # a repeat restarts: the source never goes on without it


@pytest.mark.parametrize("reshuffle", [True, False])
def test_dataset_much_smaller_than_a_chunk_wraps_pass_after_pass(reshuffle):
    ds = make_ds("a", [2, 1])
    ws = source([ds], {"a": 1}, chunk_size=20, exhausted_policy="repeat", reshuffle_on_repeat=reshuffle,
                shuffle_within_shard=True)
    drawn = pairs(per_dataset(take(ws, 3), "a"))
    passes = [tuple(drawn[i:i + 3]) for i in range(0, 60, 3)]
    assert all(set(p) == all_pairs(ds) for p in passes)
    assert (len(set(passes)) == 1) == (not reshuffle)


def test_max_repeats_caps_passes_then_ends_the_source_like_stop():
    # Zephon: a capped repeat is terminal; once its 1 + N passes run out the source ends.
    small, big = make_ds("small", [20]), make_ds("big", [200])
    ws = source([small, big], {"small": 1, "big": 1}, chunk_size=10, exhausted_policy="repeat", max_repeats=1)
    assert ws.total_samples == 80
    chunks = drain(ws)
    assert [len(c) for c in chunks] == [10] * 8
    assert len(per_dataset(chunks, "small")) == 40 and len(per_dataset(chunks, "big")) == 40
    assert [c.source_exhausted for c in chunks] == [()] * 7 + [("small",)]
    assert_passes_are_permutations(small, per_dataset(chunks, "small"))


def test_max_repeats_per_dataset_caps_only_the_named_dataset():
    ws = source([make_ds("a", [8]), make_ds("b", [6])], {"a": 1, "b": 1}, chunk_size=4,
                exhausted_policy="repeat", max_repeats={"a": 0})
    assert ws.total_samples == 16
    chunks = drain(ws)
    assert len(per_dataset(chunks, "a")) == 8 and len(per_dataset(chunks, "b")) == 8  # b wrapped once
    assert chunks[-1].source_exhausted == ("a",)   # b repeats: never announced
    assert ws.continues_after_exhaustion() == frozenset()  # no 'redistribute' dataset


def test_an_uncapped_repeat_is_never_announced_exhausted():
    ws = source([make_ds("a", [3]), make_ds("b", [40])], {"a": 1, "b": 1}, chunk_size=4,
                exhausted_policy={"a": "repeat", "b": "stop"})
    chunks = drain(ws)
    assert [c.source_exhausted for c in chunks] == [()] * 19 + [("b",)]  # b: 40 rows, 2 a chunk


@pytest.mark.parametrize("settings, message", [
    (dict(exhausted_policy={"a": "stop", "b": "repeat"}, max_repeats={"a": 2}), r"max_repeats\['a'\]=2 has no effect"),
    (dict(exhausted_policy={"a": "redistribute", "b": "repeat"}, reshuffle_on_repeat={"a": False}),
     r"reshuffle_on_repeat\['a'\]=False has no effect"),
    (dict(exhausted_policy="stop", max_repeats=3), "max_repeats=3 has no effect without a repeat component"),
])
def test_a_repeat_setting_without_a_repeating_dataset_warns(settings, message):
    with pytest.warns(ConfigurationWarning, match=message) as caught:
        source([make_ds("a", [4]), make_ds("b", [4])], {"a": 1, "b": 1}, chunk_size=2, **settings)
    assert len(caught) == 1 and issubclass(caught[0].category, RuntimeWarning)  # Zephon's class too


def test_an_empty_redistributing_dataset_is_announced_from_the_first_chunk():
    ws = source([make_ds("a", [0]), make_ds("b", [3])], {"a": 1, "b": 1}, chunk_size=4,
                exhausted_policy="redistribute")
    (chunk,) = drain(ws)
    assert len(chunk) == 3 and chunk.target_mixture == {"b": 1.0}
    assert chunk.source_exhausted == ("a", "b")


@pytest.mark.parametrize("sizes, policy, message", [
    ([4, 0], "stop", "Dataset 'b' has 0 samples and exhausted_policy='stop'"),
    ([4, 0], None, "Dataset 'b' has 0 samples but repeat policy requires"),  # the floor: all repeat
    ([0, 0], "redistribute", "At least one dataset must contain samples"),
])
def test_empty_datasets_that_could_never_give_their_share_are_refused(sizes, policy, message):
    dss = [make_ds(n, [k]) for n, k in zip("ab", sizes)]
    with pytest.raises(ConfigError, match=message):
        source(dss, {"a": 1, "b": 1}, chunk_size=2, exhausted_policy=policy)


def test_redistribute_reads_each_dataset_once_and_renormalizes():
    dss = [make_ds("a", [12]), make_ds("b", [100]), make_ds("c", [50])]
    ws = source(dss, {"a": 0.5, "b": 0.3, "c": 0.2}, chunk_size=10, exhausted_policy="redistribute")
    assert ws.total_samples == 162
    chunks = drain(ws)
    assert all(len(c) == 10 for c in chunks[:-1]) and len(chunks[-1]) == 2
    for ds in dss:
        assert sorted(pairs(per_dataset(chunks, ds.name))) == sorted(all_pairs(ds))
    gone = next(i for i, c in enumerate(chunks) if "a" in c.source_exhausted)
    later = chunks[gone + 1:gone + 5]
    assert later[0].target_mixture == {"b": 0.6, "c": 0.4}
    b, c = (sum(len(ch.components[n]) for ch in later) for n in ("b", "c"))
    assert (b, c) == (24, 16)
    assert chunks[-1].source_exhausted == ("a", "b", "c")
    assert ws.continues_after_exhaustion() == frozenset({"a", "b", "c"})


def test_stop_ends_before_the_chunk_the_dataset_cannot_fill():
    short, long_ = make_ds("short", [13]), make_ds("long", [500])
    kw = dict(chunk_size=8, seed=1)
    with pytest.warns(DataDroppedWarning, match="rows not read"):
        stop = drain(source([short, long_], {"short": 1, "long": 1}, exhausted_policy={"short": "stop"}, **kw))
    ref = take(source([short, long_], {"short": 1, "long": 1}, exhausted_policy="repeat", **kw), len(stop))
    # 3 full chunks (12 of short's 13 rows); the fourth would need 4 rows of short: not planned
    assert len(stop) == 3 and all(len(c.components["short"]) == 4 for c in stop)
    assert same_chunks(stop, ref)


def test_stop_that_runs_out_exactly_goes_on_until_its_next_draw():
    # Zephon: the source ends at the first chunk 'stop' cannot fill, so chunks in which a sparse
    # dataset that ran out exactly has no quota still come (announcing it), and the chunk that
    # needs it is not planned: the failed draw leaves the state as it was.
    ws = source([make_ds("a", [2]), make_ds("b", [500])], {"a": 1, "b": 9}, chunk_size=5,
                exhausted_policy="stop")
    chunks = drain(ws)
    took_last_a = max(i for i, c in enumerate(chunks) if "a" in c.components)
    assert len(per_dataset(chunks, "a")) == 2 and took_last_a < len(chunks) - 1
    assert all(c.source_exhausted == ("a",) for c in chunks[took_last_a:])
    assert all(c.source_exhausted == () for c in chunks[:took_last_a])
    assert all(len(c) == 5 for c in chunks)
    done = ws.state_dict()
    assert ws.next_chunk() is None and ws.state_dict() == done


def test_stop_on_a_single_dataset_ends_at_the_chunk_it_cannot_fill_and_says_so():
    # Zephon: 'stop' keeps every chunk full; the rows short of a chunk are not read, with a
    # warning naming them (the default stop_after_passes=1 reads every row, see below).
    ds = make_ds("a", [10, 9])
    ws = source([ds], {"a": 1}, chunk_size=4, exhausted_policy="stop")
    with pytest.warns(DataDroppedWarning, match=r"rows not read: \{'a': 3\}"):
        chunks = drain(ws)
    assert [len(c) for c in chunks] == [4, 4, 4, 4]
    assert len(set(pairs(per_dataset(chunks, "a")))) == 16
    every = drain(source([ds], {"a": 1}, chunk_size=4))
    assert [len(c) for c in every] == [4, 4, 4, 4, 3]
    assert sorted(pairs(per_dataset(every, "a"))) == sorted(all_pairs(ds))


def test_stop_that_cannot_fill_the_first_chunk_is_refused_naming_it():
    ws = source([make_ds("a", [50]), make_ds("b", [1])], {"a": 0.5, "b": 0.5}, chunk_size=8,
                exhausted_policy="stop")
    before = ws.state_dict()
    with pytest.raises(ConfigError, match=r"Cannot produce the first chunk.*dataset 'b'.*1 row\(s\).*quota of 4"):
        ws.next_chunk()
    assert ws.state_dict() == before


def test_policy_dict_defaults_missing_datasets_to_stop():
    # Zephon: without a pass floor a dataset the policy does not name stops.
    ws = source([make_ds("a", [4]), make_ds("b", [4])], {"a": 1, "b": 1}, chunk_size=2,
                exhausted_policy={"a": "redistribute"})
    assert ws.recipe()["exhausted_policy"] == {"a": "redistribute", "b": "stop"}
    assert ws.total_samples == 8


def test_zero_weight_component_never_appears_and_does_not_block_the_end():
    ws = source([make_ds("a", [9]), make_ds("off", [5])], {"a": 1, "off": 0}, chunk_size=4)
    chunks = drain(ws)
    assert [len(c) for c in chunks] == [4, 4, 1]
    # never drawn: left out of every chunk, and not announced (it did not run out)
    assert all("off" not in c.components and "off" not in c.source_exhausted for c in chunks)


# ---------------------------------------------------------------- total_samples
POLICY_CONFIGS = [
    dict(),
    dict(stop_after_passes=2),
    dict(exhausted_policy="redistribute"),
    dict(exhausted_policy={"d0": "stop"}),
    dict(exhausted_policy="repeat", max_repeats=1),
    dict(exhausted_policy={"d0": "redistribute", "d1": "repeat"}, max_repeats=2),
    dict(exhausted_policy={"d0": "redistribute"}),
]


def cannot_start(ws: StaticMixtureWorkSource) -> bool:
    """Whether a 'stop' dataset cannot fill its quota of the first chunk: the source refuses
    to start (and its state stays as it was)."""
    before = ws.state_dict()
    try:
        ws.total_samples
    except ConfigError as err:
        assert "Cannot produce the first chunk" in str(err)
        with pytest.raises(ConfigError, match="Cannot produce the first chunk"):
            ws.next_chunk()
        assert ws.state_dict() == before
        return True
    return False


@given(
    sizes=st.lists(st.integers(1, 40), min_size=2, max_size=3),
    raw=st.lists(st.integers(0, 4), min_size=3, max_size=3),
    chunk=st.integers(1, 24),
    config=st.sampled_from(POLICY_CONFIGS),
    skip=st.integers(0, 6),
)
@settings(max_examples=80, deadline=None)
def test_total_samples_is_exact_from_any_position(sizes, raw, chunk, config, skip):
    dss = [make_ds(f"d{i}", [n]) for i, n in enumerate(sizes)]
    weights = {ds.name: raw[i] for i, ds in enumerate(dss)}
    if sum(weights.values()) == 0:
        weights["d0"] = 1
    ws = source(dss, weights, chunk_size=chunk, **config)
    if cannot_start(ws) or ws.total_samples == math.inf:
        return
    head = take(ws, skip)
    remaining = ws.total_samples
    assert len(ws) == remaining
    rest = drain(ws)
    assert sum(map(len, rest)) == remaining
    assert ws.total_samples == 0
    assert all(0 < len(c) for c in head + rest)


# ---------------------------------------------------------------- state
STATE_CONFIGS = POLICY_CONFIGS + [
    dict(exhausted_policy="repeat"),
    dict(shuffle_within_shard=True, shuffle_block_size=3, reshuffle_on_repeat={"d1": False}),
]


@given(
    sizes=st.lists(st.integers(1, 30), min_size=2, max_size=3),
    raw=st.lists(st.integers(1, 4), min_size=3, max_size=3),
    chunk=st.integers(1, 16),
    config=st.sampled_from(STATE_CONFIGS),
    cut=st.integers(0, 25),
)
@settings(max_examples=80, deadline=None)
def test_state_round_trip_through_json_equals_uninterrupted(sizes, raw, chunk, config, cut):
    def build():
        dss = [make_ds(f"d{i}", [n, 3]) for i, n in enumerate(sizes)]
        return source(dss, {ds.name: raw[i] for i, ds in enumerate(dss)}, chunk_size=chunk, seed=2, **config)

    if cannot_start(build()):
        return
    full = take(build(), 40)
    ws = build()
    head = take(ws, cut)
    state = json_round_trip(ws.state_dict())
    resumed = build()
    resumed.load_state_dict(state)
    rest = take(resumed, 40 - len(head))
    assert same_chunks(head + rest, full)


def test_state_does_not_grow_over_a_long_stream():
    ws = source([make_ds("a", [7, 5]), make_ds("b", [3])], {"a": 0.7, "b": 0.3}, chunk_size=4,
                exhausted_policy="repeat", shuffle_within_shard=True)
    take(ws, 10)
    early = len(json.dumps(ws.state_dict()))
    take(ws, 3000)
    late = ws.state_dict()
    assert late["global_chunk_index"] == 3010
    assert len(json.dumps(late)) <= early + 16   # only a few more digits in the counters


def test_state_describes_the_block_shuffle_of_each_block_shuffled_dataset():
    dss = [make_ds("a", [10]), make_ds("b", [30])]
    ws = source(dss, {"a": 1, "b": 3}, chunk_size=8, shuffle_block_size=4, seed=3)
    ws.next_chunk()                           # 2 rows of a, 6 of b
    states = ws.state_dict()["cursor_states"]
    assert states["a"]["block_rng_snapshot"] == {"rng_state": [3, 0], "block_count": 1}
    assert states["b"]["block_rng_snapshot"] == {"rng_state": [3, 0], "block_count": 2}
    unblocked = source(dss, {"a": 1, "b": 3}, chunk_size=8).state_dict()["cursor_states"]
    assert all("block_rng_snapshot" not in c for c in unblocked.values())


def _recipe_source(b_rows=(5,), mixture=None, **kw):
    dss = [make_ds("a", [10]), make_ds("b", list(b_rows))]
    return source(dss, mixture or {"a": 1, "b": 1}, **{"chunk_size": 8, **kw})


@pytest.mark.parametrize(
    "saved_with, field",
    [
        (dict(seed=1), "seed"),
        (dict(chunk_size=9), "chunk_size"),
        (dict(mixture={"a": 1, "b": 2}), "mixture.a"),
        (dict(shuffle_shards=False), "shuffle_shards"),
        (dict(shuffle_within_shard=True), "shuffle_within_shard"),
        (dict(shuffle_block_size=4), "shuffle_block_size.a"),
        (dict(shuffle_block_size={"b": "global"}), "shuffle_block_size.b"),
        (dict(exhausted_policy="redistribute"), "exhausted_policy.a"),
        (dict(reshuffle_on_repeat=False), "reshuffle_on_repeat.a"),
        (dict(stop_after_passes=3), "stop_after_passes"),
        (dict(exhausted_policy="repeat", max_repeats={"b": 2}), "max_repeats.b"),
        (dict(lane_assignment="modulo"), "lane_assignment"),
    ],
)
def test_a_state_taken_with_other_arguments_continues_with_them_and_warns(saved_with, field):
    # Zephon's rule: the state's seed, chunk size, mixture, shuffles and (unless passed here)
    # exhaustion settings win, so the stream continues as if never interrupted.
    saved = _recipe_source(**saved_with).clone_for_lane(1, 2)
    saved.next_chunk()
    state = json_round_trip(saved.state_dict())
    here = _recipe_source().clone_for_lane(1, 2)
    with pytest.warns(ConfigurationWarning, match=r"contradict the checkpoint") as caught:
        here.load_state_dict(state)
    assert field in str(caught[0].message)
    assert here.recipe() == saved.recipe()
    assert same_chunks(drain(here), drain(saved))


@pytest.mark.parametrize(
    "change, field",
    [(dict(b_rows=[6]), "datasets[1].rows"), (dict(b_rows=[2, 3]), "datasets[1].shards")],
)
def test_a_state_taken_over_other_data_is_refused_naming_the_field(change, field):
    saved = _recipe_source()
    saved.next_chunk()
    state = json_round_trip(saved.state_dict())
    with pytest.raises(CheckpointError, match=r"taken over other datasets") as err:
        _recipe_source(**change).load_state_dict(state)
    assert field in str(err.value)
    _recipe_source().load_state_dict(state)    # same recipe: fine


@pytest.mark.parametrize(
    "passed, field",
    [(dict(exhausted_policy="redistribute"), "exhausted_policy.a"),
     (dict(reshuffle_on_repeat=False), "reshuffle_on_repeat.a"),
     (dict(stop_after_passes=2), "stop_after_passes")],
)
def test_exhaustion_settings_passed_here_that_contradict_the_state_are_refused(passed, field):
    saved = _recipe_source()
    saved.next_chunk()
    state = json_round_trip(saved.state_dict())
    here = _recipe_source(**passed)
    before = here.state_dict()
    with pytest.raises(CheckpointError, match=r"contradict the checkpoint") as err:
        here.load_state_dict(state)
    assert field in str(err.value)
    assert here.state_dict() == before          # a refused restore changes nothing


def test_equivalent_mixture_spellings_have_the_same_recipe():
    dss = [make_ds("a", [10]), make_ds("b", [5])]
    one = source(dss, {"a": 1, "b": 3}, chunk_size=8)
    other = StaticMixtureWorkSource(dss, MixtureSpec({"b": 0.75, "a": 0.25}), chunk_size=8)
    assert one.recipe() == other.recipe()
    other.load_state_dict(json_round_trip(one.state_dict()))


@pytest.mark.parametrize(
    "mutate",
    [lambda s: s.pop("cursor_states"), lambda s: s.update(version=7), lambda s: s.pop("recipe"),
     lambda s: s["cursor_states"]["a"].update(position=10), lambda s: s["cursor_states"]["a"].update(epoch=-1),
     lambda s: s["cursor_states"].pop("b"), lambda s: s["cursor_states"]["a"].update(accumulator="x")],
)
def test_malformed_state_raises_checkpoint_error(mutate):
    dss = [make_ds("a", [10]), make_ds("b", [5])]
    state = json_round_trip(source(dss, {"a": 1, "b": 1}, chunk_size=4).state_dict())
    mutate(state)
    with pytest.raises(CheckpointError):
        source(dss, {"a": 1, "b": 1}, chunk_size=4).load_state_dict(state)


# ---------------------------------------------------------------- validation
A, B = make_ds("web", [10]), make_ds("code", [10])


@pytest.mark.parametrize(
    "kwargs, fragments",
    [
        (dict(mixture={"web": 1, "cod": 1}), ["cod", "code"]),
        (dict(datasets=[A, make_ds("code", [0, 0])], mixture={"web": 1, "code": 1}), ["'code'", "0 samples"]),
        (dict(datasets=[A, make_ds("web", [3])], mixture={"web": 1}), ["duplicate", "web"]),
        (dict(datasets=[]), ["empty"]),
        (dict(chunk_size=0), ["chunk_size"]),
        (dict(chunk_size=2.5), ["chunk_size"]),
        (dict(seed=-1), ["seed"]),
        (dict(exhausted_policy="loop"), ["exhausted_policy", "loop"]),
        (dict(exhausted_policy={"code": "again"}), ["exhausted_policy['code']", "again"]),
        (dict(exhausted_policy={"math": "stop"}), ["exhausted_policy", "math"]),
        (dict(max_repeats=-1), ["max_repeats", "-1"]),
        (dict(max_repeats={"web": -2}), ["max_repeats['web']"]),
        (dict(exhausted_policy="redistribute", stop_after_passes=2), ["stop_after_passes", "requires every dataset to repeat"]),
        (dict(exhausted_policy="stop", stop_after_passes=2), ["stop_after_passes", "stop"]),
        (dict(max_repeats=1, stop_after_passes=1), ["stop_after_passes", "max_repeats"]),
        (dict(stop_after_passes=0), ["stop_after_passes"]),
        (dict(shuffle_block_size="huge"), ["shuffle_block_size"]),
        (dict(shuffle_block_size=0), ["shuffle_block_size"]),
        (dict(reshuffle_on_repeat="yes"), ["reshuffle_on_repeat"]),
        (dict(shuffle_shards=None), ["shuffle_shards"]),
        (dict(lane_assignment="round_robin"), ["lane_assignment"]),
        (dict(token_estimation=0.25), ["token_estimation"]),
    ],
)
def test_config_errors_name_the_option_or_component(kwargs, fragments):
    args = dict(datasets=[A, B], mixture={"web": 1, "code": 1})
    args.update(kwargs)
    with pytest.raises(ConfigError) as err:
        StaticMixtureWorkSource(**args)
    for f in fragments:
        assert f in str(err.value), (f, str(err.value))


def test_explicit_stop_after_passes_none_with_stop_is_allowed():
    ws = source([A, B], {"web": 1, "code": 1}, chunk_size=4, exhausted_policy="stop", stop_after_passes=None)
    assert ws.total_samples == 20
