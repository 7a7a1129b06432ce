"""`SamplePositions`: the samples of a finite chunk stream as one random-access array.

Position ``p`` of a stream of chunks ``0, 1, ...`` (sizes ``s0, s1, ...``) is offset
``p - (s0 + ... + s(g-1))`` of chunk ``g``, in the chunk's read order
(:meth:`~zephon_columnar.work.chunk.WorkChunk.ordered`): exactly the sample a single lane
reads ``p``-th. This is what a map-style dataset indexes (`Pipeline.to_indexable_torch_dataset`).

Looking a position up materializes its chunk (O(chunk size), numpy) and keeps the last few
chunks, so sequential and chunk-local access is O(1) per sample; a uniformly random sampler
over many chunks pays one chunk per lookup (smaller chunks make that cheaper).

Example:
    >>> chunks = [WorkChunk({"a": [(0, 0, 0), (0, 0, 1)]}), WorkChunk({"a": [(0, 1, 0)]})]
    >>> pos = SamplePositions([2, 1], chunks.__getitem__)
    >>> len(pos), pos.locate([2, 0]).pointers.tolist()
    (3, [[0, 1, 0], [0, 0, 0]])
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from zephon_columnar.work.chunk import WorkChunk


class Located(NamedTuple):
    """Where positions point: pointers ``(n, 3)``, each one's component index in its chunk,
    and the chunk index and offset it was read at."""

    pointers: np.ndarray
    components: np.ndarray
    chunks: np.ndarray
    offsets: np.ndarray


class SamplePositions:
    """Random access to the samples of a finite chunk stream.

    Args:
        sizes: samples in each chunk of the stream, in order.
        chunk_at: ``g -> WorkChunk``, the ``g``-th chunk (called under a lock: it need not be
            thread-safe). Must be picklable for loader workers started by spawn.
        cached_chunks: chunks kept materialized (least recently used ones are dropped).
    """

    def __init__(
        self, sizes: Sequence[int] | np.ndarray, chunk_at: Callable[[int], WorkChunk], *, cached_chunks: int = 8
    ) -> None:
        counts = np.asarray(sizes, dtype=np.int64).reshape(-1)
        self._ends = np.cumsum(counts)
        self._starts = self._ends - counts
        self._chunk_at = chunk_at
        self._cached = max(1, int(cached_chunks))
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._chunks: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    def locate(self, positions: Sequence[int] | np.ndarray) -> Located:
        """Pointers at ``positions`` (ints, negative ones counted from the end as for a list).

        Raises:
            IndexError: a position outside ``[-len, len)`` (naming it).
            TypeError: positions that are not integers.
        """
        pos = np.asarray(positions)
        if pos.dtype.kind not in "iu" and not (pos.size == 0 and pos.dtype.kind == "f"):
            raise TypeError(f"sample positions must be integers, got {pos.dtype} ({positions!r:.80}).")
        pos = pos.astype(np.int64).reshape(-1)
        n = len(self)
        bad = (pos < -n) | (pos >= n)
        if bad.any():
            raise IndexError(
                f"sample position {int(pos[bad][0])} is out of range: the stream has {n} samples "
                f"(valid positions are {-n}..{n - 1})."
            )
        pos = np.where(pos < 0, pos + n, pos)
        chunks = np.searchsorted(self._ends, pos, side="right")
        offsets = pos - self._starts[chunks]
        pointers = np.empty((len(pos), 3), np.int64)
        components = np.empty(len(pos), np.int32)
        with self._lock:
            for g in np.unique(chunks).tolist():  # a loop over chunks, not samples
                here = chunks == g
                ptrs, comp = self._ordered(g)
                pointers[here] = ptrs[offsets[here]]
                components[here] = comp[offsets[here]]
        return Located(pointers, components, chunks, offsets)

    def _ordered(self, g: int) -> tuple[np.ndarray, np.ndarray]:
        hit = self._chunks.get(g)
        if hit is not None:
            self._chunks.move_to_end(g)
            return hit
        chunk = self._chunk_at(g)
        planned = int(self._ends[g] - self._starts[g])
        if len(chunk) != planned:
            raise RuntimeError(
                f"SamplePositions: chunk {g} holds {len(chunk)} samples, the plan said {planned}; "
                "did the work source change after the positions were planned?"
            )
        out = self._chunks[g] = chunk.ordered()
        if len(self._chunks) > self._cached:
            self._chunks.popitem(last=False)
        return out

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_lock"], state["_chunks"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()
