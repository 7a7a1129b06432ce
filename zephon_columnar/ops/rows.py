"""Row views for row-wise user code: run a function over `SampleRecord`s of a frame.

The slow-but-general path: Python callables on payload dicts or records. One conversion per
frame each way; the rest of the engine stays columnar.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.errors import WrongTypeError, operator_failure
from zephon_columnar.types import SampleRecord, records_of


def payload_rows(frame: pa.Table) -> list[dict[str, Any]]:
    return F.payload_of(frame).to_pylist()


def payloads_to_table(payloads: list[dict[str, Any]], *, op_name: str) -> pa.Table:
    """Arrow table of row dicts: the union of their keys (missing values are null), one column
    type per field. Types come from the values alone, never from which rows share a frame, so a
    field whose rows mix Python types (1 and 1.0, "a" and 2) is an error rather than a column type
    that changes with the frame size."""
    names: dict[str, None] = {}
    for p in payloads:
        names.update(dict.fromkeys(p))
    columns = {}
    for name in names:
        values = [p.get(name) for p in payloads]
        kinds = {type(v) for v in values if v is not None}
        if len(kinds) > 1:
            shown = ", ".join(sorted(k.__name__ for k in kinds))
            raise WrongTypeError(f"operator {op_name!r} returned field {name!r} with mixed types ({shown}); "
                                "return the same type for a field in every row (e.g. float(x)).")
        try:
            columns[name] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
            raise WrongTypeError(f"operator {op_name!r} returned field {name!r} with values Arrow cannot "
                                      f"hold in one column ({err}); return the same type for it in every row.") from err
    return pa.table(columns) if columns else pa.table({})


def rebuild(frame: pa.Table, keep: Sequence[int], payloads: list[dict[str, Any]], *, op_name: str) -> pa.Table:
    """Frame of rows ``keep`` of ``frame`` (their bookkeeping) with new ``payloads``."""
    if not payloads:
        # Keep the input's columns so later operators still find them in an empty frame.
        return frame.slice(0, 0)
    book = F.bookkeeping_of(frame)
    if len(keep) != frame.num_rows:
        book = book.take(pa.array(np.asarray(keep, dtype=np.int64), pa.int64()))
    payload = payloads_to_table(payloads, op_name=op_name)
    if payload.num_columns == 0:
        return book
    return F.with_payload(book, payload)


def sample_of(frame: pa.Table, i: int) -> str:
    """Where row ``i`` of a frame came from, for error messages."""
    get = lambda col: frame.column(col)[i].as_py()  # noqa: E731
    return (f"sample (dataset {get(F.DATASET)}, shard {get(F.SHARD)}, row {get(F.ROW)}) "
            f"at lane {get(F.LANE)}, chunk {get(F.CHUNK)}, offset {get(F.OFFSET)}")


def run_payload_fn(frame: pa.Table, fn: Callable[[dict[str, Any]], Any], *, op_name: str) -> pa.Table:
    """Apply ``fn(payload) -> payload | None`` to each row; None drops the row."""
    keep: list[int] = []
    outs: list[dict[str, Any]] = []
    for i, row in enumerate(payload_rows(frame)):
        try:
            out = fn(row)
        except Exception as err:
            raise operator_failure(err, f"map_transform function {op_name!r} failed on {sample_of(frame, i)}: "
                                        f"{type(err).__name__}: {err}") from err
        if out is None:
            continue
        if not isinstance(out, dict):
            raise WrongTypeError(
                f"map_transform function {op_name!r} returned a {type(out).__name__} for {sample_of(frame, i)}; "
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
        raise WrongTypeError(
            f"operator {op_name!r}: process_many must return a list of SampleRecord "
            "(rebuild record.payload and return the record that carried it), not dicts or tensors."
        )
    from zephon_columnar.types import _table_from_records

    if not outs:
        return frame.slice(0, 0).select(F.bookkeeping_of(frame).column_names)
    return _table_from_records(outs)
