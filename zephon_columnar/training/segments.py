"""Sequence boundaries (``cu_seqlens``, ``max_seqlen``) from segment starts, shared by both
conversion paths.

Contract: `_segment_bounds` turns a (B, S) mask of segment starts into int32 cumulative
boundaries and the longest segment, per row or over the flattened batch; `_NEEDS_POSITIONS` is
the error either path raises when ``return_cu_seqlens`` has no ``positions`` to read the
boundaries from.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_NEEDS_POSITIONS = (
    "to_training: return_cu_seqlens requires a 'positions' field in every payload (the document "
    "boundaries); pack with pack_flat(emit_positions=True), or drop return_cu_seqlens."
)


def _segment_bounds(starts: np.ndarray, flatten: bool) -> tuple[np.ndarray, Any]:
    """int32 cumulative segment boundaries from a (B, S) bool mask of segment starts, and the
    longest segment: per row ((B, K) boundaries padded with S, and (B,) int32 maxima), or over
    the flattened batch ((N + 1,) boundaries and a Python int). Vectorized: one scatter.

    Example:
        >>> starts = np.array([[True, False, True], [True, False, False]])
        >>> cu, longest = _segment_bounds(starts, False)
        >>> cu.tolist(), longest.tolist(), _segment_bounds(starts, True)[0].tolist()
        ([[0, 2, 3], [0, 3, 3]], [2, 3], [0, 2, 3, 6])
    """
    b, s = starts.shape
    if flatten:
        cu = np.append(np.flatnonzero(starts.reshape(-1)), b * s).astype(np.int32)
        return cu, int(np.diff(cu).max(initial=0))
    counts = starts.sum(axis=1)
    cu = np.full((b, int(counts.max(initial=0)) + 1), s, dtype=np.int32)
    rows, cols = np.nonzero(starts)  # row-major: each row's starts in order
    cu[rows, np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)] = cols
    return cu, np.diff(cu, axis=1).max(axis=1, initial=0).astype(np.int32)
