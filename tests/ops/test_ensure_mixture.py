"""ensure_mixture: smooth weighted round robin per lane; Zephon's examples; the token share
converges to the target on a skewed corpus; frame cuts do not matter; exact resume."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar import frame as F
from zephon_columnar.errors import ConfigError, MixtureDropWarning
from zephon_columnar.losses import said_of
from zephon_columnar.ops.accumulators.lane import LaneContext
from zephon_columnar.ops.ensure_mixture import EnsureMixtureOp
from zephon_columnar.testing import assert_resumes_exactly, collect

CTX = LaneContext(component_names={0: "A", 1: "B"})


def records(spec: str, tokens: dict[str, int] | None = None) -> pa.Table:
    """Rows named like "A0 B6 A1": component letter, then an id; optional token counts per letter."""
    names = spec.split()
    n = len(names)
    comps = np.array([0 if s[0] == "A" else 1 for s in names], np.int32)
    book = F.pointer_frame(lane=0, chunk_id=0, offsets=np.arange(n),
                           pointers=np.array([[c, 0, i] for i, c in enumerate(comps)], np.int64).reshape(-1, 3),
                           components=comps)
    length = tokens or {"A": 1, "B": 1}
    ids = pa.array([[0] * length[s[0]] for s in names], pa.list_(pa.int32()))
    return F.with_payload(book, pa.table({"name": names, "input_ids": ids}))


def run(op, frames):
    acc = op.lane_accumulator(CTX)
    out = [t for f in frames for t in acc.push(f)] + acc.flush(reset=True, end=True)
    return [x for t in out for x in t.column("name").to_pylist()]


def test_zephons_examples():
    two_to_one = EnsureMixtureOp(mixture={"A": 2, "B": 1}, weight_by="samples")
    assert run(two_to_one, [records("A0 A1 A2 A3 A4 A5 B6 B7 B8")]) == "A0 B6 A1 A2 B7 A3 A4 B8 A5".split()
    even = EnsureMixtureOp(mixture={"A": 1, "B": 1}, weight_by="samples")
    assert run(even, [records("B0 B1 A2 A3")]) == "A2 B0 A3 B1".split()
    by_tokens = EnsureMixtureOp(mixture={"A": 1, "B": 1})
    got = run(by_tokens, [records("A0 A1 A2 B3 B4 B5 B6 B7 B8", {"A": 4, "B": 1})])
    assert got == "A0 B3 B4 B5 B6 A1 B7 B8 A2".split()


def test_one_row_per_frame_gives_the_same_order():
    op = EnsureMixtureOp(mixture={"A": 2, "B": 1}, weight_by="samples", max_buffer_size=4)
    table = records("A0 A1 A2 A3 A4 A5 A6 B7 A8 B9 A10 A11")
    assert run(op, [table.slice(i, 1) for i in range(table.num_rows)]) == run(op, [table])


def test_a_full_buffer_drains_with_what_it_has_and_strict_mode_drops():
    op = EnsureMixtureOp(mixture={"A": 1, "B": 1}, weight_by="samples", max_buffer_size=5, drain_target_ratio=0.6)
    acc = op.lane_accumulator(CTX)
    out = [x for t in acc.push(records("A0 A1 A2 A3 A4 A5 A6")) for x in t.column("name").to_pylist()]
    assert out[:2] == ["A0", "A1"]  # forced out at 5 waiting, down to 3
    strict = EnsureMixtureOp(mixture={"A": 1, "B": 1}, weight_by="samples", max_buffer_size=None)
    acc = strict.lane_accumulator(CTX)
    got = [x for t in acc.push(records("A0 A1 A2 A3 B4")) for x in t.column("name").to_pylist()]
    assert acc.flush(reset=True) == []
    assert got == ["A0", "B4", "A1"] and acc.ctx.stats["ensure_mixture_dropped"] == 2
    # noted for the end of the pass (zephon_columnar.losses), worded with its counters there
    [notice] = [n for n in acc.ctx.notices.noted() if n.kind == "ensure_mixture_dropped"]
    said = said_of(notice, acc.ctx.stats, "in lane 0")
    assert notice.category is MixtureDropWarning and "dropped 2 row(s) in lane 0" in said.message


def _skewed():
    rng = np.random.default_rng(3)
    short = [list(range(int(n))) for n in rng.integers(5, 20, 800)]     # many short documents
    long = [list(range(int(n))) for n in rng.integers(150, 400, 200)]   # few long ones
    return (Dataset.from_tables("short", [pa.table({"input_ids": pa.array(short, pa.list_(pa.int32()))})]),
            Dataset.from_tables("long", [pa.table({"input_ids": pa.array(long, pa.list_(pa.int32()))})]))


def token_shares(pipe, batches: int, window: int) -> list[float]:
    """The long component's share of tokens in consecutive windows of ``window`` batches."""
    shares, tok = [], np.zeros(2)
    it = iter(pipe)
    for i in range(batches):
        b = next(it)
        comp = b.table.column(F.COMPONENT).to_numpy()
        lens = np.array([len(x) for x in b.table.column("input_ids").to_pylist()])
        tok += [lens[comp == 0].sum(), lens[comp == 1].sum()]
        if (i + 1) % window == 0:
            shares.append(tok[1] / tok.sum())
            tok[:] = 0
    it.close()
    return shares


def skewed_pipe(weights, **ensure):
    ws = StaticMixtureWorkSource(list(_skewed()), weights, chunk_size=64, seed=2,
                                 exhausted_policy="repeat")
    pipe = Pipeline(ws)
    if ensure:
        pipe = pipe.ensure_mixture(mixture={"short": 0.5, "long": 0.5}, **ensure)
    return pipe.batch(4).options(runner="inline", flush_every_k_chunks=8)


def test_token_share_converges_to_the_target_on_a_skewed_corpus():
    # Long documents hold ~22x the tokens of short ones; the source mixes by samples so that tokens
    # are 50/50 only on average: the arrivals are lumpy, ensure_mixture smooths them.
    weights = {"short": 0.956, "long": 0.044}
    held = np.array(token_shares(skewed_pipe(weights, max_buffer_size=1000), 800, 25))
    free = np.array(token_shares(skewed_pipe(weights), 800, 25))
    assert abs(held.mean() - 0.5) < 0.02  # converges to the target
    assert np.abs(held - 0.5).mean() < 0.7 * np.abs(free - 0.5).mean()  # and holds it closer


def test_strict_mode_holds_the_target_even_when_the_supply_does_not():
    with pytest.warns(UserWarning, match="dropped"):
        shares = token_shares(skewed_pipe({"short": 0.5, "long": 0.5}, max_buffer_size=None), 300, 100)
    assert all(abs(s - 0.5) < 0.02 for s in shares), shares


def test_resume_is_exact():
    def make():
        ws = StaticMixtureWorkSource(list(_skewed()), {"short": 0.5, "long": 0.5}, chunk_size=16, seed=2)
        return (Pipeline(ws).ensure_mixture(max_buffer_size=20).batch(3, drop_last=False)
                .options(runner="inline", canonical_replicas=2, flush_every_k_chunks=3))

    full = collect(make())
    assert_resumes_exactly(make, ks=[0, 1, 7, 33, len(full) - 1])


def _redistributing(max_buffer_size, mixture, runner="inline", shuffle=False):
    small, large = (Dataset.from_tables(name, [pa.table({"value": list(range(base, base + n))})])
                    for name, base, n in (("small", 0, 12), ("large", 1000, 90)))
    ws = StaticMixtureWorkSource([small, large], {"small": 0.5, "large": 0.5}, chunk_size=6, seed=1,
                                 exhausted_policy="redistribute", shuffle_shards=False)
    pipe = Pipeline(ws)
    if shuffle:
        pipe = pipe.shuffle(buffer_size=7, seed=4)
    return (pipe.ensure_mixture(weight_by="samples", max_buffer_size=max_buffer_size, mixture=mixture)
            .batch(4, drop_last=False).options(runner=runner, canonical_replicas=2, flush_every_k_chunks=2))


@pytest.mark.parametrize("mixture", [None, {"small": 0.5, "large": 0.5}])
@pytest.mark.parametrize("shuffle", [False, True])
def test_a_component_the_source_goes_on_without_leaves_the_target_once_it_ran_out(mixture, shuffle):
    # 'redistribute': once "small" has run out, the exact mixture stops holding "large" back for
    # it (a stated mixture= included), so no row of "large" is dropped.
    values = [r.payload["value"] for b in _redistributing(None, mixture, shuffle=shuffle) for r in b.records]
    assert sorted(v for v in values if v >= 1000) == list(range(1000, 1090))
    assert len(values) == len(set(values))


@pytest.mark.parametrize("runner", ["inline", "threads"])
@pytest.mark.parametrize("max_buffer_size", [None, 5])
def test_exhaustion_resumes_exactly(runner, max_buffer_size):
    assert_resumes_exactly(lambda: _redistributing(max_buffer_size, {"small": 0.5, "large": 0.5}, runner,
                                                   shuffle=True), ks=[0, 1, 4, 9, 15])


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_buffer_size=0), "max_buffer_size=0"),
    (dict(drain_target_ratio=1.0), "drain_target_ratio"),
    (dict(obsolete_drain_rate=2), "obsolete_drain_rate"),
    (dict(warn_tolerance=0), "warn_tolerance"),
    (dict(weight_by=3), "weight_by"),
    (dict(mixture={"a": -1}), "mixture"),
])
def test_argument_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        EnsureMixtureOp(**kwargs)
