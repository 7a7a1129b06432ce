"""Row and batch views of frames: `SampleRecord`, `SampleBatch`, and `SampleBatch.to_training`.

Frames stay columnar inside the engine; these are what the caller sees. A `SampleBatch`
wraps one lane's rows as an Arrow table and turns the token column into torch tensors
without per-row Python loops (`to_training`). A `SampleRecord` is a row view (payload dict +
metadata), built only when someone asks for records.

Example:
    >>> batch.to_training(return_labels=True)["input_ids"].shape  # doctest: +SKIP
    torch.Size([8, 2047])
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Literal, Mapping, Sequence, TypeAlias

import numpy as np
import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.errors import ConfigError
if TYPE_CHECKING:
    import torch

from zephon_columnar.records import (  # noqa: F401  (the record vocabulary, re-exported here as in Zephon)
    ContributorRef,
    FieldsByDataset,
    SampleCursor,
    SampleId,
    SampleMeta,
    SampleRecord,
    frame_of_records,
    records_of,
)

# The identifiers of Zephon's data model (all plain ints and tuples of them).
DatasetId = int
ShardId = int
LocalSampleId = int
LaneId = int
ChunkId = int
ChunkOffset = int
ComponentId = int
LineageIndex = int
LineagePath = tuple[LineageIndex, ...]
#: A record's place in the stream, the order checkpoints and comparisons use:
#: chunk, offset in the chunk, lineage (fan-out path), then the sample id as a tie-break.
SampleCursorKey = tuple[ChunkId, ChunkOffset, LineagePath, SampleId]

PositionMode = Literal["preserve", "sequence"]
TOKEN_FIELD_CANDIDATES = ("input_ids", "tokens", "token_ids", "ids")
PADDING_LENGTH = F.PADDING_LENGTH  # trailing pad count of a packed row, when packing made it


class SampleBatch:
    """A lane-pure batch of rows, held as an Arrow table (payload + bookkeeping columns).

    ``records`` gives row views; ``to_training`` gives torch tensors.
    """

    __slots__ = ("table", "_records", "_fields")

    def __init__(self, table: pa.Table | Sequence[SampleRecord] | None = None, *,
                 records: Sequence[SampleRecord] | None = None, fields: FieldsByDataset | None = None) -> None:
        if (table is None) == (records is None):
            raise TypeError("SampleBatch: pass the rows once, as an Arrow table or as records "
                            "(SampleBatch(records=[...]), Zephon's form).")
        given: tuple[SampleRecord, ...] | None = None
        if table is None or not isinstance(table, pa.Table):
            given = tuple(records if records is not None else table)  # type: ignore[arg-type]
            table = frame_of_records(list(given))
        self.table = table
        # Records given are kept as given (their payload objects too): ``records`` returns them.
        self._records: tuple[SampleRecord, ...] | None = given
        self._fields = fields

    def __len__(self) -> int:
        return self.table.num_rows

    def __repr__(self) -> str:
        return f"SampleBatch(rows={self.table.num_rows}, fields={F.payload_names(self.table)})"

    @property
    def records(self) -> tuple[SampleRecord, ...]:
        if self._records is None:
            self._records = tuple(records_of(self.table, self._fields))
        return self._records

    @property
    def ids(self) -> tuple[SampleId, ...]:
        t = self.table
        return tuple(zip(*(t.column(c).to_pylist() for c in (F.DATASET, F.SHARD, F.ROW))))

    @property
    def lane_id(self) -> int:
        return int(self.table.column(F.LANE)[0].as_py()) if self.table.num_rows else -1

    @property
    def lineage_paths(self) -> tuple[tuple[int, ...], ...]:
        return tuple(F.lineage_paths(self.table))

    def column(self, name: str) -> pa.ChunkedArray:
        return self.table.column(name)

    def to_pydict(self) -> dict[str, list[Any]]:
        """Payload columns as Python lists (the batch's columns: a field that only some rows'
        datasets have is None in the others; ``records`` leaves it out there)."""
        return F.payload_of(self.table).to_pydict()

    # ------------------------------------------------------------------ training tensors
    def to_training(
        self,
        *,
        tokens_field: str = "auto",
        return_labels: bool = False,
        dtype: Any = "auto",
        extra_fields: Sequence[str] = (),
        ignore_index: int = -100,
        rename_fields: Mapping[str, str] | None = None,
        flatten: bool = False,
        exclude_fields: Sequence[str] = (),
        return_num_valid_tokens: bool = False,
        return_loss_mask: bool = False,
        return_cu_seqlens: bool = False,
        return_padding_mask: bool = False,
        eos_mask_loss: bool = False,
        eos_token_id: int | None = None,
        position_mode: PositionMode = "preserve",
        pad_token_id: int = 0,
        zero_copy: bool = False,
    ) -> dict[str, Any]:
        """Training tensors for this batch: ``input_ids`` (B, L) int64 and friends.

        Rows of equal length become a (B, L) view of the Arrow buffer (one dtype copy at most,
        int32 -> int64). Ragged rows are right-padded with ``pad_token_id`` (default 0) and the
        pad is masked: ``padding_mask`` is True there, labels there are ``ignore_index``, and it
        is left out of ``num_valid_tokens``. Packed rows' trailing pad (``meta.padding_length``)
        is masked the same way.

        Tensors never alias loader memory unless ``zero_copy=True``: then int64 token rows are
        views of the Arrow buffers (no copy at all), which must not be modified in place (they
        may be the in-memory dataset itself, or a cached row group read again later).

        With ``return_labels`` the inputs are ``tokens[:, :-1]`` and labels ``tokens[:, 1:]``;
        labels are ``ignore_index`` at pad, where a payload ``loss_mask`` is 0, and (with
        ``eos_mask_loss``) where the input token is ``eos_token_id``. ``positions`` is forwarded
        when the payload has it (``position_mode="sequence"`` gives ``0..L-1`` instead);
        ``cu_seqlens``/``max_seqlen`` come from the zeros of positions. ``ids`` (sample ids)
        and ``texts`` are always included.

        Example:
            >>> t = batch.to_training(return_labels=True, return_padding_mask=True)  # doctest: +SKIP
            >>> t["input_ids"].dtype, t["labels"].shape  # doctest: +SKIP
            (torch.int64, torch.Size([8, 2047]))
        """
        if position_mode not in ("preserve", "sequence"):
            raise ConfigError(f"to_training: position_mode={position_mode!r}; use 'preserve' or 'sequence'.")
        if eos_mask_loss and eos_token_id is None:
            raise ConfigError("to_training: eos_mask_loss=True needs eos_token_id=<id of your EOS token>.")
        table = self.table
        field_name = _resolve_tokens_field(table, tokens_field)
        tokens, lengths = _stack_list_column(table.column(field_name), pad_token_id, field_name)
        b, s = tokens.shape
        pad = _pad_mask(lengths, b, s, table)
        schema = table.schema
        names = _Names(schema)

        loss_mask_payload = None
        if "loss_mask" in names and field_name != "loss_mask":
            if return_labels and "loss_mask" in extra_fields:
                raise ConfigError("to_training: 'loss_mask' is consumed automatically with return_labels; "
                                  "remove it from extra_fields.")
            loss_mask_payload, _ = _stack_list_column(table.column("loss_mask"), 0, "loss_mask")

        positions = None
        if position_mode == "sequence":
            positions = np.broadcast_to(np.arange(s, dtype=np.int64), (b, s))
        elif "positions" in names:
            positions, _ = _stack_list_column(table.column("positions"), 0, "positions")

        extras = {}
        for name in extra_fields:
            if name not in names:
                raise ConfigError(f"to_training: extra field {name!r} is not in the batch "
                                  f"(fields: {F.payload_names(table)}).")
            extras[name], _ = _stack_list_column(table.column(name), 0, name)

        out: dict[str, Any] = {}
        # ``pad`` is None when no position is padding (the common case of packed, equal rows):
        # the masks below are then built only when asked for.
        if return_labels:
            inputs, labels = tokens[:, :-1], tokens[:, 1:]
            valid = _valid_mask(pad, loss_mask_payload, inputs, eos_token_id if eos_mask_loss else None,
                                shape=labels.shape, shift=1)
            out["input_ids"] = inputs
            out["labels"] = labels if valid is None else np.where(valid, labels, ignore_index)
            input_pad = None if pad is None else pad[:, :-1]
            if positions is not None:
                positions = positions[:, :-1]
            extras = {k: v[:, :-1] for k, v in extras.items()}
        else:
            valid = _valid_mask(pad, loss_mask_payload, tokens, eos_token_id if eos_mask_loss else None,
                                shape=tokens.shape, shift=0)
            input_pad = pad
            out["input_ids"] = tokens
        if positions is not None:
            out["positions"] = positions
        out.update(extras)
        shape = out["input_ids"].shape
        if return_loss_mask:
            out["loss_mask"] = np.ones(shape, np.float32) if valid is None else valid.astype(np.float32)
        if return_padding_mask or return_cu_seqlens:
            input_pad = np.zeros(shape, dtype=bool) if input_pad is None else input_pad
        if return_padding_mask:
            out["padding_mask"] = input_pad
        if return_cu_seqlens:
            out["cu_seqlens"], out["max_seqlen"] = _cu_seqlens(positions, input_pad, flatten)
        if flatten:
            out = {k: (v.reshape(-1) if k not in ("cu_seqlens", "max_seqlen") else v) for k, v in out.items()}

        out = {k: _convert(v, dtype, k, zero_copy) for k, v in out.items()}
        if return_num_valid_tokens:
            out["num_valid_tokens"] = int(shape[0] * shape[1]) if valid is None else int(valid.sum())
        out["ids"] = list(self.ids)
        out["texts"] = table.column("text").to_pylist() if "text" in names else [""] * b
        if rename_fields:
            out = {rename_fields.get(k, k): v for k, v in out.items()}
        for name in exclude_fields:
            out.pop(name, None)
        return out


# ---------------------------------------------------------------------- helpers
class _Names:
    """Membership test on a schema's field names without building the list of names (which
    costs more than the rest of a small batch's conversion)."""

    __slots__ = ("_schema",)

    def __init__(self, schema: pa.Schema) -> None:
        self._schema = schema

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._schema.get_field_index(name) >= 0


def _column_numpy(table: pa.Table, name: str) -> np.ndarray:
    col = table.column(name)
    return _numpy_view(col.chunk(0) if col.num_chunks == 1 else col.combine_chunks())


def _numpy_view(arr: pa.Array) -> np.ndarray:
    """Read-only numpy view of a null-free integer/float array (a copy otherwise)."""
    t = arr.type
    if arr.null_count or not (pa.types.is_integer(t) or pa.types.is_floating(t)):
        return arr.to_numpy(zero_copy_only=False)
    return arr.to_numpy()  # zero-copy and read-only


def _resolve_tokens_field(table: pa.Table, tokens_field: str) -> str:
    names = _Names(table.schema)
    if tokens_field != "auto":
        if tokens_field not in names:
            raise ConfigError(f"to_training: tokens_field={tokens_field!r} is not in the batch "
                              f"(fields: {F.payload_names(table)}).")
        return tokens_field
    for cand in TOKEN_FIELD_CANDIDATES:
        if cand in names:
            return cand
    raise ConfigError(
        f"to_training: no token field in the batch (looked for {list(TOKEN_FIELD_CANDIDATES)}; "
        f"fields: {F.payload_names(table)}). Tokenize first or pass tokens_field=<name>."
    )


def _list_array(col: pa.ChunkedArray, name: str) -> pa.Array:
    arr = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)
            or pa.types.is_fixed_size_list(arr.type)):
        raise ConfigError(f"to_training: field {name!r} has type {arr.type}, not a list of numbers.")
    if arr.null_count:
        raise ConfigError(f"to_training: field {name!r} has {arr.null_count} null rows; "
                          "filter them out or fill them before batching.")
    return arr


_OFFSETS, _LARGE_OFFSETS = np.dtype(np.int32), np.dtype(np.int64)


def _list_parts(arr: pa.Array, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(values, offsets) of a list array as numpy views of its buffers; ``values`` covers
    exactly the array's rows and ``offsets`` index into the child array (they start at
    ``offsets[0]``, not necessarily 0).

    Reading the buffers directly costs a few microseconds; ``ListArray.flatten`` goes through
    Arrow's compute layer and costs several times more per batch.
    """
    t = arr.type
    b = len(arr)
    child = arr.values  # the whole child array; the list's own offset is applied below
    if pa.types.is_fixed_size_list(t):
        k = t.list_size
        offsets = np.arange(arr.offset, arr.offset + b + 1, dtype=np.int64) * k
    else:
        width = _LARGE_OFFSETS if pa.types.is_large_list(t) else _OFFSETS
        offsets = np.frombuffer(arr.buffers()[1], dtype=width, count=b + 1, offset=arr.offset * width.itemsize)
    vtype = child.type
    if not (pa.types.is_integer(vtype) or pa.types.is_floating(vtype)) or child.null_count:
        # Booleans are bit-packed and nulls need a check: the general (slower) path.
        flat = arr.flatten()
        if flat.null_count:
            first_null = int(np.flatnonzero(flat.is_null().to_numpy(zero_copy_only=False))[0])
            row = int(np.searchsorted(offsets - offsets[0], first_null, side="right")) - 1
            raise ConfigError(f"to_training: field {name!r} has {flat.null_count} null element(s), the first in "
                              f"batch row {row}; fill or drop them before batching.")
        return flat.to_numpy(zero_copy_only=False), offsets
    # A read-only view of loader memory: to_training copies it unless zero_copy=True.
    return _numpy_view(child)[offsets[0]:offsets[-1]], offsets


def _stack_list_column(col: pa.ChunkedArray, pad_value: int, name: str) -> tuple[np.ndarray, np.ndarray | None]:
    """(B, S) numpy array of a list column and the row lengths, or None for the lengths when
    every row has length S (then the array is a view: a plain reshape of the values)."""
    arr = _list_array(col, name)
    b = len(arr)
    values, offsets = _list_parts(arr, name)
    if b == 0:
        return values.reshape(0, 0), np.zeros(0, np.int64)
    lengths = offsets[1:] - offsets[:-1]
    s = int(lengths.max())
    if len(values) == b * s:  # every row has the maximum length
        return values.reshape(b, s), None
    lengths = lengths.astype(np.int64)
    out = np.full((b, s), pad_value, dtype=values.dtype)
    rows = np.repeat(np.arange(b), lengths)
    cols = np.arange(len(values)) - np.repeat(offsets[:-1] - offsets[0], lengths)
    out[rows, cols] = values
    return out, lengths


def _pad_mask(lengths: np.ndarray | None, b: int, s: int, table: pa.Table) -> np.ndarray | None:
    """True where a position is padding: past a ragged row's end (``lengths``; None when all
    rows have length ``s``), or in a packed row's pad tail (``__padding_length``). None when
    nothing is padding."""
    if b == 0 or s == 0:
        return None
    pad_tail = None
    if table.schema.get_field_index(PADDING_LENGTH) >= 0:
        pad_tail = _column_numpy(table, PADDING_LENGTH)
        if not np.count_nonzero(pad_tail):  # cheaper than .any() on a handful of rows
            pad_tail = None
    if lengths is None:
        if pad_tail is None:
            return None
        real = s - pad_tail.astype(np.int64)
    else:
        real = lengths if pad_tail is None else lengths - pad_tail.astype(np.int64)
        if int(real.min()) >= s:
            return None
    return np.arange(s)[None, :] >= real[:, None]


def _valid_mask(pad: np.ndarray | None, loss_mask: np.ndarray | None, inputs: np.ndarray,
                eos_token_id: int | None, *, shape: tuple[int, ...], shift: int) -> np.ndarray | None:
    """Positions that count for the loss (None: all of them). ``shift=1`` aligns the pad and
    payload loss mask with labels (``tokens[:, 1:]``)."""
    valid = None if pad is None else ~pad[:, shift:]
    if loss_mask is not None:
        lm = loss_mask[:, shift:] != 0
        valid = lm if valid is None else valid & lm
    if eos_token_id is not None:
        not_eos = inputs != eos_token_id
        valid = not_eos if valid is None else valid & not_eos
    return valid


def _cu_seqlens(positions: np.ndarray | None, pad: np.ndarray, flatten: bool) -> tuple[np.ndarray, np.ndarray]:
    b, s = pad.shape
    if positions is None:
        starts = np.zeros((b, s), dtype=bool)
        starts[:, 0] = True
    else:
        starts = positions == 0
        starts[:, 0] = True
    if pad.any():
        # The pad tail is one segment of its own (as packing emits it), not one per position.
        first_pad = pad & ~np.concatenate([np.zeros((b, 1), bool), pad[:, :-1]], axis=1)
        starts = (starts & ~pad) | first_pad
    if flatten:
        idx = np.flatnonzero(starts.reshape(-1))
        cu = np.append(idx, b * s).astype(np.int32)
        return cu, np.array(int(np.diff(cu).max()) if len(cu) > 1 else 0, dtype=np.int32)
    counts = starts.sum(axis=1)
    k = int(counts.max()) + 1 if b else 1
    cu = np.full((b, k), s, dtype=np.int32)
    r, c = np.nonzero(starts)
    slot = np.arange(len(r)) - np.repeat(np.cumsum(counts) - counts, counts)
    cu[r, slot] = c
    max_seqlen = np.diff(cu, axis=1).max(axis=1).astype(np.int32) if k > 1 else np.zeros(b, np.int32)
    return cu, max_seqlen


def _convert(value: np.ndarray, dtype: Any, name: str, zero_copy: bool) -> Any:
    if dtype is None:
        return value.tolist()
    # Masks, float fields and sequence metadata keep their dtype; token-like ints follow dtype.
    keep = value.dtype == np.bool_ or value.dtype.kind not in "iu" or name in ("cu_seqlens", "max_seqlen")
    if isinstance(dtype, str) and dtype == "auto":
        import torch

        return torch.from_numpy(_owned(value, value.dtype if keep else np.dtype(np.int64), zero_copy))
    try:
        import torch
    except ImportError:  # numpy dtypes work without torch
        torch = None  # type: ignore[assignment]
    if torch is not None and isinstance(dtype, torch.dtype):
        t = torch.from_numpy(_owned(value, value.dtype, zero_copy))
        return t if keep else t.to(dtype)
    return value if keep else value.astype(np.dtype(dtype))


def _owned(value: np.ndarray, dtype: np.dtype, zero_copy: bool) -> np.ndarray:
    """A C-contiguous array of ``dtype`` that the caller may write to: ``value`` itself when it
    already is one (arrays built here are writable; views of Arrow buffers are read-only), else a
    copy. ``zero_copy`` hands read-only Arrow views over as they are."""
    if value.dtype == dtype and value.flags.c_contiguous and (value.flags.writeable or zero_copy):
        return value
    return np.array(value, dtype=dtype, order="C", copy=True)


# Zero-copy hand-off of Arrow buffers: torch warns that they are read-only; the tensors are
# views of immutable loader data, so the warning (for that message only) is noise.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


# What a payload holds: Arrow columns become these when records are made (lists of numbers as
# numpy arrays), and what user operators may put back.
SampleNumeric: TypeAlias = "int | float | complex | np.number[Any]"
SamplePayloadArray: TypeAlias = "np.ndarray[Any, Any] | torch.Tensor"
SamplePayloadAtom: TypeAlias = ("bytes | memoryview | str | SampleNumeric | np.datetime64 | np.timedelta64 | "
                                "SamplePayloadArray | None")
SamplePayload: TypeAlias = "SamplePayloadAtom | list[SamplePayload] | dict[Any, SamplePayload]"
SamplePayloadDict: TypeAlias = "dict[Any, SamplePayload]"
#: What flows between operators: a record, or (after ``batch``) a batch of them.
StreamItem: TypeAlias = "SampleRecord | SampleBatch"

__all__ = [
    "ChunkId", "ChunkOffset", "ComponentId", "ContributorRef", "DatasetId", "LaneId", "LineageIndex", "LineagePath",
    "LocalSampleId", "SampleBatch", "SampleCursor", "SampleCursorKey", "SampleId", "SampleMeta", "SampleNumeric",
    "SamplePayload", "SamplePayloadArray", "SamplePayloadAtom", "SamplePayloadDict", "SampleRecord", "ShardId",
    "StreamItem",
]
