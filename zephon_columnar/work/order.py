"""`DatasetOrder`: the deterministic order of one dataset's rows in each pass (epoch).

A pass visits every ``(shard_id, row)`` of the dataset exactly once. Three optional shuffles
shape the order, applied in this sequence:

1. ``shuffle_shards``: shards are visited in the order of
   ``np.random.default_rng([seed, e, 0]).permutation(n_shards)`` (else ascending shard id).
2. ``shuffle_within_shard``: the rows of shard ``s`` are visited in the order of
   ``np.random.default_rng([seed, e, s, 1]).permutation(rows_in_s)`` (else ascending).
3. ``block_size``: the resulting flattened sequence of the pass is cut into consecutive blocks
   of ``block_size`` positions (the last one shorter) and block ``b`` is permuted by
   ``np.random.default_rng([seed, e, b, 2]).permutation(len(block))``.

``e`` is the pass number when ``reshuffle_on_repeat`` else 0 (every pass alike).

Nothing is materialized for the whole pass: :meth:`DatasetOrder.take` computes positions by
arithmetic and keeps only the permutations it is using (the shards overlapping the current
positions and the current block), so memory is O(largest shard + block).

Example:
    >>> order = DatasetOrder(np.array([2, 3]), seed=0, shuffle_shards=False,
    ...                      shuffle_within_shard=False, block_size=None, reshuffle_on_repeat=True)
    >>> order.take(epoch=0, start=1, n=3).tolist()
    [[0, 1], [1, 0], [1, 1]]
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.random


class _ShardRun(NamedTuple):
    """One shard's stretch of a pass, as take's fast path reads it."""

    e: int  # the pass key (the pass, or 0 when every pass is alike)
    lo: int  # its first position in the pass
    hi: int  # the position after its last
    shard: int  # its id
    rows: np.ndarray | None  # its rows in pass order (within-shard shuffle), None: ascending


def _rng(*key: int) -> np.random.Generator:
    return np.random.default_rng(list(key))


class DatasetOrder:
    """Lazy, deterministic ``(shard_id, row)`` order of one dataset, per pass.

    Args:
        counts: rows per shard; shard ids are positions in ``counts``.
        seed: non-negative int; with the pass number it seeds every permutation.
        shuffle_shards, shuffle_within_shard, block_size: see the module docstring.
            ``block_size`` is clamped to the dataset's size (``None`` or 1: no block shuffle).
        reshuffle_on_repeat: whether each pass gets its own permutations.

    Example:
        >>> order = DatasetOrder(np.array([4]), seed=1, shuffle_shards=False,
        ...                      shuffle_within_shard=True, block_size=None, reshuffle_on_repeat=False)
        >>> sorted(order.take(0, 0, 4)[:, 1].tolist())
        [0, 1, 2, 3]
        >>> bool((order.take(0, 0, 4) == order.take(5, 0, 4)).all())  # same order every pass
        True
    """

    def __init__(
        self,
        counts: np.ndarray,
        *,
        seed: int,
        shuffle_shards: bool,
        shuffle_within_shard: bool,
        block_size: int | None,
        reshuffle_on_repeat: bool,
    ) -> None:
        c = np.array(counts, dtype=np.int64).reshape(-1)
        if (c < 0).any():
            raise ValueError(f"DatasetOrder: shard row counts must be >= 0, got {c.tolist()}.")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"DatasetOrder: seed must be an int >= 0, got {seed!r}.")
        if block_size is not None and (isinstance(block_size, bool) or int(block_size) < 1):
            raise ValueError(f"DatasetOrder: block_size must be None or an int >= 1, got {block_size!r}.")
        c.setflags(write=False)
        self.counts = c
        self.total = int(c.sum())
        self.seed = int(seed)
        self.shuffle_shards = bool(shuffle_shards)
        self.shuffle_within_shard = bool(shuffle_within_shard)
        clamped = None if block_size is None else min(int(block_size), self.total)
        self.block_size = clamped if clamped is not None and clamped > 1 else None
        self.reshuffle_on_repeat = bool(reshuffle_on_repeat)
        self._reset_caches()

    def clone(self, *, seed: int | None = None) -> DatasetOrder:
        """Same order, fresh caches (one per thread/lane: the caches are not thread-safe); with
        ``seed``, the same knobs under another seed."""
        return DatasetOrder(
            self.counts,
            seed=self.seed if seed is None else seed,
            shuffle_shards=self.shuffle_shards,
            shuffle_within_shard=self.shuffle_within_shard,
            block_size=self.block_size,
            reshuffle_on_repeat=self.reshuffle_on_repeat,
        )

    def block_rng_snapshot(self, epoch: int, position: int) -> dict[str, object] | None:
        """The block shuffle's generator state after ``position`` rows of pass ``epoch``, in the
        shape of Zephon's cursor field (None without a block shuffle).

        The block generator is counter-based: block ``b`` of pass ``e`` is permuted by a
        generator seeded ``[seed, e, b, 2]``, so its whole state is the key ``[seed, e]`` and
        the count of blocks begun. It is written for tools that read Zephon's checkpoints; a
        restore needs only the position.

        Example:
            >>> order = DatasetOrder(np.array([10]), seed=3, shuffle_shards=False,
            ...                      shuffle_within_shard=False, block_size=4, reshuffle_on_repeat=True)
            >>> order.block_rng_snapshot(epoch=1, position=5)
            {'rng_state': [3, 1], 'block_count': 2}
        """
        if self.block_size is None:
            return None
        e = epoch if self.reshuffle_on_repeat else 0
        return {"rng_state": [self.seed, e], "block_count": -(-position // self.block_size)}

    def _reset_caches(self) -> None:
        # shard layout of one pass: order of shard ids, and [start, end) of each in the pass
        self._layout_key: int | None = None
        self._shard_order = np.empty(0, np.int64)
        self._starts = np.empty(0, np.int64)
        self._ends = np.empty(0, np.int64)
        # within-shard rows of the shards covering pass positions [_win_lo, _win_hi)
        self._win_key: int | None = None
        self._win_lo = self._win_hi = 0
        self._win_rows = np.empty(0, np.int64)
        self._win_perms: dict[int, np.ndarray] = {}
        # permutation of the last block used
        self._blk_key: tuple[int, int] | None = None
        self._blk_perm = np.empty(0, np.int64)
        # the shard the last take read, for take's fast path (no block shuffle only)
        self._run: _ShardRun | None = None

    def _remember_run(self, e: int, j: int) -> None:
        """Keep shard ``j`` of pass ``e``'s layout (positions, id, within-shard rows) for take's
        fast path."""
        order, starts, ends = self._layout(e)
        lo, hi, sid = int(starts[j]), int(ends[j]), int(order[j])
        rows = None
        if self.shuffle_within_shard:
            win_lo, win_rows = self._window(e, lo, hi)
            rows = win_rows[lo - win_lo : hi - win_lo]
        self._run = _ShardRun(e, lo, hi, sid, rows)

    @property
    def varies_by_epoch(self) -> bool:
        """Whether two passes can differ (some shuffle is on and reshuffle_on_repeat)."""
        shuffled = self.shuffle_shards or self.shuffle_within_shard or self.block_size is not None
        return shuffled and self.reshuffle_on_repeat

    # ---------------------------------------------------------------- public
    def take(self, epoch: int, start: int, n: int, out: np.ndarray | None = None) -> np.ndarray:
        """``(shard_id, row)`` at positions ``start .. start+n-1`` of pass ``epoch``.

        Returns an int64 array of shape ``(n, 2)`` (written into ``out`` when given, which may
        be a strided view such as ``chunk[:, 1:]``). Requires ``0 <= start`` and
        ``start + n <= total``; ``n`` may be 0.
        """
        if epoch < 0 or start < 0 or n < 0 or start + n > self.total:
            raise ValueError(
                f"DatasetOrder.take(epoch={epoch}, start={start}, n={n}): need epoch >= 0, "
                f"start >= 0, n >= 0 and start + n <= {self.total} (rows in the dataset)."
            )
        if out is None:
            out = np.empty((n, 2), dtype=np.int64)
        elif out.shape != (n, 2):
            raise ValueError(f"DatasetOrder.take: out has shape {out.shape}, expected {(n, 2)}.")
        if n == 0:
            return out
        e = epoch if self.reshuffle_on_repeat else 0
        run = self._run
        if run is not None and run.e == e and run.lo <= start and start + n <= run.hi:
            # Fast path: within the shard the last call read (a wide mixture reads a row or two
            # of each dataset per chunk, so a call's fixed cost is what counts).
            out[:, 0] = run.shard
            local = start - run.lo
            out[:, 1] = run.rows[local : local + n] if run.rows is not None else np.arange(local, local + n)
            return out
        order, starts, ends = self._layout(e)
        if self.block_size is None:
            # Consecutive positions: shard runs by arithmetic, no per-position search.
            j0 = int(np.searchsorted(ends, start, side="right"))
            j1 = int(np.searchsorted(ends, start + n - 1, side="right"))
            lens = None
            if j0 == j1:
                out[:, 0] = order[j0]
                self._remember_run(e, j0)
            else:
                lens = np.minimum(ends[j0 : j1 + 1], start + n) - np.maximum(starts[j0 : j1 + 1], start)
                out[:, 0] = np.repeat(order[j0 : j1 + 1], lens)
            if self.shuffle_within_shard:
                win_lo, win_rows = self._window(e, start, start + n)
                out[:, 1] = win_rows[start - win_lo : start + n - win_lo]
            elif lens is None:
                local = start - int(starts[j0])
                out[:, 1] = np.arange(local, local + n, dtype=np.int64)
            else:
                out[:, 1] = np.arange(start, start + n, dtype=np.int64) - np.repeat(starts[j0 : j1 + 1], lens)
            return out
        pos = self._block_positions(e, start, n)
        j = np.searchsorted(ends, pos, side="right")
        out[:, 0] = order[j]
        if self.shuffle_within_shard:
            win_lo, win_rows = self._window(e, int(pos.min()), int(pos.max()) + 1)
            out[:, 1] = win_rows[pos - win_lo]
        else:
            out[:, 1] = pos - starts[j]
        return out

    # ---------------------------------------------------------------- internals
    def _layout(self, e: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        key = e if self.shuffle_shards else 0
        if self._layout_key != key:
            if self.shuffle_shards:
                order = _rng(self.seed, e, 0).permutation(len(self.counts)).astype(np.int64)
            else:
                order = np.arange(len(self.counts), dtype=np.int64)
            lens = self.counts[order]
            ends = np.cumsum(lens)
            self._shard_order, self._starts, self._ends = order, ends - lens, ends
            self._layout_key = key
        return self._shard_order, self._starts, self._ends

    def _window(self, e: int, lo: int, hi: int) -> tuple[int, np.ndarray]:
        """Within-shard rows for pass positions covering ``[lo, hi)``: ``(first position, rows)``.

        Holds the permutations of whole shards only (those overlapping the range), reusing the
        ones already computed for this pass.
        """
        if self._win_key == e and self._win_lo <= lo and hi <= self._win_hi:
            return self._win_lo, self._win_rows
        order, starts, ends = self._layout(e)
        ja = int(np.searchsorted(ends, lo, side="right"))
        jb = int(np.searchsorted(ends, hi - 1, side="right"))
        old = self._win_perms if self._win_key == e else {}
        perms: dict[int, np.ndarray] = {}
        for sid in order[ja : jb + 1].tolist():  # a loop over shards, not rows
            perm = old.get(sid)
            if perm is None:
                perm = _rng(self.seed, e, sid, 1).permutation(int(self.counts[sid])).astype(np.int64)
            perms[sid] = perm
        self._win_perms = perms
        self._win_rows = np.concatenate(list(perms.values()))
        self._win_key, self._win_lo, self._win_hi = e, int(starts[ja]), int(ends[jb])
        return self._win_lo, self._win_rows

    def _block_positions(self, e: int, start: int, n: int) -> np.ndarray:
        """Pass positions read at ``start .. start+n-1`` once blocks are permuted."""
        size = self.block_size
        assert size is not None
        pos = np.empty(n, dtype=np.int64)
        filled = 0
        for b in range(start // size, (start + n - 1) // size + 1):  # a loop over blocks
            blo = b * size
            length = min(size, self.total - blo)
            lo, hi = max(start, blo) - blo, min(start + n, blo + length) - blo
            if self._blk_key != (e, b):
                self._blk_perm = _rng(self.seed, e, b, 2).permutation(length).astype(np.int64)
                self._blk_key = (e, b)
            pos[filled : filled + hi - lo] = self._blk_perm[lo:hi] + blo
            filled += hi - lo
        return pos
