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
- ``component_tokens_delivered.<name>``: tokens of the packed rows' pieces.

`MixtureCounts` keeps a lane's counts (numpy vectors by component id, counted a frame at a
time); `starved_components` judges them at the end of a pass, when nothing is in flight;
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
#: Rows that reached the lane's batcher, of every component (the share a routine tail is judged by).
ROWS_BATCHED = "batch_rows_seen"

#: A component is starved when its share of the delivered rows is under this fraction of its
#: share of the rows read (or it delivered none): half its weight lost to operators.
STARVED_BELOW = 0.5
#: Rows a component must have been read before its share is judged (fewer say little).
JUDGED_FROM_ROWS = 16


def is_mixture_counter(name: str) -> bool:
    """Whether the lane counter ``name`` is one of this module's."""
    return name == ROWS_BATCHED or name.startswith((ROWS_READ, ROWS_DELIVERED, TOKENS_DELIVERED))


class MixtureCounts:
    """One lane's rows read, rows delivered and tokens delivered, per component id (``names``:
    component id -> name). Called from the lane's thread only."""

    def __init__(self, names: Mapping[int, str]) -> None:
        self.names = dict(names)
        size = max(self.names, default=-1) + 1
        self.rows_read = np.zeros(size, np.int64)
        self.rows_delivered = np.zeros(size, np.int64)
        self.tokens_delivered = np.zeros(size, np.int64)
        self.rows = 0  # every row that reached the batcher (packed rows: rows, not documents)
        self.packed = False

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
        for cid, name in sorted(self.names.items()):
            if self.rows_read[cid] or self.rows_delivered[cid]:
                out[ROWS_READ + name] = int(self.rows_read[cid])
                out[ROWS_DELIVERED + name] = int(self.rows_delivered[cid])
                if self.packed:
                    out[TOKENS_DELIVERED + name] = int(self.tokens_delivered[cid])
        return out


@dataclass(frozen=True, kw_only=True)
class ComponentShare:
    """One component's rows read and delivered, and its shares of all components' rows."""

    name: str
    read: int
    delivered: int
    read_share: float
    delivered_share: float


def realized_mixture(stats: Mapping[str, int]) -> list[ComponentShare]:
    """Every component's counts in ``stats`` (one lane's, or several summed), by name."""
    names = sorted({key[len(ROWS_READ) :] for key in stats if key.startswith(ROWS_READ)})
    read = {n: stats.get(ROWS_READ + n, 0) for n in names}
    delivered = {n: stats.get(ROWS_DELIVERED + n, 0) for n in names}
    all_read, all_delivered = sum(read.values()) or 1, sum(delivered.values()) or 1
    return [
        ComponentShare(
            name=n,
            read=read[n],
            delivered=delivered[n],
            read_share=read[n] / all_read,
            delivered_share=delivered[n] / all_delivered,
        )
        for n in names
    ]


def starved_components(stats: Mapping[str, int]) -> list[ComponentShare]:
    """The components whose delivered share fell under `STARVED_BELOW` of their read share
    (or that delivered nothing while others delivered), among those read at least
    `JUDGED_FROM_ROWS` rows; meaningful once the lane's pass is over (nothing in flight)."""
    shares = realized_mixture(stats)
    if len(shares) < 2 or not any(s.delivered for s in shares):
        return []  # one component, or nothing delivered at all (the empty-pass guard's case)
    return [s for s in shares if s.read >= JUDGED_FROM_ROWS and s.delivered_share < STARVED_BELOW * s.read_share]


def starved_message(starved: list[ComponentShare], lanes: list[int]) -> str:
    """The warning for ``starved`` components of ``lanes`` (their counts summed)."""
    parts = [
        f"{s.name!r} delivered {s.delivered} of the {s.read} rows it was read ({s.delivered_share:.0%} of the "
        f"rows delivered, against {s.read_share:.0%} of the rows read)"
        for s in starved
    ]
    return (
        f"mixture component(s) starved in this pass (lanes {', '.join(map(str, lanes))}): {'; '.join(parts)}. "
        "Operators after the read dropped their rows far more than the others' (a filter or map on a column that "
        "dataset lacks sees nulls, and a filter turns null into False), so the stream's mixture is not the one "
        "asked for. Check the filters against each dataset's columns (fill_null, or a column every dataset has), "
        "or use ensure_mixture(). Per-component counts: metrics_snapshot() component_rows_read.<name> / "
        "component_rows_delivered.<name>; explain() shows them."
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
