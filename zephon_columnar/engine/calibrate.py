"""Priming a token-unit mixture: count the tokens of each dataset's calibration rows with the
pipeline's own operators.

The rows (`StaticMixtureWorkSource.calibration_pointers`) are fetched, run through the
stateless operators before the first tokenizer (maps, filters, ``decode_text``, and user
operators whose traits say ``calibration_replayable``; reordering stages change no row and are
skipped), then tokenized; a row's count is the length of every ``input_ids`` row it became
(0 when a filter dropped it). With ``TokenEstimation(measure=...)`` the callable counts each
transformed payload instead of the tokenizer. A pipeline without a tokenizer reads pretokenized
data: a row's count is the length of its token array, the first integer-list field of
``types.TOKEN_FIELD_CANDIDATES``; a dataset without one gets the fallback ratio.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from zephon_columnar import frame as F
from zephon_columnar.ops.base import BaseOp, FrameOp, OpContext
from zephon_columnar.ops.fetch import FetchOp
from zephon_columnar.ops.tokenize.owner import TokenizerOwner
from zephon_columnar.types import TOKEN_FIELD_CANDIDATES
from zephon_columnar.work.base import WorkSource
from zephon_columnar.work.static_mixture import StaticMixtureWorkSource

if TYPE_CHECKING:
    from zephon_columnar.work.token_estimation import TokenEstimation


def prime_token_mixture(ws: WorkSource, ops: Sequence[BaseOp]) -> None:
    """Prime ``ws`` (a no-op unless it ``requires_token_priming``) with the token counts of its
    calibration rows under ``ops`` (the pipeline's operators, fetch first)."""
    if not ws.requires_token_priming:
        return
    if not isinstance(ws, StaticMixtureWorkSource):
        ws.prime()  # another work source: it primes itself
        return
    est = ws.token_estimation
    assert est is not None
    replay, tokenizer = _calibration_ops(ops)
    ctx = OpContext(services={"datasets_by_id": ws.datasets_by_id})
    fetch = FetchOp()
    stages = [op.clone() for op in replay] + (
        [tokenizer.clone()] if tokenizer is not None and est.measure is None else []
    )
    for op in [fetch, *stages]:
        op.setup(ctx)
    try:
        counted = {k: _count(pointers, fetch, stages, est) for k, pointers in ws.calibration_pointers().items()}
    finally:
        for op in [fetch, *stages]:
            op.teardown()
    ws.prime({k: c for k, c in counted.items() if c is not None})  # the others: the fallback, with a warning


def _calibration_ops(ops: Sequence[BaseOp]) -> tuple[list[BaseOp], BaseOp | None]:
    """(the stateless operators to replay before the tokenizer, the first tokenizer or None)."""
    replay: list[BaseOp] = []
    for op in ops:
        if isinstance(op, FetchOp):
            continue
        if isinstance(op, TokenizerOwner):
            return replay, op
        if op.is_ordered():
            continue  # shuffles, mixture buffers: they reorder rows, never change one
        if (isinstance(op, FrameOp) and op.builtin) or op.traits().calibration_replayable:
            replay.append(op)
    return replay, None


def _count(pointers: np.ndarray, fetch: FetchOp, stages: list[BaseOp], est: TokenEstimation) -> np.ndarray | None:
    """Tokens of each calibration row (int64, one per pointer); None when there is nothing to
    count them with (no tokenizer, no ``measure``, no token array)."""
    n = len(pointers)
    frame = F.pointer_frame(lane=0, chunk_id=0, offsets=np.arange(n), pointers=pointers, components=pointers[:, 0])
    frame = fetch.process_frame(frame)
    for op in stages:
        frame = op.process_frame(frame)
    offsets = np.asarray(frame.column(F.OFFSET).to_numpy(), dtype=np.int64)
    if est.measure is not None:
        rows = frame.select(F.payload_names(frame)).to_pylist()
        lengths = np.array([int(est.measure(row)) for row in rows], np.int64)
    else:
        field = next((name for name in TOKEN_FIELD_CANDIDATES if _is_token_array(frame, name)), None)
        if field is None:
            return None
        lengths = _list_lengths(frame.column(field))
    return np.bincount(offsets, weights=lengths, minlength=n).astype(np.int64)


def _list_lengths(column: pa.ChunkedArray | Any) -> np.ndarray:
    return np.asarray(pc.list_value_length(column).fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)


def _is_token_array(frame: pa.Table, name: str) -> bool:
    if name not in frame.column_names:
        return False
    kind = frame.schema.field(name).type
    return bool((pa.types.is_list(kind) or pa.types.is_large_list(kind)) and pa.types.is_integer(kind.value_type))
