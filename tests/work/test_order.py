"""DatasetOrder: every pass is a permutation; each shuffle knob follows its seeding rule."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_columnar.work.order import DatasetOrder

COUNTS = np.array([40, 0, 25, 60, 1, 33], dtype=np.int64)  # includes an empty and a 1-row shard


def make(counts=COUNTS, seed=5, shards=False, within=False, block=None, reshuffle=True):
    return DatasetOrder(np.asarray(counts), seed=seed, shuffle_shards=shards,
                        shuffle_within_shard=within, block_size=block, reshuffle_on_repeat=reshuffle)


def full(order, epoch=0):
    return order.take(epoch, 0, order.total)


def identity(counts=COUNTS):
    return np.array([(s, r) for s, n in enumerate(counts) for r in range(n)], dtype=np.int64)


KNOBS = [
    dict(shards=True), dict(within=True), dict(block=16), dict(block=10_000),
    dict(shards=True, within=True), dict(shards=True, within=True, block=7),
]


def test_no_shuffle_is_shard_then_row_order():
    assert np.array_equal(full(make()), identity())


@pytest.mark.parametrize("knobs", KNOBS)
def test_each_knob_permutes_and_stays_a_permutation(knobs):
    order = make(**knobs)
    got = full(order)
    assert got.dtype == np.int64 and got.shape == (COUNTS.sum(), 2)
    assert not np.array_equal(got, identity())
    # a permutation of every (shard, row): sorted lexicographically it is the identity
    assert np.array_equal(got[np.lexsort((got[:, 1], got[:, 0]))], identity())
    assert np.array_equal(full(make(**knobs)), got)                 # deterministic
    assert not np.array_equal(full(make(seed=6, **knobs)), got)     # seed matters


def test_shuffle_shards_permutes_whole_shards_by_the_documented_rng():
    got = full(make(shards=True))
    perm = np.random.default_rng([5, 0, 0]).permutation(len(COUNTS))
    expected = np.concatenate([identity()[identity()[:, 0] == s] for s in perm])
    assert np.array_equal(got, expected)


def test_within_shard_keeps_shard_order_and_uses_per_shard_seeds():
    got = full(make(within=True))
    assert np.array_equal(got[:, 0], identity()[:, 0])
    for s, n in enumerate(COUNTS):
        rows = got[got[:, 0] == s, 1]
        assert np.array_equal(rows, np.random.default_rng([5, 0, s, 1]).permutation(n))


def test_block_shuffle_permutes_inside_consecutive_blocks_only():
    block = 16
    got, ident = full(make(block=block)), identity()
    flat = got[:, 0] * 1000 + got[:, 1]       # back to pass positions of the unshuffled order
    pos = np.searchsorted(ident[:, 0] * 1000 + ident[:, 1], flat)
    for b in range(0, len(pos), block):
        seg = pos[b:b + block]
        expected = np.random.default_rng([5, 0, b // block, 2]).permutation(len(seg)) + b
        assert np.array_equal(seg, expected)


@pytest.mark.parametrize("reshuffle", [True, False])
def test_block_rng_snapshot_is_the_key_and_the_blocks_begun(reshuffle):
    order = make(block=16, reshuffle=reshuffle)
    e = 2 if reshuffle else 0                  # without reshuffling every pass uses pass 0's key
    assert order.block_rng_snapshot(2, 0) == {"rng_state": [5, e], "block_count": 0}
    assert order.block_rng_snapshot(2, 16) == {"rng_state": [5, e], "block_count": 1}
    assert order.block_rng_snapshot(2, 17) == {"rng_state": [5, e], "block_count": 2}
    assert make(block=None).block_rng_snapshot(2, 17) is None


def test_block_at_least_dataset_size_is_a_global_shuffle():
    order = make(block=10**9)
    assert order.block_size == COUNTS.sum()
    assert np.array_equal(full(order), full(make(block=int(COUNTS.sum()))))


@pytest.mark.parametrize("knobs", KNOBS)
def test_reshuffle_on_repeat(knobs):
    again = make(reshuffle=True, **knobs)
    assert not np.array_equal(full(again, 0), full(again, 1))
    same = make(reshuffle=False, **knobs)
    assert np.array_equal(full(same, 0), full(same, 3))
    assert np.array_equal(full(same, 0), full(again, 0))   # epoch part 0 either way in pass 0


@given(
    knob=st.sampled_from(KNOBS + [{}]),
    cuts=st.lists(st.integers(0, int(COUNTS.sum())), max_size=8),
    epoch=st.integers(0, 3),
)
@settings(max_examples=80, deadline=None)
def test_any_split_of_a_pass_concatenates_to_the_whole_pass(knob, cuts, epoch):
    ref = full(make(**knob), epoch)
    order = make(**knob)          # one instance: caches carried across takes must not leak
    bounds = sorted({0, int(COUNTS.sum()), *cuts})
    parts = [order.take(epoch, a, b - a) for a, b in zip(bounds, bounds[1:])]
    assert np.array_equal(np.concatenate(parts), ref)
    assert order.take(epoch, 3, 0).shape == (0, 2)


@given(
    knob=st.sampled_from(KNOBS + [{}, dict(reshuffle=False, within=True)]),
    reads=st.lists(st.tuples(st.integers(0, 2), st.integers(0, int(COUNTS.sum()) - 1), st.integers(1, 3)),
                   min_size=1, max_size=40),
)
@settings(max_examples=80, deadline=None)
def test_short_takes_in_any_order_and_pass_match_the_whole_pass(knob, reads):
    # A wide mixture reads a row or two of each dataset at a time: take remembers the shard it
    # last read (its fast path), which must never answer for another pass or position.
    order, passes = make(**knob), {e: full(make(**knob), e) for e in range(3)}
    for epoch, start, n in reads:
        n = min(n, order.total - start)
        assert np.array_equal(order.take(epoch, start, n), passes[epoch][start:start + n]), (epoch, start, n)


def test_take_writes_into_a_strided_out_view():
    order = make(shards=True, within=True, block=9)
    buf = np.full((20, 3), -1, dtype=np.int64)
    order.take(1, 30, 20, out=buf[:, 1:])
    assert np.array_equal(buf[:, 1:], order.take(1, 30, 20))
    assert (buf[:, 0] == -1).all()


def test_clone_has_the_same_order_and_its_own_caches():
    order = make(shards=True, within=True, block=9)
    twin = order.clone()
    assert np.array_equal(full(order, 2), full(twin, 2))
    assert twin._win_rows is not order._win_rows


@pytest.mark.parametrize("args", [(0, -1, 2), (0, 150, 10), (-1, 0, 1), (0, 0, -1)])
def test_out_of_range_take_raises(args):
    with pytest.raises(ValueError, match="take"):
        make().take(*args)


def test_huge_dataset_is_never_materialized():
    # 10^12 rows: a materialized pass would need 16 TB; lazily it is arithmetic
    order = make(counts=np.full(1000, 10**9), shards=True, within=False)
    got = order.take(7, 10**12 - 5, 5)
    last = np.random.default_rng([5, 7, 0]).permutation(1000)[-1]
    assert got.tolist() == [[last, 10**9 - 5 + i] for i in range(5)]


def test_cached_permutations_stay_within_block_plus_shards():
    counts = np.full(50, 300)
    order = make(counts=counts, shards=True, within=True, block=1000)
    for start in range(0, 15000 - 700, 700):
        order.take(0, start, 700)
        # a take touches at most two blocks; the cache holds only shards overlapping them
        assert len(order._win_rows) <= 2 * 1000 + 2 * 300
        assert len(order._blk_perm) <= 1000


@pytest.mark.parametrize("shards", [False, True])
def test_consecutive_unshuffled_takes_equal_the_materialized_pass(shards):
    # The arithmetic fast path (no per-position search) against the pass written out: shards in
    # their (permuted) order, rows ascending. Speed is measured in benchmarks/, not asserted here.
    counts = np.full(64, 5000)
    order = make(counts=counts, shards=shards)
    visit = np.random.default_rng([5, 0, 0]).permutation(64) if shards else np.arange(64)
    reference = np.concatenate([np.stack([np.full(n, s), np.arange(n)], axis=1) for s, n in zip(visit, counts[visit])])
    for start in [100 * i for i in range(30)] + [4990, 5000, len(reference) - 16384]:
        assert np.array_equal(order.take(0, start, 16384), reference[start:start + 16384]), start
