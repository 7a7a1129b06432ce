"""`RowStore`: the rows an ordered stage holds, by integer handle.

Shuffle buffers and mixture buffers keep rows for a while and let them go in another order. A
store keeps the frames they arrived in (no copy), hands out one handle per row, gathers any
handles back into one frame (one Arrow ``take``), and compacts itself when most of what it
holds has been let go, so memory follows the rows held rather than the frames they came in.

After a restore, rows can be held *by reference* only (``add_refs``: their bookkeeping, see
`frame.refs_of`): ``take`` then recomputes them through the stage's row source, once, when
they are needed. That is what makes restore cost follow the rows a stage emits next, not the
rows it holds.

Example:
    >>> from zephon_columnar.frame import frame_of
    >>> store = RowStore()
    >>> h = store.add(frame_of({"x": [10, 11, 12]}))
    >>> store.take(h[[2, 0]]).column("x").to_pylist()
    [12, 10]
    >>> store.release(h[[2, 0]]); len(store)
    1
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from zephon_columnar import frame as F
from zephon_columnar.memory import buffer_pool

#: Compact when at least this many released rows are still held in memory (and they outnumber
#: the live ones).
COMPACT_MIN_DEAD = 4096


class RowStore:
    """Rows by handle: ``add`` frames, ``take`` / ``release`` handles (see the module docstring)."""

    def __init__(self, source: Callable[..., pa.Table] | None = None) -> None:
        self.source = source
        self.schema: pa.Schema | None = None  # of the rows held by reference (see `restore`)
        self.clear()

    def clear(self) -> None:
        self._tables: list[pa.Table | None] = []
        self._lazy: list[bool] = []  # per table: holds references (bookkeeping) only
        self._live_per_table: list[int] = []
        self._table_of = np.zeros(0, np.int32)  # handle -> table index
        self._row_of = np.zeros(0, np.int64)  # handle -> row in that table
        self._alive = np.zeros(0, bool)
        self._next = 0
        self._live = 0
        self._dead_held = 0

    def __len__(self) -> int:
        return self._live

    def _grow(self, n: int) -> None:
        need = self._next + n
        if need > len(self._alive):
            size = max(need, 2 * len(self._alive), 1024)
            for name, fill in (("_table_of", 0), ("_row_of", 0), ("_alive", False)):
                old = getattr(self, name)
                new = np.full(size, fill, dtype=old.dtype)
                new[: len(old)] = old
                setattr(self, name, new)

    def add(self, frame: pa.Table, *, lazy: bool = False) -> np.ndarray:
        """Hold ``frame``'s rows (with ``lazy``: references to rows, recomputed on ``take``);
        their handles (int64, consecutive)."""
        n = frame.num_rows
        self._grow(n)
        handles = np.arange(self._next, self._next + n, dtype=np.int64)
        if n:
            self._table_of[handles] = len(self._tables)
            self._row_of[handles] = np.arange(n)
            self._alive[handles] = True
            self._tables.append(frame)
            self._lazy.append(lazy)
            self._live_per_table.append(n)
            self._live += n
        self._next += n
        return handles

    def add_refs(self, refs: pa.Table) -> np.ndarray:
        """Hold rows by reference (their bookkeeping); see the module docstring."""
        return self.add(refs, lazy=True)

    def refs(self, handles: np.ndarray) -> pa.Table:
        """The references (bookkeeping) of ``handles``, in that order, without computing rows."""
        handles = np.asarray(handles, np.int64)
        if not len(handles):
            return pa.table({})
        return self._gather(handles, lambda table, rows: _take(F.refs_of(table), rows))

    def _materialize(self, used: np.ndarray) -> None:
        """Recompute the rows of lazy tables among ``used`` (one call of the source each)."""
        for t in used.tolist():
            if self._lazy[t]:
                if self.source is None:
                    raise RuntimeError("RowStore: rows held by reference but no row source to recompute them")
                refs = self._tables[t]
                assert refs is not None
                rows = self.source(refs, self.schema)
                if rows.num_rows != refs.num_rows:
                    raise RuntimeError(f"RowStore: recomputing {refs.num_rows} rows gave {rows.num_rows}")
                self._tables[t] = rows
                self._lazy[t] = False

    def take(self, handles: np.ndarray) -> pa.Table:
        """The rows of ``handles`` in that order, as one frame."""
        handles = np.asarray(handles, np.int64)
        self._materialize(np.unique(self._table_of[handles]))
        return self._gather(handles, _take)

    def _gather(self, handles: np.ndarray, take_rows: Callable[[pa.Table, np.ndarray], pa.Table]) -> pa.Table:
        """``take_rows(table, rows)`` of each held table the ``handles`` fall in, then one take
        that puts those rows in the order of ``handles``. A take over the concatenation of whole
        tables would copy every row the store holds (a full shuffle buffer, 8192 documents) for
        each frame it emits; this copies only the rows taken, twice."""
        tables = self._table_of[handles]
        rows = self._row_of[handles]
        used = np.unique(tables)
        if len(used) == 1:
            return take_rows(self._tables[int(used[0])], rows)
        by_table = np.argsort(tables, kind="stable")
        bounds = np.searchsorted(tables[by_table], used, side="left").tolist() + [len(handles)]
        parts = []
        for k, t in enumerate(used.tolist()):
            table = self._tables[t]
            assert table is not None
            parts.append(take_rows(table, rows[by_table[bounds[k] : bounds[k + 1]]]))
        order = np.empty(len(handles), np.int64)
        order[by_table] = np.arange(len(handles))
        return _take(F.concat_frames(parts), order)

    def release(self, handles: np.ndarray) -> None:
        """Let ``handles`` go (each once)."""
        handles = np.asarray(handles, np.int64)
        if not len(handles):
            return
        self._alive[handles] = False
        self._live -= len(handles)
        self._dead_held += len(handles)
        counts = np.bincount(self._table_of[handles], minlength=len(self._tables))
        for t in np.flatnonzero(counts).tolist():
            self._live_per_table[t] -= int(counts[t])
            table = self._tables[t]
            if self._live_per_table[t] == 0 and table is not None:
                self._dead_held -= table.num_rows  # all of them dead: the frame is freed
                self._tables[t] = None
        if self._dead_held >= COMPACT_MIN_DEAD and self._dead_held > self._live:
            self._compact()

    def payload_schema(self) -> pa.Schema | None:
        """The payload columns of the rows held (what recomputing them must give back)."""
        for table, lazy in zip(self._tables, self._lazy):
            if table is not None and not lazy:
                return F.payload_of(table).schema
        return self.schema

    def restore(self, refs: pa.Table | None, schema: pa.Schema | None, source: Callable[..., pa.Table]) -> np.ndarray:
        """After a restore: hold ``refs`` (rows of payload ``schema``), computed by ``source``
        when taken; their handles."""
        self.source, self.schema = source, schema
        return self.add_refs(refs) if refs is not None else np.zeros(0, np.int64)

    def live_handles(self) -> np.ndarray:
        return np.flatnonzero(self._alive[: self._next]).astype(np.int64)

    def _compact(self) -> None:
        """Gather the live rows into one frame; handles stay valid."""
        live = self.live_handles()
        if any(self._lazy[int(t)] for t in np.unique(self._table_of[live]).tolist()):
            return  # rows held by reference are small; compact once they are computed
        table = self.take(live) if len(live) else None
        self._tables = [table] if table is not None else []
        self._lazy = [False] if table is not None else []
        self._live_per_table = [len(live)] if table is not None else []
        self._table_of[live] = 0
        self._row_of[live] = np.arange(len(live))
        self._dead_held = 0


def _take(table: pa.Table, rows: np.ndarray) -> pa.Table:
    """``table.take(rows)`` into the engine's pool for large transient buffers: a shuffle
    buffer gathers megabytes of tokens per frame, which Arrow's default pool would hand back to
    the OS and fault in again (`zephon_columnar.memory`)."""
    return pc.take(table, pa.array(rows, pa.int64()), memory_pool=buffer_pool())
