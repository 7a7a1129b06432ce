"""The frame: the unit that flows between operators.

A frame is a ``pyarrow.Table`` (its chunks are record batches) holding the payload columns
plus reserved bookkeeping columns whose names start with ``__``. Bookkeeping says, per row,
which lane and chunk the row came from and which source sample it is; operators read and
write payload columns and carry bookkeeping through untouched (a filter keeps the rows it
keeps, bookkeeping included).

Example:
    >>> import numpy as np
    >>> f = pointer_frame(lane=0, chunk_id=3, offsets=np.arange(2), pointers=np.array([[0, 1, 5], [0, 1, 6]]),
    ...                   components=np.zeros(2, np.int32))
    >>> f.column_names[:3]
    ['__lane', '__chunk', '__offset']
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

LANE = "__lane"
CHUNK = "__chunk"
OFFSET = "__offset"
DATASET = "__dataset"
SHARD = "__shard"
ROW = "__row"
COMPONENT = "__component"
#: Fan-out path of a row (list<int32>): the child index at each fan-out it went through, e.g.
#: ``[2]`` for the third piece of a document that ``tokenize(split_long_samples=True)`` cut.
#: Readers treat absent or null as ``()``. Canonical form, so that a delivered table does not
#: depend on how rows were cut into frames: after an operator that can fan out (a splitting
#: tokenize, expand_chat) the column is present on every frame, ``[]`` for rows that were not
#: cut, never null (`with_lineage_column`, `with_children`, `concat_frames`).
LINEAGE = "__lineage"
#: Whether a row is a piece that does not end its source sample (bool): a child of a fan-out
#: that is not its parent's last child (or a child of such a piece). Records report it as
#: their contributor's ``is_last_child``; packing counts a sample on the piece that ends it.
#: On frames it sits right after ``__lineage``, in the same canonical form; references
#: (`refs_of`) leave it out, as the operators compute it again. Absent or null means False.
OPEN = "__open"
#: Trailing pad tokens of a packed row (int32), where packing made the row.
PADDING_LENGTH = "__padding_length"
#: A packed row's pieces, in order (see `zephon_columnar.ops.pack.emit`).
SEGMENTS = "__segments"
SEGMENT_STRUCT = pa.struct(
    [
        ("dataset", pa.int32()),
        ("shard", pa.int32()),
        ("row", pa.int64()),
        ("chunk", pa.int64()),
        ("offset", pa.int32()),
        ("component", pa.int32()),
        ("lineage", pa.list_(pa.int32())),
        ("start", pa.int64()),
        ("length", pa.int32()),
        ("closes", pa.bool_()),
    ]
)
#: Carried rows (pieces of documents) say how many tokens of their document came before them.
TOKEN_SKIP = "__token_skip"

BOOKKEEPING: tuple[str, ...] = (LANE, CHUNK, OFFSET, DATASET, SHARD, ROW, COMPONENT)
BOOKKEEPING_SCHEMA = pa.schema(
    [
        (LANE, pa.int32()),
        (CHUNK, pa.int64()),
        (OFFSET, pa.int32()),
        (DATASET, pa.int32()),
        (SHARD, pa.int32()),
        (ROW, pa.int64()),
        (COMPONENT, pa.int32()),
    ]
)


def is_bookkeeping(name: str) -> bool:
    return name.startswith("__")


def lineage_paths(frame: pa.Table) -> list[tuple[int, ...]]:
    """Each row's lineage path as a tuple (``()`` where the column is absent or null)."""
    if LINEAGE not in frame.column_names:
        return [()] * frame.num_rows
    return [tuple(p) if p else () for p in frame.column(LINEAGE).to_pylist()]


def lineage_parts(frame: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(offsets int64 (n + 1), flat int32 values) of the rows' lineage paths; rows without one
    have an empty path."""
    n = frame.num_rows
    if LINEAGE not in frame.column_names:
        return np.zeros(n + 1, np.int64), np.zeros(0, np.int32)
    arr = frame.column(LINEAGE).combine_chunks()
    lens = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    values = (
        pc.list_flatten(arr).to_numpy(zero_copy_only=False).astype(np.int32) if offsets[-1] else np.zeros(0, np.int32)
    )
    return offsets, values


def lineage_array(frame: pa.Table) -> pa.ListArray:
    """The rows' lineage paths as one list<int32> array without nulls (``[]`` where the column
    is absent or null)."""
    offsets, values = lineage_parts(frame)
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values, pa.int32()))


def open_rows(frame: pa.Table) -> np.ndarray:
    """Each row's ``__open`` flag as a bool array (False where the column is absent or null)."""
    if OPEN not in frame.column_names:
        return np.zeros(frame.num_rows, bool)
    flags: np.ndarray = pc.fill_null(frame.column(OPEN), False).to_numpy(zero_copy_only=False).astype(bool)
    return flags


def _set_lineage(frame: pa.Table, column: pa.Array, open_: np.ndarray | None = None) -> pa.Table:
    """``frame`` with the ``__lineage`` column ``column`` and, right after it, ``__open``
    (``open_``, or the frame's own flags without nulls)."""
    flags = pa.array(open_rows(frame) if open_ is None else open_, pa.bool_())
    if OPEN in frame.column_names:
        frame = frame.remove_column(frame.column_names.index(OPEN))
    if LINEAGE in frame.column_names:
        at = frame.column_names.index(LINEAGE)
        frame = frame.set_column(at, LINEAGE, column)
    else:
        at = frame.num_columns
        frame = frame.append_column(LINEAGE, column)
    return frame.add_column(at + 1, OPEN, flags)


def with_lineage_column(frame: pa.Table) -> pa.Table:
    """``frame`` with its ``__lineage`` and ``__open`` columns in canonical form: present,
    ``[]`` / False for rows without a path, never null. What an operator that can fan out
    returns for a frame in which no row fanned out, so that whether the columns exist never
    depends on which rows shared a frame. The frame itself when it already is canonical."""
    names = frame.column_names
    if LINEAGE in names and OPEN in names and names.index(OPEN) == names.index(LINEAGE) + 1:
        column, flags = frame.column(LINEAGE), frame.column(OPEN)
        if column.null_count == 0 and column.type == pa.list_(pa.int32()) and flags.null_count == 0:
            return frame
    return _set_lineage(frame, lineage_array(frame))


def with_children(book: pa.Table, parent: np.ndarray, child: np.ndarray) -> pa.Table:
    """Bookkeeping of fan-out children: row ``parent[i]`` of ``book`` for output row i, whose
    lineage is its parent's extended by ``child[i]`` (its index among the parent's children),
    or left as the parent's where ``child[i] < 0`` (a parent that did not fan out). ``parent``
    is non-decreasing; a parent's last output row is the child that ends it, the others are
    ``__open`` (as are all children of an open parent).

    The result always has the ``__lineage`` column (``[]`` for rows without a path, never null),
    even when no row fanned out: whether a row's frame held another row that fanned out must not
    decide whether its bookkeeping has the column."""
    offsets, values = lineage_parts(book)
    taken = book.take(pa.array(parent))
    extend = (child >= 0).astype(np.int64)
    plens = np.diff(offsets)[parent]
    new_off = np.zeros(len(parent) + 1, np.int64)
    np.cumsum(plens + extend, out=new_off[1:])
    flat = np.empty(int(new_off[-1]), np.int32)
    own = new_off[1:][extend == 1] - 1
    flat[own] = child[extend == 1]
    if len(values):
        inherited = np.ones(len(flat), bool)
        inherited[own] = False
        starts = np.repeat(offsets[:-1][parent], plens)
        within = np.arange(int(plens.sum())) - np.repeat(np.cumsum(plens) - plens, plens)
        flat[inherited] = values[starts + within]
    column = pa.ListArray.from_arrays(pa.array(new_off.astype(np.int32)), pa.array(flat, pa.int32()))
    last = np.ones(len(parent), bool)
    last[:-1] = parent[1:] != parent[:-1]
    open_ = open_rows(book)[parent] | ((child >= 0) & ~last)
    return _set_lineage(taken, column, open_)


def row_keys(frame: pa.Table) -> np.ndarray:
    """A 64-bit identity per row from (chunk, offset, lineage): equal for the same row
    however frames are cut, different (but for hash collisions) for different rows. What
    seeded randomness (shuffle) is derived from."""
    chunk = frame.column(CHUNK).to_numpy().astype(np.uint64)
    offset = frame.column(OFFSET).to_numpy().astype(np.uint64)
    key = mix64(chunk * np.uint64(0x9E3779B97F4A7C15) ^ offset)
    offsets, values = lineage_parts(frame)
    if len(values):
        # Fold each path into the key: h = mix(h * P + (v + 1)) per element, segment-wise.
        lens = np.diff(offsets)
        depth = int(lens.max())
        for d in range(depth):
            has = lens > d
            idx = offsets[:-1][has] + d
            key[has] = mix64(key[has] * np.uint64(0xBF58476D1CE4E5B9) + values[idx].astype(np.uint64) + np.uint64(1))
    return key


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, vectorized: a bijection of uint64 that scrambles every bit."""
    with np.errstate(over="ignore"):
        x = np.asarray(x, dtype=np.uint64)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        mixed: np.ndarray = x ^ (x >> np.uint64(31))
        return mixed


def pointer_frame(
    *, lane: int, chunk_id: int | np.ndarray, offsets: np.ndarray, pointers: np.ndarray, components: np.ndarray
) -> pa.Table:
    """A frame of bookkeeping only: the sample pointers that fetch turns into payload rows.

    ``pointers`` is an (n, 3) int64 array of (dataset_id, shard_id, row); ``chunk_id`` one
    chunk for every row, or one per row.
    """
    n = len(offsets)
    chunks = np.full(n, chunk_id, np.int64) if np.ndim(chunk_id) == 0 else np.asarray(chunk_id, np.int64)
    arrays = [
        pa.array(np.full(n, lane, np.int32)),
        pa.array(chunks),
        pa.array(np.asarray(offsets, np.int32)),
        pa.array(np.ascontiguousarray(pointers[:, 0], np.int32)),
        pa.array(np.ascontiguousarray(pointers[:, 1], np.int32)),
        pa.array(np.ascontiguousarray(pointers[:, 2], np.int64)),
        pa.array(np.asarray(components, np.int32)),
    ]
    return pa.Table.from_arrays(arrays, schema=BOOKKEEPING_SCHEMA)


def frame_of(payload: dict[str, Any] | pa.Table, *, lane: int = 0, chunk_id: int = 0, first_row: int = 0) -> pa.Table:
    """A frame of the given payload columns whose rows are samples ``first_row, first_row + 1,
    ...`` of dataset 0, shard 0, at offsets ``first_row...`` of chunk ``chunk_id`` (for examples
    and tests).

    Example:
        >>> frame_of({"input_ids": [[1, 2], [3]]}).column_names[-1]
        'input_ids'
    """
    table = payload if isinstance(payload, pa.Table) else pa.table(payload)
    n = table.num_rows
    rows = np.arange(first_row, first_row + n)
    pointers = np.stack([np.zeros(n, np.int64), np.zeros(n, np.int64), rows], axis=1)
    book = pointer_frame(
        lane=lane, chunk_id=chunk_id, offsets=rows, pointers=pointers, components=np.zeros(n, np.int32)
    )
    return with_payload(book, table)


def payload_names(frame: pa.Table | pa.RecordBatch) -> list[str]:
    return [n for n in frame.column_names if not is_bookkeeping(n)]


def bookkeeping_of(frame: pa.Table) -> pa.Table:
    return frame.select([n for n in frame.column_names if is_bookkeeping(n)])


def refs_of(frame: pa.Table) -> pa.Table:
    """A row's *reference*: its bookkeeping columns (source sample, lane, chunk, offset,
    component, lineage; for a packed row its ``__segments``). Enough to compute the row again
    through the operators that made it, which is how checkpoints hold rows without their data.
    (Per-row state a stage stored beside a reference, ``__s_*`` columns, is not part of it, nor
    ``__open``, which the operators compute again with the row.)"""
    return frame.select(
        [n for n in frame.column_names if is_bookkeeping(n) and n != OPEN and not n.startswith(("__s_", "__sf_"))]
    )


def payload_of(frame: pa.Table) -> pa.Table:
    return frame.select(payload_names(frame))


def with_payload(bookkeeping: pa.Table, payload: pa.Table) -> pa.Table:
    """Bookkeeping columns followed by payload columns (same number of rows)."""
    if bookkeeping.num_rows != payload.num_rows:
        raise ValueError(
            f"payload has {payload.num_rows} rows but bookkeeping has {bookkeeping.num_rows}; "
            "an operator must keep rows aligned with their bookkeeping"
        )
    cols = list(bookkeeping.columns) + list(payload.columns)
    # The fields themselves, so what an operator marked on one (its metadata) stays.
    return pa.Table.from_arrays(cols, schema=pa.schema(list(bookkeeping.schema) + list(payload.schema)))


def with_fields(payload: pa.Table, schema: pa.Schema) -> pa.Table:
    """``payload`` with every field of ``schema`` in its order, a field it lacks as nulls of
    the schema's type; its other columns follow. A mixture's fetch gives every frame the union
    of its datasets' fields this way, so a row's columns never depend on which rows shared its
    frame.

    Example:
        >>> t = with_fields(pa.table({"b": [1]}), pa.schema([("a", pa.string()), ("b", pa.int64())]))
        >>> t.column_names, t.column("a").to_pylist()
        (['a', 'b'], [None])
    """
    have = set(payload.column_names)
    names = [f.name for f in schema]
    if payload.column_names[: len(names)] == names:
        return payload
    wanted = set(names)
    columns = [payload.column(f.name) if f.name in have else pa.nulls(payload.num_rows, f.type) for f in schema]
    fields = [payload.schema.field(f.name) if f.name in have else f for f in schema]
    for fld in payload.schema:
        if fld.name not in wanted:
            columns.append(payload.column(fld.name))
            fields.append(fld)
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def no_fields(num_rows: int) -> pa.Table:
    """A table of ``num_rows`` rows without columns (rows with no field, e.g. ``{}``), which
    Arrow's ``from_pylist``, ``take`` and ``concat_tables`` would each count as no row at all.

    Example:
        >>> no_fields(3).num_rows, no_fields(3).num_columns
        (3, 0)
    """
    return pa.table({"_": pa.nulls(num_rows)}).drop_columns(["_"])


def concat_frames(frames: list[pa.Table]) -> pa.Table:
    """Concatenate frames zero-copy. A column missing or all-null in some frames is filled with
    nulls; a column whose type differs between frames is an error naming it (promoting int to
    float silently would make the column type depend on how rows were grouped).

    ``__lineage`` and ``__open`` are the exception to null filling: rows of a frame without them
    get ``[]`` and False, never null (see `LINEAGE`), so the joined table is the same however
    its rows were framed."""
    if len(frames) == 1:
        return frames[0]
    if frames and all(f.num_columns == 0 for f in frames):  # Arrow would count no row
        return no_fields(sum(f.num_rows for f in frames))
    try:
        joined = pa.concat_tables(frames, promote_options="default")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        types: dict[str, set[str]] = {}
        for f in frames:
            for fld in f.schema:
                types.setdefault(fld.name, set()).add(str(fld.type))
        clash = {k: sorted(v) for k, v in types.items() if len(v) > 1}
        from zephon_columnar.errors import PipelineError

        raise PipelineError(
            f"rows of one lane reached batching with different column types {clash}: an operator "
            "returns different types for the same field in different rows; make it return one type."
        ) from err
    names = joined.column_names
    has_open = OPEN in names  # references (`refs_of`) have lineage without it
    if LINEAGE in names and (joined.column(LINEAGE).null_count or (has_open and joined.column(OPEN).null_count)):
        # Some frame lacked the columns (or had nulls): [] and False instead, and the columns
        # where frames that have them keep them (after the source bookkeeping, as
        # `with_children` puts them), not at the end where promotion appends a column the
        # first frame lacked.
        column, flags = lineage_array(joined), open_rows(joined)
        joined = joined.drop_columns([c for c in (LINEAGE, OPEN) if c in names])
        at = joined.column_names.index(COMPONENT) + 1 if COMPONENT in joined.column_names else joined.num_columns
        joined = joined.add_column(at, LINEAGE, column)
        if has_open:
            joined = joined.add_column(at + 1, OPEN, pa.array(flags, pa.bool_()))
    return joined


def frame_to_ipc(frame: pa.Table) -> pa.Buffer:
    """Serialize a frame as an Arrow IPC stream (what crosses process boundaries)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, frame.schema) as writer:
        writer.write_table(frame)
    return sink.getvalue()


def frame_from_ipc(buf: pa.Buffer | bytes) -> pa.Table:
    return pa.ipc.open_stream(buf).read_all()


def frame_to_text(frame: pa.Table) -> str:
    """A frame as compact JSON-safe text (zstd-compressed Arrow IPC, base64): how a checkpoint
    holds the few rows it must keep by value."""
    import base64

    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(sink, frame.schema, options=options) as writer:
        writer.write_table(frame)
    return base64.b64encode(sink.getvalue().to_pybytes()).decode("ascii")


def frame_from_text(text: str) -> pa.Table:
    """Inverse of `frame_to_text`; ValueError if ``text`` is not such a frame."""
    import base64
    import binascii

    try:
        return frame_from_ipc(base64.b64decode(text.encode("ascii"), validate=True))
    except (binascii.Error, UnicodeEncodeError, AttributeError, pa.ArrowInvalid) as err:
        raise ValueError(f"not an encoded frame ({type(err).__name__}: {err})") from err
