"""FetchOp: pointers in, the right payload rows out, in pointer order."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from zephon_columnar import Dataset
from zephon_columnar import frame as F
from zephon_columnar.ops.base import OpContext
from zephon_columnar.ops.fetch import FetchOp

A = Dataset.from_tables("a", [pa.table({"v": [f"a{s}-{i}" for i in range(50)]}) for s in range(3)])
B = Dataset.from_tables("b", [pa.table({"v": [f"b{s}-{i}" for i in range(30)], "extra": list(range(30))})
                              for s in range(2)])


def fetch(pointers: np.ndarray) -> pa.Table:
    op = FetchOp()
    op.setup(OpContext(services={"datasets_by_id": {0: A, 1: B}}))
    frame = F.pointer_frame(lane=0, chunk_id=0, offsets=np.arange(len(pointers)), pointers=pointers,
                            components=pointers[:, 0].astype(np.int32))
    return op.process_frame(frame)


def expected(pointers: np.ndarray) -> list[str]:
    return [f"{'ab'[d]}{s}-{i}" for d, s, i in pointers.tolist()]


@pytest.mark.parametrize("seed", range(5))
def test_random_pointers_across_datasets_and_shards(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    d = rng.integers(0, 2, n)
    s = np.where(d == 0, rng.integers(0, 3, n), rng.integers(0, 2, n))
    i = np.where(d == 0, rng.integers(0, 50, n), rng.integers(0, 30, n))
    ptrs = np.stack([d, s, i], axis=1)
    out = fetch(ptrs)
    assert out.column("v").to_pylist() == expected(ptrs)
    # Bookkeeping is carried through unchanged and the missing column of dataset a is null.
    assert out.column(F.ROW).to_pylist() == i.tolist()
    extra = out.column("extra").to_pylist()
    assert all((e is None) == (dd == 0) for e, dd in zip(extra, d.tolist()))


def test_long_runs_are_read_in_place():
    ptrs = np.array([[0, 2, k] for k in range(10, 40)] + [[0, 0, k] for k in range(5)])
    assert fetch(ptrs).column("v").to_pylist() == expected(ptrs)


def test_empty_frame():
    assert fetch(np.zeros((0, 3), np.int64)).num_rows == 0


@pytest.mark.parametrize(
    "ptrs",
    [[[0, 0, 1]], [[1, 0, 1]], [[1, 1, 2], [0, 0, 3]], [[0, 2, 4], [1, 0, 5]]],
    ids=["a-alone", "b-alone", "b-then-a", "a-then-b"],
)
def test_every_frame_of_a_mixture_has_the_union_of_its_fields_in_one_order(ptrs):
    # A row's columns must not depend on which rows shared its frame (else a restore, which
    # frames rows differently, changes them): a frame of dataset a's rows alone still carries
    # b's "extra" (null), and the order is the datasets', not the frame's first rows'.
    out = fetch(np.array(ptrs))
    assert F.payload_names(out) == ["v", "extra"]
    assert out.schema.field("extra").type == pa.int64()
    assert out.column("extra").to_pylist() == [i if d == 1 else None for d, _, i in ptrs]


def test_datasets_with_the_same_fields_are_left_as_read():
    op = FetchOp()
    op.setup(OpContext(services={"datasets_by_id": {0: A, 1: A}}))
    frame = F.pointer_frame(lane=0, chunk_id=0, offsets=np.arange(1), pointers=np.array([[1, 0, 0]]),
                            components=np.array([1], np.int32))
    assert F.payload_names(op.process_frame(frame)) == ["v"]
