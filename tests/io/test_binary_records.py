"""io/binary_records.py: the offset-indexed record shards MDS and LitData share (their formats'
own tests read files their libraries wrote; these pin the reader's own contract)."""

from __future__ import annotations

import gc
import struct

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_columnar.io.binary_records import RecordFile, RecordLayout, binary_column, list_column


def write_shard(path, payloads: list[bytes]) -> None:
    """A shard of records that are each one length-prefixed bytes column."""
    records = [struct.pack("<I", len(p)) + p for p in payloads]
    first = 4 * (len(records) + 2)
    offsets = np.concatenate(([0], np.cumsum([len(r) for r in records]))) + first
    path.write_bytes(struct.pack(f"<{len(offsets) + 1}I", len(records), *offsets) + b"".join(records))


ONE_BYTES_COLUMN = RecordLayout(sizes=(None,), prefixed=(True,))


@settings(max_examples=40, deadline=None)
@given(
    payloads=st.lists(st.binary(max_size=40), min_size=1, max_size=30),
    picks=st.lists(st.integers(min_value=0), max_size=40),
)
def test_any_rows_in_any_order_read_back_as_written(tmp_path_factory, payloads, picks):
    path = tmp_path_factory.mktemp("shard") / "s.bin"
    write_shard(path, payloads)
    rows = np.array([p % len(payloads) for p in picks], np.int64)
    shard = RecordFile(str(path), str(path), rows=len(payloads))
    (spans,) = shard.spans(rows, ONE_BYTES_COLUMN)
    assert binary_column(shard, spans, pa.binary(), "s.bin").to_pylist() == [payloads[r] for r in rows]
    shard.close()


def test_token_arrays_come_back_as_lists_of_their_dtype(tmp_path):
    docs = [np.arange(n, dtype=np.int32) * 3 for n in (5, 0, 2_000, 1)]
    path = tmp_path / "s.bin"
    write_shard(path, [d.tobytes() for d in docs])
    shard = RecordFile(str(path), str(path))
    (spans,) = shard.spans(np.array([2, 0, 3, 1]), ONE_BYTES_COLUMN)
    column = list_column(shard, spans, np.dtype("<i4"), "s.bin: input_ids")
    assert column.type == pa.list_(pa.int32())
    assert column.to_pylist() == [docs[i].tolist() for i in (2, 0, 3, 1)]


def test_a_chunk_of_rows_is_read_without_setting_off_the_garbage_collector(tmp_path):
    # The loader runs inside the training process, whose young collections can set off full
    # passes over every object torch made; a read must not hold a GC-tracked object per row.
    rows = 5_000  # several times the collector's first threshold (700 net allocations)
    path = tmp_path / "s.bin"
    write_shard(path, [struct.pack("<i", i) * (i % 7) for i in range(rows)])
    shard = RecordFile(str(path), str(path))
    order = np.random.default_rng(0).permutation(rows)
    collections: list[int] = []

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.collect()
    gc.callbacks.append(count)
    try:
        (spans,) = shard.spans(order, ONE_BYTES_COLUMN)
        column = list_column(shard, spans, np.dtype("<i4"), "s.bin")
    finally:
        gc.callbacks.remove(count)
    assert collections == []
    assert column.value_lengths().to_numpy().tolist() == (order % 7).tolist()
