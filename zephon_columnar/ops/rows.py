"""Row views for row-wise user code: run a function over `SampleRecord`s of a frame.

The slow-but-general path: Python callables on payload dicts or records. One conversion per
frame each way; the rest of the engine stays columnar.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.errors import PipelineError
from zephon_columnar.types import SampleRecord, records_of


def payload_rows(frame: pa.Table) -> list[dict[str, Any]]:
    return F.payload_of(frame).to_pylist()


def rebuild(frame: pa.Table, keep: Sequence[int], payloads: list[dict[str, Any]], *, op_name: str) -> pa.Table:
    """Frame of rows ``keep`` of ``frame`` (their bookkeeping) with new ``payloads``."""
    book = F.bookkeeping_of(frame)
    if len(keep) != frame.num_rows:
        book = book.take(pa.array(np.asarray(keep, dtype=np.int64), pa.int64()))
    if not payloads:
        return book
    try:
        payload = pa.Table.from_pylist(payloads)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise PipelineError(
            f"operator {op_name!r} returned payloads Arrow cannot hold in one column type ({err}). "
            "Return the same type for a field in every row."
        ) from err
    if payload.num_columns == 0:
        return book
    return F.with_payload(book, payload)


def run_payload_fn(frame: pa.Table, fn: Callable[[dict[str, Any]], Any], *, op_name: str) -> pa.Table:
    """Apply ``fn(payload) -> payload | None`` to each row; None drops the row."""
    keep: list[int] = []
    outs: list[dict[str, Any]] = []
    for i, row in enumerate(payload_rows(frame)):
        out = fn(row)
        if out is None:
            continue
        if not isinstance(out, dict):
            raise PipelineError(
                f"map_transform function {op_name!r} returned a {type(out).__name__} for row {i}; "
                "return a payload dict, or None to drop the row."
            )
        keep.append(i)
        outs.append(out)
    return rebuild(frame, keep, outs, op_name=op_name)


def run_rows(frame: pa.Table, fn: Callable[[list[SampleRecord]], list[SampleRecord]], *, op_name: str) -> pa.Table:
    """Apply a records-in, records-out function; output rows keep the meta they carry."""
    records = records_of(frame)
    outs = fn(records)
    if not isinstance(outs, list) or any(not isinstance(r, SampleRecord) for r in outs):
        raise PipelineError(
            f"operator {op_name!r}: process_many must return a list of SampleRecord "
            "(rebuild record.payload and return the record that carried it), not dicts or tensors."
        )
    from zephon_columnar.types import _table_from_records

    if not outs:
        return frame.slice(0, 0).select(F.bookkeeping_of(frame).column_names)
    table = _table_from_records(outs)
    # Restore the per-row lane and chunk ids the records carry.
    lanes = pa.array(np.array([r.meta.lane_id for r in outs], np.int32))
    chunks = pa.array(np.array([r.meta.chunk_id for r in outs], np.int64))
    table = table.set_column(table.column_names.index(F.LANE), F.LANE, lanes)
    return table.set_column(table.column_names.index(F.CHUNK), F.CHUNK, chunks)
