"""records.py: frames <-> records, and the helpers user operators fan out, pack and drop with."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from zephon_columnar import frame as F
from zephon_columnar.records import (
    ContributorRef,
    SampleCursor,
    SampleMeta,
    SampleRecord,
    frame_of_records,
    pack_meta,
    records_of,
    spawn_child,
    tombstone_meta,
    tombstones_for_record,
)


def sample_frame(n: int = 5) -> pa.Table:
    frame = F.frame_of({"text": [f"t{i}" for i in range(n)], "n": list(range(n)),
                        "ids": [[i] * (i + 1) for i in range(n)]}, lane=1, chunk_id=7, first_row=10)
    return F.with_children(frame, np.arange(n), np.array([-1, 0, -1, 2, -1]))


def test_frame_records_frame_round_trip_keeps_bookkeeping_and_payload():
    frame = sample_frame()
    records = records_of(frame)
    assert [r.meta.cursor for r in records][:2] == [SampleCursor(7, 10, (0, 0, 10), ()),
                                                    SampleCursor(7, 11, (0, 0, 11), (0,))]
    back = frame_of_records(records)
    for name in (F.LANE, F.CHUNK, F.OFFSET, F.DATASET, F.SHARD, F.ROW, F.COMPONENT, "text", "n", "ids"):
        assert back.column(name).to_pylist() == frame.column(name).to_pylist(), name
    assert F.lineage_paths(back) == F.lineage_paths(frame)


def test_cursors_order_by_chunk_offset_and_lineage():
    a = SampleCursor(1, 5, (0, 0, 9))
    assert a < a.child(0) < a.child(1) < SampleCursor(1, 6, (0, 0, 1)) < SampleCursor(2, 0, (0, 0, 0))
    assert SampleCursor.from_key(a.child(3).as_key()) == a.child(3)
    with pytest.raises(ValueError):
        a.child(-1)


def test_spawn_child_extends_lineage_and_only_the_last_child_closes():
    parent = SampleMeta(sample_id=(0, 1, 2), lane_id=0, chunk_id=3, chunk_offset=4)
    kids = [spawn_child(parent, i, is_last_child=i == 2) for i in range(3)]
    assert [k.lineage for k in kids] == [(0,), (1,), (2,)]
    assert [k.contributors[0].is_last_child for k in kids] == [False, False, True]
    grandkid = spawn_child(kids[0], 5)  # a child of a child keeps the first one's contributor, open
    assert grandkid.lineage == (0, 5) and not grandkid.contributors[0].is_last_child
    with pytest.raises(ValueError, match="tombstone"):
        spawn_child(parent.with_tombstone(), 0, is_last_child=True)


def test_tombstones_are_dropped_rows():
    records = records_of(sample_frame())
    dropped = tombstones_for_record(records[1])
    assert len(dropped) == 1 and dropped[0].meta.tombstone and dropped[0].payload is None
    frame = frame_of_records([records[0]] + dropped + records[2:])
    assert frame.column("n").to_pylist() == [0, 2, 3, 4]
    with pytest.raises(ValueError, match="closing"):
        tombstone_meta(ContributorRef(records[0].meta.cursor, is_last_child=False), lane_id=1)


def test_pack_meta_takes_its_identity_from_the_primary_cursor():
    refs = [ContributorRef(SampleCursor(2, i, (0, 0, i))) for i in range(3)]
    meta = pack_meta(refs[0].cursor, refs, lane_id=1, component_sample_counts={0: 3},
                     tags={"_tombstone": True, "kind": "packed"})
    assert (meta.chunk_id, meta.chunk_offset, meta.sample_id) == (2, 0, (0, 0, 0))
    assert meta.contributors == tuple(refs) and not meta.tombstone and meta.tags["kind"] == "packed"
    assert meta.contribution_cursors() == tuple(r.cursor for r in refs)


def test_a_record_with_no_payload_that_is_not_a_tombstone_is_an_error():
    meta = SampleMeta(sample_id=(0, 0, 0), lane_id=0, chunk_id=0)
    with pytest.raises(TypeError, match="payload"):
        frame_of_records([SampleRecord(meta, None)], op_name="broken")


def test_mixed_value_types_in_a_field_are_an_error_naming_it():
    metas = [SampleMeta(sample_id=(0, 0, i), lane_id=0, chunk_id=0, chunk_offset=i) for i in range(2)]
    with pytest.raises(TypeError, match="'x'.*mixed types"):
        frame_of_records([SampleRecord(metas[0], {"x": 1}), SampleRecord(metas[1], {"x": "one"})], op_name="op")


# ---------------------------------------------------------------- lists of numbers as numpy views
def test_a_list_of_numbers_reaches_a_record_as_a_read_only_view_of_the_column():
    # Zephon gives numpy arrays (user code calls .shape, .dtype, slices without copies).
    ids = pa.array([[1, 2, 3], None, [], [4]], pa.list_(pa.int32()))
    frame = F.frame_of({"input_ids": ids, "score": pa.array([[0.5], [1.5], None, [2.5]], pa.list_(pa.float32()))})
    recs = records_of(frame.slice(1))  # a sliced frame: the views start at its own offsets
    got = [r.payload["input_ids"] for r in recs]
    assert got[0] is None and [a.tolist() for a in got[1:]] == [[], [4]]
    assert all(a.dtype == np.int32 and not a.flags.writeable for a in got[1:])
    flat = frame.column("input_ids").chunk(0).values.buffers()[1]
    assert got[2].__array_interface__["data"][0] == flat.address + 3 * 4  # no copy: the 4th value
    assert recs[0].payload["score"].dtype == np.float32 and recs[1].payload["score"] is None


def test_a_list_holding_a_null_stays_a_python_list():
    frame = F.frame_of({"v": pa.array([[1, None], [2]], pa.list_(pa.int64()))})
    assert [r.payload["v"] for r in records_of(frame)] == [[1, None], [2]]


def test_records_with_arrays_and_edited_lists_go_back_to_one_list_column():
    frame = F.frame_of({"input_ids": pa.array([[1, 2], [3], [5]], pa.list_(pa.int32()))})
    recs = records_of(frame)
    recs[1].payload = {"input_ids": [3, 4]}  # an operator rebuilt one row as a list
    recs[2].payload = {"input_ids": None}
    col = frame_of_records(recs).column("input_ids")
    assert col.type == pa.list_(pa.int32()) and col.to_pylist() == [[1, 2], [3, 4], None]
    recs[1].payload = {"input_ids": [3.5]}  # a value the arrays' dtype cannot hold
    with pytest.raises(TypeError, match="input_ids"):
        frame_of_records(recs)


def test_values_keep_the_kind_their_source_gave_them():
    # As in Zephon: lists of numbers read from the data are numpy arrays; tokenize's ids and what
    # a Python function returned stay Python lists, through later operators too.
    from zephon_columnar import Pipeline, StaticMixtureWorkSource
    from zephon_columnar.io import Dataset, InMemoryShard

    ds = Dataset.from_dict("d", {0: InMemoryShard([{"text": f"a b {i}", "v": [i, i + 1]} for i in range(4)])})
    seen: list[dict] = []

    def look(payload):
        seen.append({k: type(v) for k, v in payload.items()})
        return {**payload, "w": [len(payload["input_ids"])]}

    pipe = (Pipeline(StaticMixtureWorkSource([ds], {"d": 1.0}, chunk_size=2))
            .tokenize(tokenizer_id="__fallback__", field="text", preserve_upstream_payload=True)
            .map_transform(look).map_transform(lambda p: p))
    records = list(pipe)
    assert seen and all(s["v"] is np.ndarray and s["input_ids"] is list for s in seen)
    for r in records:
        kinds = {k: type(v) for k, v in r.payload.items()}
        assert kinds["v"] is np.ndarray and kinds["input_ids"] is list and kinds["w"] is list
