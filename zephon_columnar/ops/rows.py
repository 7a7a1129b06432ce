"""Row views for row-wise user code: run a function over `SampleRecord`s of a frame.

The slow-but-general path: Python callables on payload dicts or records. One conversion per
frame each way; the rest of the engine stays columnar.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.errors import WrongTypeError, operator_failure
from zephon_columnar.io.dataset import Dataset
from zephon_columnar.records import (
    SampleRecord,
    check_records,
    frame_of_records,
    payload_dicts,
    payloads_to_table,
    records_of,
)


def keep_lineage(out: pa.Table, had_lineage: bool) -> pa.Table:
    """``out`` with the ``__lineage`` column in canonical form when its input had one.

    Frames rebuilt from records (`frame_of_records`) carry the column only when some record
    has a non-empty path; after a splitting operator every row must have it (``[]`` for an
    uncut row), or whether a delivered batch has the column would depend on which rows shared
    a frame. An input without the column gets none, as before."""
    if not had_lineage:
        return out
    if F.LINEAGE not in out.column_names:
        # Where frames that have it keep it (after the source bookkeeping, as
        # `F.with_children` and `frame_of_records` put it), not appended after the payload.
        at = out.column_names.index(F.COMPONENT) + 1 if F.COMPONENT in out.column_names else out.num_columns
        out = out.add_column(at, F.LINEAGE, F.lineage_array(out))
    return F.with_lineage_column(out)


def payload_rows(frame: pa.Table) -> list[dict[str, Any]]:
    """The payload of each row, its values as records hold them."""
    payload = F.payload_of(frame)
    return payload_dicts(payload, payload.column_names)


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
    """Where row ``i`` of a frame came from, for error messages (by dataset and shard id: an
    operator does not know the datasets; `name_samples` names them where the error surfaces)."""

    def get(col: str) -> Any:
        return frame.column(col)[i].as_py()

    return (
        f"sample (dataset {get(F.DATASET)}, shard {get(F.SHARD)}, row {get(F.ROW)}) "
        f"at lane {get(F.LANE)}, chunk {get(F.CHUNK)}, offset {get(F.OFFSET)}"
    )


_SAMPLE = re.compile(r"sample \(dataset (\d+), shard (\d+), row (\d+)\)")


def name_samples(err: BaseException, datasets: Mapping[int, Any]) -> None:
    """Name the dataset and shard file of each `sample_of` location in ``err``'s message, in
    place (the engine calls it where an operator's error leaves the run, knowing the datasets).

    Example:
        >>> err = ValueError("failed on sample (dataset 0, shard 1, row 7) at lane 0")
        >>> name_samples(err, {0: Dataset.from_path("web", "data/web")})
        >>> str(err)  # doctest: +ELLIPSIS
        "failed on sample (dataset 'web', shard .../data/web/part-001.parquet (1), row 7) at lane 0"
    """

    def named(found: re.Match[str]) -> str:
        dataset = datasets.get(int(found[1]))
        if not isinstance(dataset, Dataset):
            return found[0]
        return f"sample (dataset {dataset.name!r}, {dataset.shard_label(int(found[2]))}, row {found[3]})"

    if err.args and isinstance(err.args[0], str) and _SAMPLE.search(err.args[0]):
        err.args = (_SAMPLE.sub(named, err.args[0]), *err.args[1:])


def run_payload_fn(
    frame: pa.Table, fn: Callable[[dict[str, Any]], Any], *, op_name: str, drop_none: bool = True
) -> pa.Table:
    """Apply ``fn(payload) -> payload | None`` to each row; None drops the row (with
    ``drop_none=False``: keeps it unchanged)."""
    keep: list[int] = []
    outs: list[dict[str, Any]] = []
    for i, row in enumerate(payload_rows(frame)):
        try:
            out = fn(row)
        except Exception as err:
            raise operator_failure(
                err, f"map_transform function {op_name!r} failed on {sample_of(frame, i)}: {type(err).__name__}: {err}"
            ) from err
        if out is None:
            if drop_none:
                continue
            out = row
        if not isinstance(out, dict):
            raise WrongTypeError(
                f"map_transform function {op_name!r} returned a {type(out).__name__} for {sample_of(frame, i)}; "
                "return a payload dict, or None to drop the row."
            )
        keep.append(i)
        outs.append(out)
    return rebuild(frame, keep, outs, op_name=op_name)


def run_rows(frame: pa.Table, fn: Callable[[list[SampleRecord]], Any], *, op_name: str) -> pa.Table:
    """Apply a records-in, records-out function to the frame's rows; output rows are built from
    the meta they carry (tombstones are dropped rows)."""
    outs = check_records(fn(records_of(frame)), op_name=op_name)
    had_lineage = F.LINEAGE in frame.column_names
    if not outs or all(r.meta.tombstone for r in outs):
        return keep_lineage(frame.slice(0, 0).select(F.bookkeeping_of(frame).column_names), had_lineage)
    return keep_lineage(frame_of_records(outs, op_name=op_name), had_lineage)
