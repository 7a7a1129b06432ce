"""memory.buffer_pool: large transient buffers (decoded row groups, packed positions) come from
jemalloc unless the user picked a pool with ARROW_DEFAULT_MEMORY_POOL."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.ops.pack._helpers import docs_table
from zephon_columnar import memory
from zephon_columnar.io import Dataset
from zephon_columnar.io.parquet import ParquetReader
from zephon_columnar.ops.pack import PackFlatOp


def _jemalloc() -> pa.MemoryPool | None:
    try:
        return pa.jemalloc_memory_pool()
    except NotImplementedError:  # a pyarrow built without jemalloc
        return None


@pytest.fixture
def fresh_choice(monkeypatch):
    monkeypatch.setattr(memory, "_POOL", memory._UNSET)
    yield
    memory._POOL = memory._UNSET


def test_jemalloc_by_default(fresh_choice, monkeypatch):
    monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL", raising=False)
    pool = memory.buffer_pool()
    if _jemalloc() is None:
        assert pool is None
    else:
        assert pool is not None and pool.backend_name == "jemalloc"


def test_the_users_pool_choice_wins(fresh_choice, monkeypatch):
    monkeypatch.setenv("ARROW_DEFAULT_MEMORY_POOL", "system")
    assert memory.buffer_pool() is None  # Arrow's default pool, which the variable selects


def test_decoded_row_groups_and_positions_are_allocated_from_it(tmp_path, fresh_choice, monkeypatch):
    monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL", raising=False)
    pool = memory.buffer_pool() or pa.default_memory_pool()
    ids = pa.array([list(range(i, i + 1000)) for i in range(200)], pa.list_(pa.int32()))
    pq.write_table(pa.table({"input_ids": ids}), tmp_path / "a.parquet", row_group_size=50)
    reader = ParquetReader(Dataset.from_path("d", str(tmp_path)))
    before = pool.bytes_allocated()
    table = reader.take(0, np.arange(200))
    assert pool.bytes_allocated() - before >= 200 * 1000 * 4  # the decoded ids live in the pool
    assert table.column("input_ids").to_pylist() == ids.to_pylist()
    del table
    reader.close()

    packer = PackFlatOp(64, algorithm="wrap").lane_accumulator()
    before = pool.bytes_allocated()
    out = packer.push(docs_table([list(range(1, 500))] * 4))
    assert sum(t.num_rows for t in out) == 4 * 499 // 64
    assert pool.bytes_allocated() - before >= sum(t.num_rows for t in out) * 64 * 4  # positions
