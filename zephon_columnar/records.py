"""Row views of frames, and back: what user code on records sees.

A frame is an Arrow table of bookkeeping columns (``__lane``, ``__chunk``, ...; see `frame`)
and payload columns. Row-wise user code (``add_op``'s ``process_many``, accumulators,
``stateful_transform``) sees `SampleRecord`s instead: a payload dict and a `SampleMeta`. This
module converts both ways, one pass per column (never per cell through Arrow scalars), and
holds Zephon's record vocabulary (`SampleCursor`, `ContributorRef`, `SampleMeta`) with the
helpers that let an operator fan out, pack and drop records without breaking resume
(`spawn_child`, `pack_meta`, `tombstone_meta`, `tombstones_for_record`).

It sits below ``ops/`` and ``types.py``: both import it, it imports neither.

Example:
    >>> from zephon_columnar import frame as F
    >>> records = records_of(F.frame_of({"text": ["a", "bb"]}))
    >>> [(r.meta.sample_id, r.payload) for r in records]
    [((0, 0, 0), {'text': 'a'}), ((0, 0, 1), {'text': 'bb'})]
    >>> child = spawn_child(records[1].meta, 0, is_last_child=True)
    >>> child.lineage, frame_of_records([SampleRecord(child, {"text": "b"})]).column("__lineage").to_pylist()
    ((0,), [[0]])
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from operator import attrgetter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from zephon_columnar import frame as F
from zephon_columnar.errors import WrongTypeError

SampleId = tuple[int, int, int]
#: ``{dataset_id: the payload fields its rows have}``: how row views leave out the null-filled
#: columns that a frame mixing several datasets holds for the other datasets' fields.
FieldsByDataset = Mapping[int, frozenset[str]]


@dataclass(frozen=True, slots=True)
class SampleCursor:
    """Where a record stands in its lane's stream: ``(chunk_id, chunk_offset, sample_id,
    lineage)``, ordered by chunk, offset, lineage (then sample id)."""

    chunk_id: int
    chunk_offset: int
    sample_id: SampleId
    lineage: tuple[int, ...] = ()

    @staticmethod
    def from_key(key: Sequence[Any]) -> SampleCursor:
        chunk_id, chunk_offset, lineage, sample_id = key
        return SampleCursor(
            int(chunk_id),
            int(chunk_offset),
            tuple(int(x) for x in sample_id),  # type: ignore[arg-type]
            tuple(int(x) for x in lineage),
        )

    def as_key(self) -> tuple[int, int, tuple[int, ...], SampleId]:
        return (self.chunk_id, self.chunk_offset, self.lineage, self.sample_id)

    def child(self, index: int) -> SampleCursor:
        if index < 0:
            raise ValueError(f"SampleCursor.child({index}): a lineage index is non-negative.")
        return replace(self, lineage=self.lineage + (int(index),))

    @property
    def base_offset(self) -> tuple[int, int]:
        return (self.chunk_id, self.chunk_offset)

    def __lt__(self, other: SampleCursor) -> bool:
        return self.as_key() < other.as_key()

    def __le__(self, other: SampleCursor) -> bool:
        return self.as_key() <= other.as_key()


@dataclass(frozen=True, slots=True)
class ContributorRef:
    """A sample (or a piece of one) that went into a record: its ``cursor``, and whether this
    piece ends the sample (``is_last_child``). Packed rows also say which ``component`` the
    sample is from and which tokens ``[start, start + length)`` of it the row holds."""

    cursor: SampleCursor
    is_last_child: bool = True
    component: int | None = field(default=None, kw_only=True)
    start: int | None = field(default=None, kw_only=True)
    length: int | None = field(default=None, kw_only=True)


@dataclass(frozen=True, kw_only=True)
class SampleMeta:
    """Where a row came from: its source sample, lane, chunk and position in the chunk, its
    lineage (child indices after fan-out) and ``tags`` (``_contributors``, ``_tombstone``,
    ``padding_length``). Frozen, as Zephon's: derive another with ``dataclasses.replace`` or
    `spawn_child`."""

    sample_id: SampleId
    lane_id: int
    chunk_id: int
    chunk_offset: int = 0
    component_sample_counts: dict[int, int] = field(default_factory=lambda: {0: 1})
    component_token_counts: dict[int, int] | None = None
    lineage: tuple[int, ...] = ()
    tags: dict[str, Any] = field(default_factory=dict)

    @property
    def cursor(self) -> SampleCursor:
        return SampleCursor(self.chunk_id, self.chunk_offset, self.sample_id, self.lineage)

    def as_cursor_key(self) -> tuple[int, int, tuple[int, ...], SampleId]:
        return self.cursor.as_key()

    def child(self, index: int) -> SampleMeta:
        """The meta of the ``index``-th record made from this one (lineage extended)."""
        return replace(self, lineage=self.lineage + (int(index),))

    def with_lineage(self, path: Iterable[int]) -> SampleMeta:
        return replace(self, lineage=tuple(int(i) for i in path))

    def with_contributors(self, refs: Iterable[ContributorRef] | None) -> SampleMeta:
        tags = dict(self.tags)
        refs = tuple(refs or ())
        if refs:
            tags["_contributors"] = refs
        else:
            tags.pop("_contributors", None)
        return replace(self, tags=tags)

    def with_tombstone(self, value: bool = True) -> SampleMeta:
        tags = dict(self.tags)
        if value:
            tags["_tombstone"] = True
        else:
            tags.pop("_tombstone", None)
        return replace(self, tags=tags)

    @property
    def padding_length(self) -> int | None:
        """Trailing pad tokens of a packed row (our ``tags["padding_length"]``, or Zephon's
        ``tags["_packing_metadata"]["padding_length"]``), else None."""
        n = self.tags.get("padding_length")
        if n is None:
            packing = self.tags.get("_packing_metadata")
            n = packing.get("padding_length") if isinstance(packing, Mapping) else None
        return n

    @property
    def contributors(self) -> tuple[ContributorRef, ...]:
        """The samples (pieces) a packed or merged record holds, in order; ``()`` for a record
        made from one sample."""
        return tuple(self.tags.get("_contributors", ()))

    def contribution_refs(self) -> tuple[ContributorRef, ...]:
        """``contributors``, or this record's own cursor (closing) for a one-sample record."""
        return self.contributors or (ContributorRef(self.cursor, True),)

    def contribution_cursors(self) -> tuple[SampleCursor, ...]:
        return tuple(ref.cursor for ref in self.contribution_refs())

    @property
    def tombstone(self) -> bool:
        """A payload-less record saying "this sample was dropped" (the engine discards it)."""
        return bool(self.tags.get("_tombstone", False))

    @property
    def is_flush_sentinel(self) -> bool:
        return bool(self.tags.get("_flush_sentinel", False))

    @property
    def is_sentinel(self) -> bool:
        return self.tombstone or self.is_flush_sentinel or "_source_exhausted" in self.tags


@dataclass
class SampleRecord:
    """One row: ``payload`` (column -> Python value) and ``meta``. Operators rebuild
    ``record.payload`` and return the record that carried it."""

    meta: SampleMeta
    payload: dict[str, Any] | None


# ---------------------------------------------------------------- helpers for operators
def spawn_child(
    parent: SampleMeta, child_idx: int, *, is_last_child: bool = False, tags: dict[str, Any] | None = None
) -> SampleMeta:
    """Meta of the ``child_idx``-th record an operator makes from ``parent`` (fan-out): the
    parent's lineage extended by ``child_idx``; ``is_last_child`` marks the child that
    completes the parent.

    Example:
        >>> parent = SampleMeta(sample_id=(0, 0, 7), lane_id=0, chunk_id=2, chunk_offset=5)
        >>> [spawn_child(parent, i, is_last_child=i == 1).lineage for i in range(2)]
        [(0,), (1,)]
    """
    if is_last_child and parent.tombstone:
        raise ValueError(
            "spawn_child: Cannot spawn a closing child from tombstone metadata: a tombstone has "
            "no children that complete it; drop the tombstone's children instead."
        )
    child = parent.child(child_idx)
    if parent.contributors:
        refs = (
            parent.contributors
            if is_last_child
            else tuple(replace(ref, is_last_child=False) for ref in parent.contributors)
        )
    else:
        refs = (ContributorRef(child.cursor, is_last_child),)
    new_tags = {**parent.tags, **(tags or {}), "_contributors": refs}
    new_tags.pop("_tombstone", None)
    return replace(child, tags=new_tags)


def pack_meta(
    primary_cursor: SampleCursor,
    contributors: Iterable[ContributorRef],
    *,
    lane_id: int,
    component_sample_counts: dict[int, int],
    component_token_counts: dict[int, int] | None = None,
    tags: dict[str, Any] | None = None,
) -> SampleMeta:
    """Meta of a record that merges several (``contributors``); ``primary_cursor`` (unique per
    lane) is its identity, and its stream position."""
    new_tags = {k: v for k, v in (tags or {}).items() if k != "_tombstone"}
    new_tags["_contributors"] = tuple(contributors)
    return SampleMeta(
        sample_id=primary_cursor.sample_id,
        lane_id=lane_id,
        chunk_id=primary_cursor.chunk_id,
        chunk_offset=primary_cursor.chunk_offset,
        component_sample_counts=dict(component_sample_counts),
        component_token_counts=component_token_counts,
        lineage=primary_cursor.lineage,
        tags=new_tags,
    )


def tombstone_meta(ref: ContributorRef, lane_id: int) -> SampleMeta:
    """Meta of a tombstone: "the sample ``ref`` closes was dropped"."""
    if not ref.is_last_child:
        raise ValueError(
            "tombstone_meta: pass a closing contributor (is_last_child=True); only the "
            "piece that completes a sample can say it was dropped."
        )
    c = ref.cursor
    return SampleMeta(
        sample_id=c.sample_id,
        lane_id=lane_id,
        chunk_id=c.chunk_id,
        chunk_offset=c.chunk_offset,
        lineage=c.lineage,
        tags={"_tombstone": True, "_contributors": (ref,)},
    )


def tombstones_for_record(record: SampleRecord) -> list[SampleRecord]:
    """What an operator returns instead of a record it drops: one tombstone per sample the
    record completes. (This engine resumes from stream positions, so a dropped record never
    holds anything back; tombstones are accepted and discarded, for Zephon's contract.)"""
    return [
        SampleRecord(tombstone_meta(ref, record.meta.lane_id), None)
        for ref in record.meta.contribution_refs()
        if ref.is_last_child
    ]


# ---------------------------------------------------------------- frame -> records
def records_of(table: pa.Table, fields: FieldsByDataset | None = None) -> list[SampleRecord]:
    """Row views of a frame (one conversion per column, not per cell).

    With ``fields``, a row's payload leaves out a null field that its own dataset does not
    have: a frame mixing datasets holds the union of their columns, but a record holds only
    what its sample has (plus what operators added to it).

    Example (the metas are those the constructor makes):
        >>> from zephon_columnar import frame as F
        >>> r = records_of(F.frame_of({"n": [4]}, chunk_id=2, first_row=7))[0]
        >>> r.meta == SampleMeta(sample_id=(0, 0, 7), lane_id=0, chunk_id=2, chunk_offset=7), r.payload
        (True, {'n': 4})
    """
    columns = table.schema.names
    names = [x for x in columns if not F.is_bookkeeping(x)]
    n = table.num_rows
    payloads = payload_dicts(table, names)
    lane, chunk, offset, dataset, shard, row, comp = (
        table.column(c).to_pylist() for c in (F.LANE, F.CHUNK, F.OFFSET, F.DATASET, F.SHARD, F.ROW, F.COMPONENT)
    )
    pad = table.column(F.PADDING_LENGTH).to_pylist() if F.PADDING_LENGTH in columns else None
    lineage = F.lineage_paths(table)
    opened = F.open_rows(table).tolist()
    if fields:
        # Per dataset, the fields to leave out where null (columns only other datasets have).
        foreign = {d: [x for x in names if x not in own] for d, own in fields.items()}
        for payload, d in zip(payloads, dataset):
            for x in foreign.get(d, ()):
                if payload[x] is None:
                    del payload[x]
    segments = table.column(F.SEGMENTS).to_pylist() if F.SEGMENTS in columns else None
    new = object.__new__
    metas = []
    if pad is None and segments is None and _PLAIN_META_INIT:
        # The common frame: what SampleMeta(...) would set, attribute by attribute (about 3x
        # cheaper than its keyword __init__, which does nothing else; the doctest checks).
        for d, s, r, ln, c, o, k, g, op in zip(dataset, shard, row, lane, chunk, offset, comp, lineage, opened):
            meta = new(SampleMeta)
            # SampleMeta is frozen: its __dict__ is filled directly, as its __init__ would.
            meta.__dict__.update(
                sample_id=(d, s, r),
                lane_id=ln,
                chunk_id=c,
                chunk_offset=o,
                component_sample_counts={k: 1},
                component_token_counts=None,
                lineage=g,
                tags=_child_tags(c, o, (d, s, r), g, op) if g else {},
            )
            metas.append(meta)
    else:
        for i in range(n):
            tags: dict[str, Any] = {} if pad is None else {"padding_length": pad[i]}
            samples: dict[int, int] = {comp[i]: 1}
            tokens: dict[int, int] | None = None
            if segments is not None:  # a packed row: counts and contributors from its pieces
                samples, tokens, tags["_contributors"] = _packed_meta(segments[i])
                tags["_packing_metadata"] = _packing_metadata(segments[i], None if pad is None else pad[i])
            elif lineage[i]:
                tags.update(_child_tags(chunk[i], offset[i], (dataset[i], shard[i], row[i]), lineage[i], opened[i]))
            metas.append(
                SampleMeta(
                    sample_id=(dataset[i], shard[i], row[i]),
                    lane_id=lane[i],
                    chunk_id=chunk[i],
                    chunk_offset=offset[i],
                    component_sample_counts=samples,
                    component_token_counts=tokens,
                    lineage=lineage[i],
                    tags=tags,
                )
            )
    return list(map(SampleRecord, metas, payloads))


#: Whether `records_of` may set a `SampleMeta`'s attributes itself: its __init__ only assigns
#: these eight fields (if SampleMeta changes, records_of goes back to calling it).
_PLAIN_META_INIT = "__post_init__" not in vars(SampleMeta) and [f.name for f in fields(SampleMeta)] == [
    "sample_id",
    "lane_id",
    "chunk_id",
    "chunk_offset",
    "component_sample_counts",
    "component_token_counts",
    "lineage",
    "tags",
]


def _child_tags(chunk: int, offset: int, sample: SampleId, lineage: tuple[int, ...], open_: bool) -> dict[str, Any]:
    """Tags of a fan-out child's record: itself as its contributor, closing unless ``__open``
    (as `spawn_child` gives it)."""
    return {"_contributors": (ContributorRef(SampleCursor(chunk, offset, sample, lineage), not open_),)}


def _packed_meta(pieces: list[dict[str, Any]]) -> tuple[dict[int, int], dict[int, int], tuple[ContributorRef, ...]]:
    """(component -> samples the row closes, component -> its tokens, contributors) of a packed
    row's ``__segments``: a sample is counted on the piece that ends it (as Zephon does)."""
    samples: dict[int, int] = {}
    tokens: dict[int, int] = {}
    refs = []
    for p in pieces:
        c = p["component"]
        tokens[c] = tokens.get(c, 0) + p["length"]
        if p["closes"]:
            samples[c] = samples.get(c, 0) + 1
        cursor = SampleCursor(p["chunk"], p["offset"], (p["dataset"], p["shard"], p["row"]), tuple(p["lineage"]))
        refs.append(ContributorRef(cursor, bool(p["closes"]), component=c, start=p["start"], length=p["length"]))
    return samples, tokens, tuple(refs)


def _packing_metadata(pieces: list[dict[str, Any]], pad: int | None) -> dict[str, Any]:
    """Zephon's ``tags["_packing_metadata"]`` of a packed row: its pieces, real tokens, the
    share of the row they fill and the pad tail (None where the row has no pad column).

    Example:
        >>> _packing_metadata([{"length": 3}, {"length": 4}], 2)
        {'num_sequences': 2, 'total_length': 7, 'packing_efficiency': 0.7777777777777778, 'padding_length': 2}
    """
    total = sum(int(p["length"]) for p in pieces)
    row = total + (pad or 0)
    return {
        "num_sequences": len(pieces),
        "total_length": total,
        "packing_efficiency": total / row if row else 0.0,
        "padding_length": pad,
    }


#: Field metadata asking record views for Python lists instead of numpy views: on tokenize's
#: ``input_ids``/``attention_mask`` (Zephon's tokenize gives lists; user code appends to them)
#: and on list fields that Python code returned as lists.
PYTHON_LISTS_KEY = b"zephon_columnar.python_lists"


def as_python_lists(table: pa.Table, names: Sequence[str]) -> pa.Table:
    """``table`` with the fields ``names`` marked `PYTHON_LISTS_KEY` (zero-copy: metadata only)."""
    if not names:
        return table
    schema = table.schema
    for name in names:
        if name in schema.names:
            i = schema.get_field_index(name)
            field = schema.field(i)
            schema = schema.set(i, field.with_metadata({**(field.metadata or {}), PYTHON_LISTS_KEY: b"1"}))
    return pa.Table.from_arrays(table.columns, schema=schema)


def payload_dicts(table: pa.Table, names: Sequence[str]) -> list[dict[str, Any]]:
    """Row dicts of the columns ``names`` of ``table``, values as `payload_values` gives them."""
    if not names:
        return [{} for _ in range(table.num_rows)]
    return [dict(zip(names, values)) for values in zip(*[payload_values(table, x) for x in names])]


def payload_values(table: pa.Table, name: str) -> list[Any]:
    """A payload column as Python values: a list of numbers as a read-only numpy view of the
    column's buffer (as Zephon gives it: ``.shape``, ``.dtype``, slices without copies) unless
    the field is marked `PYTHON_LISTS_KEY`; packed segments merged by ``pack_sequences``
    (``pack_payloads="numpy_array"`` / ``"torch_tensor"``) as arrays / tensors."""
    column = table.column(name)
    meta = table.schema.field(name).metadata or {}
    merge = meta.get(b"zephon_columnar.pack_payloads")
    if merge is None:
        if PYTHON_LISTS_KEY in meta:
            values: list[Any] = column.to_pylist()
            return values
        views = _numeric_list_views(column)
        if views is not None:
            return views
        return _with_segment_arrays(column) if _is_segment_list(column.type) else column.to_pylist()
    values = column.to_pylist()
    if merge == b"torch_tensor":
        import torch

        return [{k: torch.tensor(v) for k, v in row.items()} for row in values]
    return [{k: np.asarray(v) for k, v in row.items()} for row in values]


def _is_numeric_list(t: pa.DataType) -> bool:
    """``list<int|float>`` (large or fixed-size too: a vector column): what record views hold
    as numpy views."""
    return bool(
        (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t))
        and (pa.types.is_integer(t.value_type) or pa.types.is_floating(t.value_type))
    )


def _is_segment_list(t: pa.DataType) -> bool:
    """``list<struct<...>>`` with a list-of-numbers field: ``pack_sequences``' packed_samples."""
    return (
        (pa.types.is_list(t) or pa.types.is_large_list(t))
        and pa.types.is_struct(t.value_type)
        and any(_is_numeric_list(f.type) for f in t.value_type)
    )


def _with_segment_arrays(column: pa.ChunkedArray) -> list[Any]:
    """Rows of segment dicts whose lists of numbers are read-only numpy views (as the records
    they were packed from held them): each field's views come from its flattened column, in
    segment order."""
    rows: list[Any] = column.to_pylist()
    segments = pc.list_flatten(column)  # every row's segments, in order (null rows give none)
    for fld in column.type.value_type:
        if not _is_numeric_list(fld.type):
            continue
        views = _numeric_list_views(pc.struct_field(segments, fld.name))
        if views is None:
            continue  # a list holding a null: Python lists, as for a plain column
        flat = iter(views)
        for row in rows:
            for segment in row or ():
                view = next(flat)
                if view is not None:
                    segment[fld.name] = view
    return rows


def _numeric_list_views(column: pa.ChunkedArray) -> list[np.ndarray | None] | None:
    """Each row of a ``list<int|float>`` column as a read-only numpy view (None for a null row),
    or None when the column is of another type or a list holds a null (Python lists then)."""
    if not _is_numeric_list(column.type):
        return None
    out: list[np.ndarray | None] = []
    for chunk in column.chunks:
        values = chunk.values  # the whole child array; the chunk's offsets index into it
        valid = np.ones(len(chunk), bool) if not chunk.null_count else chunk.is_valid().to_numpy(zero_copy_only=False)
        if isinstance(chunk, pa.FixedSizeListArray):  # row i holds values [i * size, (i + 1) * size)
            bounds = (np.arange(len(chunk) + 1) + chunk.offset) * chunk.type.list_size
            if values.null_count:  # a null row's slots may be null; a value within a row may not
                held = values.is_valid().to_numpy(zero_copy_only=False)[bounds[0] : bounds[-1]]
                if not held.reshape(len(chunk), chunk.type.list_size)[valid].all():
                    return None
                values = values.fill_null(0)  # a copy, only where null rows hold slots
        else:
            if values.null_count:
                return None
            bounds = chunk.offsets.to_numpy()
        flat = values.to_numpy(zero_copy_only=True)
        out.extend(flat[a:b] if ok else None for a, b, ok in zip(bounds[:-1].tolist(), bounds[1:].tolist(), valid))
    return out


# ---------------------------------------------------------------- records -> frame
def payloads_to_table(payloads: list[dict[str, Any]], *, op_name: str) -> pa.Table:
    """Arrow table of row dicts: the union of their keys (missing values are null), one column
    type per field. Types come from the values alone, never from which rows share a frame, so a
    field whose rows mix Python types (1 and 1.0, "a" and 2) is an error rather than a column type
    that changes with the frame size. Lists of numbers stay Python lists for the next operator
    that reads records (`PYTHON_LISTS_KEY`), numpy arrays stay arrays: values keep the kind the
    code gave them, as in Zephon."""
    names, arrays, lists = _payload_arrays(payloads, op_name)
    if not names:
        return pa.table({})
    return as_python_lists(pa.Table.from_arrays(arrays, names=names), lists)


def _payload_arrays(payloads: list[dict[str, Any]], op_name: str) -> tuple[list[str], list[pa.Array], list[str]]:
    """`payloads_to_table`'s column names and arrays, and the list columns built from Python
    lists (to mark `PYTHON_LISTS_KEY`)."""
    if not payloads:
        return [], [], []
    first = payloads[0]
    if set().union(*payloads) == first.keys():  # every row's keys are among the first row's
        names = list(first)
    else:  # the union, in order of first appearance
        union: dict[str, None] = {}
        for p in payloads:
            union.update(dict.fromkeys(p))
        names = list(union)
    arrays, lists = [], []
    for name in names:
        values = [p.get(name) for p in payloads]
        kinds = set(map(type, values))
        kinds.discard(type(None))
        if np.ndarray in kinds:  # lists of numbers reach records as numpy arrays (and lists, once edited)
            arrays.append(_array_of_arrays(values, name, op_name))
            continue
        if len(kinds) > 1:
            shown = ", ".join(sorted(k.__name__ for k in kinds))
            raise WrongTypeError(
                f"operator {op_name!r} returned field {name!r} with mixed types ({shown}); "
                "return the same type for a field in every row (e.g. float(x))."
            )
        try:
            arrays.append(pa.array(values))
        except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
            raise WrongTypeError(
                f"operator {op_name!r} returned field {name!r} with values Arrow cannot "
                f"hold in one column ({err}); return the same type for it in every row."
            ) from err
        if pa.types.is_list(arrays[-1].type):
            lists.append(name)
    return names, arrays, lists


def _array_of_arrays(values: list[Any], name: str, op_name: str) -> pa.Array:
    """A list column of 1-D numpy arrays (lists and None allowed among them): one concatenation,
    no Python object per element."""
    # A list among the arrays (a row an operator rebuilt) takes their dtype if its values fit.
    dtype = np.result_type(*(v for v in values if isinstance(v, np.ndarray)))
    rows = [None if v is None else v if isinstance(v, np.ndarray) else _as_dtype(v, dtype) for v in values]
    present = [r for r in rows if r is not None]
    if any(r.ndim != 1 for r in present) or len({r.dtype for r in present}) > 1:
        shown = sorted({f"{r.ndim}-D {r.dtype}" for r in present})
        raise WrongTypeError(
            f"operator {op_name!r} returned field {name!r} with arrays of different kinds "
            f"({', '.join(shown)}); return 1-D arrays of one dtype (or lists) in every row."
        )
    lengths = np.array([0 if r is None else len(r) for r in rows], np.int64)
    offsets = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = pa.array(np.concatenate(present) if present else np.zeros(0, np.int64))
    mask = pa.array([r is None for r in rows]) if any(r is None for r in rows) else None
    if offsets[-1] < 2**31:
        return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), flat, mask=mask)
    return pa.LargeListArray.from_arrays(pa.array(offsets), flat, mask=mask)


def _as_dtype(values: Any, dtype: np.dtype) -> np.ndarray:
    """``values`` (a list) as an array of ``dtype`` when that keeps every value, else as numpy
    infers it."""
    inferred = np.asarray(values)
    cast = inferred.astype(dtype)
    return cast if np.array_equal(cast, inferred) else inferred


def check_records(out: Any, *, op_name: str, what: str = "process_many") -> list[SampleRecord]:
    """``out`` as a list of records, or a `WrongTypeError` saying what to return instead."""
    if not isinstance(out, (list, tuple)) or any(not isinstance(r, SampleRecord) for r in out):
        got = (
            type(out).__name__
            if not isinstance(out, (list, tuple))
            else next(type(r).__name__ for r in out if not isinstance(r, SampleRecord))
        )
        raise WrongTypeError(
            f"operator {op_name!r}: {what} must return a list of SampleRecord, got {got} (rebuild "
            "record.payload and return the record that carried it, not dicts or tensors)."
        )
    return list(out)


def frame_of_records(records: Sequence[SampleRecord], *, op_name: str = "records") -> pa.Table:
    """A frame of records: their meta as bookkeeping (lane, chunk, offset, sample id,
    component, lineage, pad length) and their payloads. Tombstones (dropped samples) are left
    out; a record with no payload that is not a tombstone is an error."""
    metas = [r.meta for r in records]
    # Tags (tombstone, pad length) live in meta.tags: with none anywhere (the common case, plain
    # SampleMeta), every record is kept and no row has a pad length.
    tags = [m.tags for m in metas]
    plain = set(map(type, metas)) == {SampleMeta} and set(map(type, tags)) == {dict} and not any(tags)
    if plain:
        kept = list(records)
    else:
        kept = [r for r in records if not r.meta.tombstone]
        metas = [r.meta for r in kept]
    payloads = [r.payload for r in kept]
    if set(map(type, payloads)) - {dict}:
        for r in kept:
            if not isinstance(r.payload, dict):
                raise WrongTypeError(
                    f"operator {op_name!r} returned a record of sample {r.meta.sample_id} whose payload is a "
                    f"{type(r.payload).__name__}; a payload is a dict (return tombstones_for_record(record) to "
                    "drop it)."
                )
    n = len(metas)
    # One list per field (C-level attribute reads, no per-record tuple for the GC to track).
    lanes, chunks, offsets, samples, lineages, counts = (list(map(get, metas)) for get in _META_FIELDS)
    if n and set(map(len, samples)) == {3}:
        dataset, shard, row = (np.array(x, np.int64) for x in zip(*samples))
    else:  # none, or malformed ids: numpy says what is wrong with them
        sample = np.array(samples, dtype=np.int64).reshape(n, 3)
        dataset, shard, row = sample[:, 0], sample[:, 1], sample[:, 2]
    components = [next(iter(c), 0) for c in counts]  # each meta's first component (0 for none)
    # The bookkeeping columns of F.pointer_frame, then lineage and pad length where any row has
    # them, then the payload: what F.with_payload(book, payloads_to_table(...)) gives.
    arrays = [
        pa.array(np.array(lanes, np.int32)),
        pa.array(np.array(chunks, np.int64)),
        pa.array(np.array(offsets, np.int32)),
        pa.array(dataset.astype(np.int32)),
        pa.array(shard.astype(np.int32)),
        pa.array(row),
        pa.array(np.array(components, np.int32)),
    ]
    names = list(F.BOOKKEEPING)
    if any(lineages):
        arrays.append(pa.array([list(g) for g in lineages], pa.list_(pa.int32())))
        # A fan-out child that does not end its sample (spawn_child(is_last_child=False)).
        arrays.append(pa.array([False] * n if plain else [_is_open(m) for m in metas], pa.bool_()))
        names += [F.LINEAGE, F.OPEN]
    pads = () if plain else [m.padding_length for m in metas]
    if any(p is not None for p in pads):  # a packed row's pad tail stays masked downstream
        arrays.append(pa.array([p or 0 for p in pads], pa.int32()))
        names.append(F.PADDING_LENGTH)
    payload_names, payload_arrays, lists = _payload_arrays(payloads, op_name)  # type: ignore[arg-type]
    return as_python_lists(pa.Table.from_arrays(arrays + payload_arrays, names=names + payload_names), lists)


def _is_open(meta: SampleMeta) -> bool:
    """Whether a record is a piece that does not end its sample: it has contributors and none
    of them closes."""
    refs = meta.contributors
    return bool(refs) and not any(ref.is_last_child for ref in refs)


#: What `frame_of_records` reads of each meta.
_META_FIELDS = tuple(
    map(attrgetter, ("lane_id", "chunk_id", "chunk_offset", "sample_id", "lineage", "component_sample_counts"))
)
