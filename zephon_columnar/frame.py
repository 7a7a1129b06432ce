"""The frame: the unit that flows between operators.

A frame is a ``pyarrow.Table`` (its chunks are record batches) holding the payload columns
plus reserved bookkeeping columns whose names start with ``__``. Bookkeeping says, per row,
which lane and chunk the row came from and which source sample it is; operators read and
write payload columns and carry bookkeeping through untouched (a filter keeps the rows it
keeps, bookkeeping included).

Example:
    >>> import numpy as np
    >>> f = pointer_frame(lane=0, chunk_id=3, offsets=np.arange(2), pointers=np.array([[0, 1, 5], [0, 1, 6]]),
    ...                   components=np.zeros(2, np.int32))
    >>> f.column_names[:3]
    ['__lane', '__chunk', '__offset']
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

LANE = "__lane"
CHUNK = "__chunk"
OFFSET = "__offset"
DATASET = "__dataset"
SHARD = "__shard"
ROW = "__row"
COMPONENT = "__component"

BOOKKEEPING: tuple[str, ...] = (LANE, CHUNK, OFFSET, DATASET, SHARD, ROW, COMPONENT)
BOOKKEEPING_SCHEMA = pa.schema(
    [
        (LANE, pa.int32()),
        (CHUNK, pa.int64()),
        (OFFSET, pa.int32()),
        (DATASET, pa.int32()),
        (SHARD, pa.int32()),
        (ROW, pa.int64()),
        (COMPONENT, pa.int32()),
    ]
)


def is_bookkeeping(name: str) -> bool:
    return name.startswith("__")


def pointer_frame(
    *, lane: int, chunk_id: int, offsets: np.ndarray, pointers: np.ndarray, components: np.ndarray
) -> pa.Table:
    """A frame of bookkeeping only: the sample pointers that fetch turns into payload rows.

    ``pointers`` is an (n, 3) int64 array of (dataset_id, shard_id, row).
    """
    n = len(offsets)
    arrays = [
        pa.array(np.full(n, lane, np.int32)),
        pa.array(np.full(n, chunk_id, np.int64)),
        pa.array(np.asarray(offsets, np.int32)),
        pa.array(np.ascontiguousarray(pointers[:, 0], np.int32)),
        pa.array(np.ascontiguousarray(pointers[:, 1], np.int32)),
        pa.array(np.ascontiguousarray(pointers[:, 2], np.int64)),
        pa.array(np.asarray(components, np.int32)),
    ]
    return pa.Table.from_arrays(arrays, schema=BOOKKEEPING_SCHEMA)


def payload_names(frame: pa.Table) -> list[str]:
    return [n for n in frame.column_names if not is_bookkeeping(n)]


def bookkeeping_of(frame: pa.Table) -> pa.Table:
    return frame.select([n for n in frame.column_names if is_bookkeeping(n)])


def payload_of(frame: pa.Table) -> pa.Table:
    return frame.select(payload_names(frame))


def with_payload(bookkeeping: pa.Table, payload: pa.Table) -> pa.Table:
    """Bookkeeping columns followed by payload columns (same number of rows)."""
    if bookkeeping.num_rows != payload.num_rows:
        raise ValueError(
            f"payload has {payload.num_rows} rows but bookkeeping has {bookkeeping.num_rows}; "
            "an operator must keep rows aligned with their bookkeeping"
        )
    cols = list(bookkeeping.columns) + list(payload.columns)
    names = list(bookkeeping.column_names) + list(payload.column_names)
    return pa.Table.from_arrays(cols, names=names)


def concat_frames(frames: list[pa.Table]) -> pa.Table:
    """Concatenate frames zero-copy. A column missing or all-null in some frames is filled with
    nulls; a column whose type differs between frames is an error naming it (promoting int to
    float silently would make the column type depend on how rows were grouped)."""
    if len(frames) == 1:
        return frames[0]
    try:
        return pa.concat_tables(frames, promote_options="default")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        types: dict[str, set[str]] = {}
        for f in frames:
            for fld in f.schema:
                types.setdefault(fld.name, set()).add(str(fld.type))
        clash = {k: sorted(v) for k, v in types.items() if len(v) > 1}
        from zephon_columnar.errors import PipelineError

        raise PipelineError(
            f"rows of one lane reached batching with different column types {clash}: an operator "
            "returns different types for the same field in different rows; make it return one type."
        ) from err


def frame_to_ipc(frame: pa.Table) -> pa.Buffer:
    """Serialize a frame as an Arrow IPC stream (what crosses process boundaries)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, frame.schema) as writer:
        writer.write_table(frame)
    return sink.getvalue()


def frame_from_ipc(buf: pa.Buffer | bytes) -> pa.Table:
    return pa.ipc.open_stream(buf).read_all()
