"""The realized mixture: the rows each mixture component gave a lane, and what it delivered.

A mixture's weights decide which rows a lane reads; operators after the read may drop rows (a
filter, an exact mixture, packing's oversized documents). When they drop one component's rows
far more than another's, the stream's mixture is no longer the one asked for: a filter on a
column one dataset lacks turns its rows' nulls into False and a 50/50 mixture into 100/0. These
lane counters make that visible (``metrics_snapshot()``, one record per lane and counter):

- ``component_rows_read.<name>``: rows the lane's source handed on (chunks of the work source);
- ``component_rows_delivered.<name>``: rows that reached the lane's batcher (delivered, but for
  at most a batch's worth waiting there, or dropped at the lane's end by ``drop_last``), a
  packed row counting each document it ends (of a document cut into pieces by
  ``tokenize(split_long_samples=True)``, the piece that ends it counts);
- ``component_tokens_delivered.<name>``: tokens of the packed rows' pieces;
- ``component_rows_target.<name>``: the rows the mixture aimed for in the chunks read (each
  chunk's target weights times its rows: a scheduled mixture's weights of that chunk, including
  a component that ran out; the chunk's composition where it states no target).

`MixtureCounts` keeps a lane's counts (numpy vectors by component id, counted a frame at a
time); `starved_components` judges them (delivered share against the target's, else the read
share) at the end of a pass, when nothing is in flight, and in an endless stream at each flush
epoch, against the targets of the epochs the lane has delivered whole (`MixtureCounts.settle`);
`columns_some_lack` finds the usual cause before the first row is read, where a filter declares
the columns it reads (`~zephon_columnar.ops.traits.OpTraits` ``reads``/``writes``).

Example:
    >>> import numpy as np, pyarrow as pa
    >>> counts = MixtureCounts({0: "web", 1: "code"})
    >>> counts.read(np.array([0, 1] * 20, np.int32))
    >>> counts.delivered(pa.table({"__component": pa.array([0] * 20 + [1] * 3, pa.int32())}))
    >>> counts.stats()  # doctest: +NORMALIZE_WHITESPACE
    {'batch_rows_seen': 23, 'component_rows_read.web': 20, 'component_rows_delivered.web': 20,
     'component_rows_read.code': 20, 'component_rows_delivered.code': 3}
    >>> [s.name for s in starved_components(counts.stats())]
    ['code']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.ops.base import BaseOp
from zephon_columnar.ops.fetch import mixture_fields
from zephon_columnar.ops.traits import KeepsRows

ROWS_READ = "component_rows_read."
ROWS_DELIVERED = "component_rows_delivered."
TOKENS_DELIVERED = "component_tokens_delivered."
TARGET = "component_rows_target."
#: Lane counter: chunks the lane's source read (how far into the stream a changing mixture is).
CHUNKS_READ = "mixture_chunks_read"
#: Rows that reached the lane's batcher, of every component (the share a routine tail is judged by).
ROWS_BATCHED = "batch_rows_seen"

#: A component is starved when its share of the delivered rows is under this fraction of its
#: share of the rows read (or it delivered none): half its weight lost to operators.
STARVED_BELOW = 0.5
#: Rows a component must have been read before its share is judged (fewer say little).
JUDGED_FROM_ROWS = 16


def is_mixture_counter(name: str) -> bool:
    """Whether the lane counter ``name`` is one of this module's."""
    return name in (ROWS_BATCHED, CHUNKS_READ) or name.startswith((ROWS_READ, ROWS_DELIVERED, TOKENS_DELIVERED, TARGET))


class MixtureCounts:
    """One lane's rows read, rows delivered and tokens delivered, per component id (``names``:
    component id -> name). Called from the lane's thread only."""

    def __init__(self, names: Mapping[int, str]) -> None:
        self.names = dict(names)
        size = max(self.names, default=-1) + 1
        self.rows_read = np.zeros(size, np.int64)
        self.rows_delivered = np.zeros(size, np.int64)
        self.tokens_delivered = np.zeros(size, np.int64)
        self.target = np.zeros(size, np.float64)  # rows aimed for, of every chunk read
        self.settled = np.zeros(size, np.float64)  # of the flush epochs delivered whole
        self._unsettled: dict[int, np.ndarray] = {}  # by flush epoch, the others'
        self.chunks = 0  # chunks read
        self.rows = 0  # every row that reached the batcher (packed rows: rows, not documents)
        self.packed = False

    def planned(self, epoch: int, target: Mapping[int, float], rows: int) -> None:
        """A chunk of flush epoch ``epoch`` read: ``rows`` rows aimed at ``target`` (weights by
        component id)."""
        aimed = np.zeros(len(self.target), np.float64)
        for cid, weight in target.items():
            if 0 <= cid < len(aimed):
                aimed[cid] = weight * rows
        self.target += aimed
        self._unsettled[epoch] = self._unsettled.get(epoch, 0) + aimed
        self.chunks += 1

    def settle(self, epoch: int) -> list[ComponentShare]:
        """The lane's flush epochs before ``epoch`` are delivered whole (the collector saw
        ``epoch`` start): the components starved against their targets so far."""
        for done in [e for e in self._unsettled if e < epoch]:
            self.settled += self._unsettled.pop(done)
        so_far: dict[str, int] = {}
        for cid, name in self.names.items():
            so_far[ROWS_READ + name] = int(self.rows_read[cid])
            so_far[ROWS_DELIVERED + name] = int(self.rows_delivered[cid])
            so_far[TARGET + name] = round(float(self.settled[cid]))
        return starved_components(so_far)

    def read(self, components: np.ndarray) -> None:
        """Count a pointer frame's rows (their component ids)."""
        if len(components):
            self.rows_read += np.bincount(components, minlength=len(self.rows_read))[: len(self.rows_read)]

    def delivered(self, table: pa.Table) -> None:
        """Count a delivered item's rows: a packed row's documents (the pieces that end one) and
        tokens, else the rows that end their document."""
        size = len(self.rows_delivered)
        self.rows += table.num_rows
        schema = table.schema
        at = schema.get_field_index(F.SEGMENTS)
        if at >= 0:
            self.packed = True
            for chunk in table.column(at).chunks:
                offsets = chunk.offsets
                first, last = offsets[0].as_py(), offsets[-1].as_py()
                if last == first:
                    continue
                pieces = chunk.values.slice(first, last - first)
                component = pieces.field("component").to_numpy(zero_copy_only=False)
                closes = pieces.field("closes").to_numpy(zero_copy_only=False)
                length = pieces.field("length").to_numpy(zero_copy_only=False)
                self.rows_delivered += np.bincount(component[closes], minlength=size)[:size]
                self.tokens_delivered += np.bincount(component, weights=length, minlength=size)[:size].astype(np.int64)
            return
        at = schema.get_field_index(F.COMPONENT)
        if at >= 0 and table.num_rows:
            ids = table.column(at).to_numpy()
            open_at = schema.get_field_index(F.OPEN)
            if open_at >= 0:  # a piece that does not end its document: the one that does counts
                ids = ids[~table.column(open_at).fill_null(False).to_numpy(zero_copy_only=False)]
            self.rows_delivered += np.bincount(ids, minlength=size)[:size]

    def delivered_record(self, component_samples: Mapping[int, int]) -> None:
        """Count a delivered record by its ``meta.component_sample_counts`` (documents per
        component id)."""
        for cid, n in component_samples.items():
            if 0 <= cid < len(self.rows_delivered):
                self.rows_delivered[cid] += n

    def stats(self) -> dict[str, int]:
        """The counters by name, for ``metrics_snapshot()`` (components read or delivered)."""
        out: dict[str, int] = {ROWS_BATCHED: self.rows} if self.rows else {}
        if self.chunks:
            out[CHUNKS_READ] = self.chunks
        for cid, name in sorted(self.names.items()):
            if self.rows_read[cid] or self.rows_delivered[cid] or self.target[cid]:
                out[ROWS_READ + name] = int(self.rows_read[cid])
                out[ROWS_DELIVERED + name] = int(self.rows_delivered[cid])
            if self.target[cid]:
                out[TARGET + name] = round(float(self.target[cid]))
                if self.packed:
                    out[TOKENS_DELIVERED + name] = int(self.tokens_delivered[cid])
        return out


@dataclass(frozen=True, kw_only=True)
class ComponentShare:
    """One component's rows read, delivered and aimed for (``target``), and its shares of all
    components' rows; ``expected_share``: the target's share, or the read share where the
    counters hold no target."""

    name: str
    read: int
    delivered: int
    target: int
    read_share: float
    delivered_share: float
    target_share: float
    expected_share: float


def realized_mixture(stats: Mapping[str, int]) -> list[ComponentShare]:
    """Every component's counts in ``stats`` (one lane's, or several summed), by name."""
    names = sorted({key[len(ROWS_READ) :] for key in stats if key.startswith(ROWS_READ)})
    read = {n: stats.get(ROWS_READ + n, 0) for n in names}
    delivered = {n: stats.get(ROWS_DELIVERED + n, 0) for n in names}
    target = {n: stats.get(TARGET + n, 0) for n in names}
    all_read, all_delivered = sum(read.values()) or 1, sum(delivered.values()) or 1
    all_target = sum(target.values())
    return [
        ComponentShare(
            name=n,
            read=read[n],
            delivered=delivered[n],
            target=target[n],
            read_share=read[n] / all_read,
            delivered_share=delivered[n] / all_delivered,
            target_share=target[n] / (all_target or 1),
            expected_share=target[n] / all_target if all_target else read[n] / all_read,
        )
        for n in names
    ]


def target_shares(stats: Mapping[str, int], components: Sequence[str]) -> tuple[float, ...]:
    """The target's share of each of ``components`` in ``stats`` (empty: no target counted)."""
    aimed = [stats.get(TARGET + n, 0) for n in components]
    total = sum(aimed)
    return tuple(a / total for a in aimed) if total else ()


def starved_components(stats: Mapping[str, int]) -> list[ComponentShare]:
    """The components whose delivered share fell under `STARVED_BELOW` of their expected share
    (the target's, else the read share; or that delivered nothing while others delivered),
    among those expected at least `JUDGED_FROM_ROWS` rows; meaningful once the rows counted as
    aimed for have had the time to be delivered (the end of the pass, or of a flush epoch)."""
    shares = realized_mixture(stats)
    if len(shares) < 2 or not any(s.delivered for s in shares):
        return []  # one component, or nothing delivered at all (the empty-pass guard's case)
    return [
        s
        for s in shares
        if max(s.read, s.target) >= JUDGED_FROM_ROWS and s.delivered_share < STARVED_BELOW * s.expected_share
    ]


def starved_message(starved: list[ComponentShare], lanes: list[int], *, scope: str = "in this pass") -> str:
    """The warning for ``starved`` components of ``lanes`` (their counts summed), ``scope``: over
    what they were counted."""
    parts = [
        f"{s.name!r} delivered {s.delivered} of the {s.read} rows it was read ({s.delivered_share:.0%} of the "
        f"rows delivered, against {s.read_share:.0%} of the rows read"
        + (f" and a target of {s.target_share:.0%})" if s.target and s.target != s.read else ")")
        for s in starved
    ]
    return (
        f"mixture component(s) starved {scope} (lanes {', '.join(map(str, lanes))}): {'; '.join(parts)}. "
        "It ran out (its exhausted_policy let it leave), or operators after the read dropped its rows far more "
        "than the others' (a filter or map on a column that dataset lacks sees nulls, and a filter turns null into "
        "False), so the stream's mixture is not the one asked for. Check the filters against each dataset's "
        "columns (fill_null, or a column every dataset has), or use ensure_mixture(). Per-component counts: "
        "metrics_snapshot() component_rows_read.<name> / component_rows_delivered.<name> / "
        "component_rows_target.<name>; explain() shows them."
    )


def columns_some_lack(ops: Sequence[BaseOp], datasets: Mapping[int, Any]) -> list[str]:
    """One message per filter that drops every row of a dataset of the mixture because the
    dataset lacks a column it reads (``datasets``: the work source's, by id; nothing is said
    when their columns agree or one's schema is unknown). Operators are followed in order while
    they declare what they write (a column an earlier operator writes is every dataset's); after
    one that does not (a Python callable), nothing more is said. A filter that keeps rows where
    the column is null (``fill_null``, ``coalesce``) is not named.

    Example:
        >>> import polars as pl
        >>> from zephon_columnar.io.dataset import Dataset
        >>> from zephon_columnar.ops.map import FilterOp
        >>> web = Dataset.from_path("web", "data/web")  # a 'text' column
        >>> code = Dataset.from_tables("code", [pa.table({"content": ["x = 1"]})])
        >>> [m[:48] for m in columns_some_lack([FilterOp(pl.col("text") != "")], {0: web, 1: code})]
        ["filter reads column 'text', which dataset 'code'"]
    """
    union_schema = mixture_fields(datasets)  # the union of their columns, or None when they agree
    if union_schema is None:
        return []
    union = {fld.name: fld for fld in union_schema}
    written: set[str] = set()
    out = []
    for op in ops:
        traits = op.traits()
        reads = sorted((traits.reads or frozenset()) - written)
        if reads and isinstance(op, KeepsRows):
            probe = pa.schema([union[c] for c in reads if c in union])  # the row a lacking dataset gives it
            drops_nulls = op.keeps_null_row(probe) is False
            for _, dataset in sorted(datasets.items()):
                lacking = [c for c in reads if c in union and c not in dataset.schema.names]
                if lacking and drops_nulls:
                    columns = ", ".join(map(repr, lacking))
                    out.append(
                        f"{op.name} reads column {columns}, which dataset {dataset.name!r} of the mixture "
                        f"lacks: its rows see null there, which this {op.name} drops, so it would deliver none of "
                        "them and the stream's mixture would not be the one asked for. Name a column every dataset "
                        "has, or fill_null()/coalesce() the column."
                    )
        if traits.writes is None:
            break
        written |= traits.writes
    return out
