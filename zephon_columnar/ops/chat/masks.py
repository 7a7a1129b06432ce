"""Which messages get loss (`select_messages`), the no-template path's tokens (`concat_messages`),
and supervised character spans turned into a per-token loss mask (`spans_to_token_mask`).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from zephon_columnar.ops.tokenize.handle import TokenizerHandle


def select_messages(
    is_assistant: npt.NDArray[np.bool_], is_user: npt.NDArray[np.bool_], offsets: np.ndarray, scope: str
) -> npt.NDArray[np.bool_]:
    """Which messages get loss under ``scope`` (flat over the frame's messages; vectorized)."""
    if scope == "all_assistant":
        selected: npt.NDArray[np.bool_] = is_assistant.copy()
        return selected
    m = len(is_assistant)
    n = len(offsets) - 1
    if scope == "last_span":
        asst = np.flatnonzero(is_assistant)
        out = np.zeros(m, bool)
        if len(asst):
            idx = np.searchsorted(asst, offsets[1:], side="left") - 1
            cand = asst[np.maximum(idx, 0)]
            ok = (idx >= 0) & (cand >= offsets[:-1])
            out[cand[ok]] = True
        return out
    if scope == "after_last_user":
        users = np.flatnonzero(is_user)
        last = offsets[:-1] - 1  # no user message: every assistant message counts
        if len(users):
            idx = np.searchsorted(users, offsets[1:], side="left") - 1
            cand = users[np.maximum(idx, 0)]
            last = np.where((idx >= 0) & (cand >= offsets[:-1]), cand, last)
        row = np.repeat(np.arange(n), np.diff(offsets))
        return is_assistant & (np.arange(m) > last[row])
    raise ValueError(f"unknown loss scope {scope!r}")


def concat_messages(
    handle: TokenizerHandle,
    contents: pa.Array,
    offsets: np.ndarray,
    is_assistant: np.ndarray,
    selected: np.ndarray,
    eos_id: int | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The no-template path: every message's content tokenized in one batched call, concatenated
    per row, ``eos_id`` after each assistant message; mask 1 on the selected messages' tokens
    (their EOS included). Vectorized scatter, no per-token Python."""
    flat, msg_off = handle.encode_ids(contents.to_pylist(), add_special_tokens=False)
    tok_len = np.diff(msg_off)
    eos = is_assistant if eos_id is not None else np.zeros(len(tok_len), bool)
    out_len = tok_len + eos
    out_off = np.zeros(len(out_len) + 1, np.int64)
    np.cumsum(out_len, out=out_off[1:])
    ids = np.empty(int(out_off[-1]), np.int32)
    dest = np.arange(len(flat), dtype=np.int64) + np.repeat(out_off[:-1] - msg_off[:-1], tok_len)
    ids[dest] = flat
    if eos_id is not None:
        ids[out_off[1:][eos] - 1] = eos_id
    mask = np.repeat(selected.astype(np.int8), out_len)
    return ids, out_off[offsets], mask


def spans_to_token_mask(
    tok_offsets: np.ndarray,
    tok_starts: np.ndarray,
    tok_ends: np.ndarray,
    text_lens: np.ndarray,
    span_rows: np.ndarray,
    span_starts: np.ndarray,
    span_ends: np.ndarray,
) -> npt.NDArray[np.int8]:
    """int8 mask over all tokens of a frame: 1 where a token shares a character with a span of its
    row. Rows are laid end to end (one character apart) in one coordinate space, so one sort and
    one ``searchsorted`` answer every token: a token [a, b) overlaps some span iff the largest end
    among the spans starting before b exceeds a. A zero-width token counts as [a, a+1)."""
    n_tok = len(tok_starts)
    if not n_tok or not len(span_rows):
        return np.zeros(n_tok, np.int8)
    base = np.zeros(len(text_lens) + 1, np.int64)
    np.cumsum(text_lens + 1, out=base[1:])
    tok_rows = np.repeat(np.arange(len(text_lens)), np.diff(tok_offsets))
    a = tok_starts + base[tok_rows]
    b = np.maximum(tok_ends, tok_starts + 1) + base[tok_rows]
    s = span_starts + base[span_rows]
    e = span_ends + base[span_rows]
    nonempty = e > s
    s, e = s[nonempty], e[nonempty]
    if not len(s):
        return np.zeros(n_tok, np.int8)
    order = np.argsort(s, kind="stable")
    s, e = s[order], np.maximum.accumulate(e[order])
    j = np.searchsorted(s, b, side="left") - 1
    hit: npt.NDArray[np.bool_] = (j >= 0) & (e[np.maximum(j, 0)] > a)
    return hit.astype(np.int8)
