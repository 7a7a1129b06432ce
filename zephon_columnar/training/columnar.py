"""The columnar path of `to_training`: a batch's Arrow table as training arrays, vectorized over
its buffers (no per-row Python loop).

Contract: `table_training` reads list columns as numpy views of their Arrow buffers where it
can (read-only views; copied unless ``zero_copy=True``), pads ragged rows with
``pad_token_id``, and builds labels, masks, positions and sequence metadata as the options ask
(rename and exclude are left to the caller, `conversion.to_training`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.errors import ConfigError
from zephon_columnar.training.options import TOKEN_FIELD_CANDIDATES, TrainingOptions
from zephon_columnar.training.segments import _NEEDS_POSITIONS, _segment_bounds

PADDING_LENGTH = F.PADDING_LENGTH  # trailing pad count of a packed row, when packing made it


def table_training(rows: pa.Table, o: TrainingOptions) -> dict[str, Any]:
    """to_training of an Arrow-backed batch (rename/exclude left to the caller): vectorized over
    the Arrow buffers, no per-row Python loop."""
    eos_token_id = o.eos_token_id if o.eos_mask_loss else None
    table = _one_record_batch(rows)  # the helpers below read plain arrays, not chunked columns
    field_name = _resolve_tokens_field(table, o.tokens_field)
    tokens, lengths = _stack_list_column(table.column(field_name), o.pad_token_id, field_name)
    b, s = tokens.shape
    pad = _pad_mask(lengths, b, s, table)
    names = _Names(table.schema)

    reserved = (
        ("ids", "texts", "input_ids")
        + (("labels",) if o.return_labels else ())
        + (("padding_mask",) if o.return_padding_mask else ())
    )
    for name in o.extra_fields:
        if name in reserved:
            raise ConfigError(
                f"to_training: extra_fields cannot overwrite generated field {name!r}; "
                "rename the payload field or drop it from extra_fields."
            )

    loss_mask_payload = None
    if "loss_mask" in names and field_name != "loss_mask":
        loss_mask_payload, _ = _stack_list_column(table.column("loss_mask"), 0, "loss_mask")

    payload_positions = None
    if "positions" in names:
        payload_positions, _ = _stack_list_column(table.column("positions"), 0, "positions")
    if o.return_cu_seqlens and payload_positions is None:
        raise ConfigError(_NEEDS_POSITIONS)
    positions = payload_positions
    if o.position_mode == "sequence":
        positions = np.broadcast_to(np.arange(s, dtype=np.int64), (b, s))

    extras = {}
    for name in o.extra_fields:
        if name not in names:
            raise ConfigError(
                f"to_training: Extra field {name!r} not found in the batch "
                f"(fields: {F.payload_names(rows)}); drop it from extra_fields."
            )
        extras[name], _ = _stack_list_column(table.column(name), 0, name)

    out: dict[str, Any] = {}
    # ``pad`` is None when no position is padding (the common case of packed, equal rows):
    # the masks below are then built only when asked for.
    if o.return_labels:
        inputs, labels = tokens[:, :-1], tokens[:, 1:]
        valid = _valid_mask(pad, loss_mask_payload, inputs, eos_token_id, shape=labels.shape, shift=1)
        out["input_ids"] = inputs
        out["labels"] = labels if valid is None else np.where(valid, labels, o.ignore_index)
        input_pad = None if pad is None else pad[:, :-1]
        if positions is not None:
            positions = positions[:, :-1]
        if payload_positions is not None:
            payload_positions = payload_positions[:, :-1]
        extras = {k: v[:, :-1] for k, v in extras.items()}
    else:
        valid = None
        input_pad = pad
        out["input_ids"] = tokens
    if positions is not None:
        out["positions"] = positions
    out.update(extras)
    if loss_mask_payload is not None and not o.return_labels and "loss_mask" not in out:
        out["loss_mask"] = loss_mask_payload  # passed through as the payload has it
    shape = out["input_ids"].shape
    if o.return_loss_mask:
        out["loss_mask"] = np.ones(shape, np.float32) if valid is None else valid.astype(np.float32)
    if o.return_padding_mask or o.return_cu_seqlens:
        input_pad = np.zeros(shape, dtype=bool) if input_pad is None else input_pad
    if o.return_padding_mask:
        out["padding_mask"] = input_pad
    meta: dict[str, Any] = {}
    if o.return_cu_seqlens and input_pad is not None:  # set just above whenever cu_seqlens is asked for
        cu, max_seqlen = _cu_seqlens(payload_positions, input_pad, o.flatten)
        meta = {"cu_seqlens": cu, "max_seqlen": int(max_seqlen) if o.flatten else max_seqlen}
    if o.flatten:
        out = {k: v.reshape(-1) for k, v in out.items()}
    if o.device is not None:  # host tensors in their own dtype, views where they can be; widened on the device
        import torch

        out = {k: torch.from_numpy(v) for k, v in out.items()}
        out.update({k: (v if isinstance(v, int) else torch.from_numpy(v)) for k, v in meta.items()})
    else:
        out = {k: _convert(v, o.dtype, k, o.zero_copy) for k, v in out.items()}
        out.update({k: (v if isinstance(v, int) else _convert(v, o.dtype, k, o.zero_copy)) for k, v in meta.items()})
    if o.return_num_valid_tokens:
        out["num_valid_tokens"] = int(shape[0] * shape[1]) if valid is None else int(valid.sum())
    out["ids"] = list(zip(*(table.column(c).to_pylist() for c in (F.DATASET, F.SHARD, F.ROW))))
    out["texts"] = table.column("text").to_pylist() if "text" in names else [""] * b
    return out


def _one_record_batch(table: pa.Table) -> pa.RecordBatch:
    """A non-empty table's rows as one record batch (combined first when its columns are chunked)."""
    batches = table.to_batches()
    return batches[0] if len(batches) == 1 else table.combine_chunks().to_batches()[0]


class _Names:
    """Membership test on a schema's field names without building the list of names (which
    costs more than the rest of a small batch's conversion)."""

    __slots__ = ("_schema",)

    def __init__(self, schema: pa.Schema) -> None:
        self._schema = schema

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._schema.get_field_index(name) >= 0


def _column_numpy(table: pa.RecordBatch, name: str) -> np.ndarray:
    return _numpy_view(table.column(name))


def _numpy_view(arr: pa.Array) -> np.ndarray:
    """Read-only numpy view of a null-free integer/float array (a copy otherwise)."""
    t = arr.type
    if arr.null_count or not (pa.types.is_integer(t) or pa.types.is_floating(t)):
        copied: np.ndarray = arr.to_numpy(zero_copy_only=False)
        return copied
    view: np.ndarray = arr.to_numpy()  # zero-copy and read-only
    return view


def _resolve_tokens_field(table: pa.RecordBatch, tokens_field: str) -> str:
    names = _Names(table.schema)
    if tokens_field != "auto":
        if tokens_field not in names:
            raise ConfigError(
                f"to_training: Field {tokens_field!r} (tokens_field) not found in the batch "
                f"(fields: {F.payload_names(table)}); pass one of them."
            )
        return tokens_field
    for cand in TOKEN_FIELD_CANDIDATES:
        if cand in names:
            return cand
    raise ConfigError(
        f"to_training: Cannot auto-detect tokens field: no token field in the batch (looked for "
        f"{list(TOKEN_FIELD_CANDIDATES)}; fields: {F.payload_names(table)}). Tokenize first or pass "
        "tokens_field=<name>."
    )


def _list_array(arr: pa.Array, name: str) -> pa.Array:
    if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type) or pa.types.is_fixed_size_list(arr.type)):
        raise ConfigError(f"to_training: field {name!r} has type {arr.type}, not a list of numbers.")
    if arr.null_count:
        raise ConfigError(
            f"to_training: field {name!r} has {arr.null_count} null rows; filter them out or fill them before batching."
        )
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
            raise ConfigError(
                f"to_training: field {name!r} has {flat.null_count} null element(s), the first in "
                f"batch row {row}; fill or drop them before batching."
            )
        return flat.to_numpy(zero_copy_only=False), offsets
    # A read-only view of loader memory: to_training copies it unless zero_copy=True.
    return _numpy_view(child)[offsets[0] : offsets[-1]], offsets


def _stack_list_column(col: pa.Array, pad_value: int, name: str) -> tuple[np.ndarray, np.ndarray | None]:
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


def _pad_mask(lengths: np.ndarray | None, b: int, s: int, table: pa.RecordBatch) -> np.ndarray | None:
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


def _valid_mask(
    pad: np.ndarray | None,
    loss_mask: np.ndarray | None,
    inputs: np.ndarray,
    eos_token_id: int | None,
    *,
    shape: tuple[int, ...],
    shift: int,
) -> np.ndarray | None:
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
    cu, max_seqlen = _segment_bounds(starts, flatten)
    return cu, np.array(max_seqlen, dtype=np.int32)


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
