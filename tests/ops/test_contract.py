"""The contract of every built-in ordered stage (zephon_columnar.ops.accumulators): output rows do
not depend on how the input is cut into frames, reset is fresh, and the by-reference state
rebuilds the same accumulator."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tests.ops.pack._helpers import docs_table
from zephon_columnar.ops.accumulators.lane import LaneContext, restorable_by_reference
from zephon_columnar.ops.ensure_mixture import EnsureMixtureOp
from zephon_columnar.ops.pack import PackFlatOp
from zephon_columnar.ops.shuffle import ShuffleOp
from zephon_columnar.ops.stateful import StatefulTransformOp
from zephon_columnar.testing import assert_frame_split_invariant

CTX = LaneContext(lane=1, seed=3, component_names={0: "a", 1: "b"})


def _docs() -> pa.Table:
    rng = np.random.default_rng(5)
    lengths = rng.integers(0, 40, 90)
    docs, nxt = [], 0
    for n in lengths:
        docs.append(list(range(nxt, nxt + int(n))))
        nxt += int(n)
    table = docs_table(docs)
    comps = pa.array((np.arange(len(docs)) % 3 == 0).astype(np.int32))
    return table.set_column(table.column_names.index("__component"), "__component", comps)


def _keep(state, items):
    return state + len(items), [r for r in items if r.payload["doc_id"] % 3]


OPS = {
    "shuffle streaming": lambda: ShuffleOp(16, seed=2),
    "shuffle block": lambda: ShuffleOp(16, seed=2, algorithm="block"),
    "shuffle block_warmup": lambda: ShuffleOp(16, seed=2, algorithm="block_warmup"),
    "wrap": lambda: PackFlatOp(32, algorithm="wrap"),
    "wrap capped": lambda: PackFlatOp(32, algorithm="wrap", max_sequences_per_bin=2),
    "first_fit": lambda: PackFlatOp(32, algorithm="first_fit", num_bins=3),
    "best_fit fullest": lambda: PackFlatOp(32, algorithm="best_fit", num_bins=3, flush_strategy="fullest"),
    "best_fit_wrap": lambda: PackFlatOp(32, algorithm="best_fit_wrap", candidate_pool_size=4),
    "first_fit shuffle_strategy": lambda: PackFlatOp(32, algorithm="first_fit", num_bins=2, shuffle_strategy="random"),
    "wrap homogeneity": lambda: PackFlatOp(32, algorithm="wrap", homogeneity="full"),
    "ensure_mixture": lambda: EnsureMixtureOp(mixture={"a": 1, "b": 1}, max_buffer_size=6),
    "stateful_transform": lambda: StatefulTransformOp("keep", init_state=int, push=_keep),
}
CUTS = [[1, 2, 3, 5, 8, 13, 21, 34, 55, 89], [45], list(range(1, 90))]


@pytest.mark.parametrize("name", sorted(OPS))
def test_output_does_not_depend_on_frame_cuts(name):
    op = OPS[name]()
    assert_frame_split_invariant(lambda: op.lane_accumulator(CTX), _docs(), cuts=CUTS, flush_at=[30, 61])


@pytest.mark.parametrize("name", sorted(OPS))
def test_reset_is_fresh(name):
    op = OPS[name]()
    docs = _docs()
    used = op.lane_accumulator(CTX)
    used.push(docs.slice(0, 40))
    used.flush(reset=True)
    carried = used.carry()
    fresh = op.lane_accumulator(CTX)
    if carried is not None:
        assert fresh.push(carried) == []
    a = [t.to_pylist() for t in used.push(docs.slice(40)) + used.flush(reset=True, end=True)]
    b = [t.to_pylist() for t in fresh.push(docs.slice(40)) + fresh.flush(reset=True, end=True)]
    assert a == b


@pytest.mark.parametrize("name", sorted(n for n in OPS if n != "stateful_transform"))
def test_state_by_reference_rebuilds_the_same_accumulator(name):
    op = OPS[name]()
    docs = _docs()
    assert restorable_by_reference(op.lane_accumulator(CTX))
    for cut in (7, 33, 60):
        acc = op.lane_accumulator(CTX)
        head = acc.push(docs.slice(0, cut))
        state, refs = acc.snapshot()
        by_key = {(r["__chunk"], r["__offset"]): i for i, r in enumerate(docs.select(["__chunk", "__offset"]).to_pylist())}
        calls = []

        def source(r, schema=None):  # the rows again, from their references, as the engine would compute them
            calls.append(r.num_rows)
            keys = [(c, o) for c, o in zip(r.column("__chunk").to_pylist(), r.column("__offset").to_pylist())]
            return docs.take(pa.array([by_key[k] for k in keys]))

        restored = op.lane_accumulator(CTX)
        restored.restore(state, refs, source)
        rest = restored.push(docs.slice(cut)) + restored.flush(reset=True, end=True)
        whole = acc.push(docs.slice(cut)) + acc.flush(reset=True, end=True)
        assert [t.to_pylist() for t in rest if t.num_rows] == [t.to_pylist() for t in whole if t.num_rows]
        del head
    assert not restorable_by_reference(StatefulTransformOp("keep", init_state=int, push=_keep).lane_accumulator(CTX))


def test_the_lane_context_tells_each_stage_its_lane_seed_and_flush_epoch():
    from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
    from zephon_columnar.ops import OpTraits
    from zephon_columnar.ops.base import OrderedOp

    seen = []

    class Probe(OrderedOp):
        def traits(self):
            return OpTraits(preserves_cursor_order=False)

        def lane_accumulator(self, ctx=None):
            class Acc:
                def push(self, frame):
                    chunks = set(frame.column("__chunk").to_pylist())
                    seen.append((ctx.lane, ctx.seed, ctx.flush_epoch(), chunks))
                    return [frame]

                def flush(self, *, reset, end=False):
                    return []

                def carry(self):
                    return None

            return Acc()

    ds = Dataset.from_tables("d", [pa.table({"x": list(range(40))})])
    pipe = Pipeline(StaticMixtureWorkSource([ds], {"d": 1.0}, chunk_size=4, seed=9))
    pipe._add(Probe())  # noqa: SLF001 - an ordered stage of the engine's own kind
    list(pipe.batch(2).options(runner="inline", canonical_replicas=2, flush_every_k_chunks=2))
    assert {(lane, seed) for lane, seed, _, _ in seen} == {(0, 9), (1, 9)}
    assert all(all(c // 2 == epoch for c in chunks) for _, _, epoch, chunks in seen)
    assert max(epoch for _, _, epoch, _ in seen) == 2
