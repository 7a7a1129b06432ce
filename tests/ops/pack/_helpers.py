"""Helpers for the packing tests: frames of documents, a pure-Python reference packer, and
readers of packed output."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.types import PADDING_LENGTH

INT32 = pa.int32()


def docs_of(lengths: Sequence[int]) -> list[list[int]]:
    """Documents of the given lengths whose tokens count up from 1 (every token unique)."""
    docs, nxt = [], 1
    for n in lengths:
        docs.append(list(range(nxt, nxt + n)))
        nxt += n
    return docs


def mask_of(tokens: Sequence[int]) -> list[int]:
    """A per-token field derived from the tokens, so a test can check it followed them."""
    return [(t * 7 + 3) % 5 + 1 for t in tokens]


def docs_table(docs: Sequence[Sequence[int]], *, first_row: int = 0, lane: int = 0, chunk: int = 0,
               token_type: pa.DataType = INT32, extra: dict[str, Any] | None = None,
               aligned: bool = True) -> pa.Table:
    """A frame with one row per document: bookkeeping (sample id (0, 0, first_row + i)),
    ``input_ids``, an aligned ``loss_mask`` (int8, derived from the tokens) and columns that
    packing drops (``text``, a scalar ``doc_id``)."""
    n = len(docs)
    book = F.pointer_frame(
        lane=lane, chunk_id=chunk, offsets=np.arange(n),
        pointers=np.array([[0, 0, first_row + i] for i in range(n)], dtype=np.int64).reshape(-1, 3),
        components=np.zeros(n, np.int32))
    cols: dict[str, Any] = {"input_ids": pa.array([list(d) for d in docs], pa.list_(token_type))}
    if aligned:
        cols["loss_mask"] = pa.array([mask_of(d) for d in docs], pa.list_(pa.int8()))
    cols["text"] = pa.array([" ".join(map(str, d)) for d in docs])
    cols["doc_id"] = pa.array(range(first_row, first_row + n), pa.int64())
    cols.update(extra or {})
    return F.with_payload(book, pa.table(cols))


def reference_pack(epochs: Sequence[Sequence[Sequence[int]]], max_length: int, pad: int,
                   cap: int | None) -> list[dict[str, Any]]:
    """Wrap packing token by token (the specification, slow and obvious). ``epochs`` are the
    documents between flush points. Each row: tokens, positions, first-token doc index, pad count.

    Uncapped (``cap=None``): flush points change nothing (the partial row is carried across
    them); the final partial row is dropped. Capped: a row also closes after its ``cap``-th
    segment, and the partial row is emitted padded at every flush point and at the end."""
    rows: list[dict[str, Any]] = []
    doc_index = 0
    cur: list[tuple[int, int, int]] = []  # (token, doc index, position)
    segs = 0

    def close() -> None:
        nonlocal cur, segs
        padn = max_length - len(cur)
        rows.append({"tokens": [t for t, _, _ in cur] + [pad] * padn,
                     "positions": [p for _, _, p in cur] + list(range(padn)),
                     "doc": cur[0][1], "pad": padn})
        cur, segs = [], 0

    for docs in epochs:
        for doc in docs:
            if doc:
                segs += 1
                pos = 0
                for t in doc:
                    if len(cur) == max_length:
                        close()
                        segs, pos = 1, 0  # the document continues as the new row's first segment
                    cur.append((t, doc_index, pos))
                    pos += 1
                if len(cur) == max_length or (cap is not None and segs == cap):
                    close()
            doc_index += 1
        if cur and cap is not None:
            close()
    return rows


def wrap_kept(tokens: Sequence[int], max_length: int) -> list[int]:
    """What uncapped wrap keeps of a stream: everything but the final partial row."""
    return list(tokens[: len(tokens) // max_length * max_length])


def packed_rows(tables: Sequence[pa.Table], field: str = "input_ids") -> dict[str, list]:
    """Packed output (several frames) as Python lists per column."""
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return {field: [], "loss_mask": [], "positions": [], F.ROW: [], PADDING_LENGTH: []}
    return pa.concat_tables(tables, promote_options="default").to_pydict()


def real_tokens(rows: dict[str, list], field: str = "input_ids") -> list[int]:
    """The real (unpadded) tokens of packed rows, in order."""
    out: list[int] = []
    for toks, pad in zip(rows[field], rows[PADDING_LENGTH]):
        out.extend(toks[: len(toks) - pad])
    return out
