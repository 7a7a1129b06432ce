"""`to_training`: a batch's rows as training tensors, vectorized over the Arrow buffers.

`TrainingOptions` holds ``SampleBatch.to_training``'s keywords, checked once when it is built;
`to_training` turns an Arrow table of rows (or the records a batch was built from) into
``input_ids`` (B, L) and what else was asked for (labels, masks, positions, sequence metadata).

Example:
    >>> out = to_training(batch.table, TrainingOptions(return_labels=True, return_loss_mask=True))
    >>> sorted(out), out["labels"].shape
    (['ids', 'input_ids', 'labels', 'loss_mask', 'positions', 'texts'], torch.Size([4, 64]))
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping, Sequence, Sized
from dataclasses import dataclass, fields
from itertools import pairwise
from numbers import Integral
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, get_args

import numpy as np
import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.errors import ConfigError, WrongTypeError, warn
from zephon_columnar.keywords import choice, closest
from zephon_columnar.records import SampleMeta, SampleRecord

if TYPE_CHECKING:
    import torch  # noqa: F401

    from zephon_columnar.device import TransferPlan

PositionMode = Literal["preserve", "sequence"]
# What tokens_field="auto" looks for, in this order; the .npy names are WebDataset's members of
# pre-tokenized ids (zephon_columnar.io.webdataset), whose column is named by extension.
TOKEN_FIELD_CANDIDATES = ("input_ids", "tokens", "token_ids", "ids", "input_ids.npy", "tokens.npy")
PADDING_LENGTH = F.PADDING_LENGTH  # trailing pad count of a packed row, when packing made it


@dataclass(frozen=True, kw_only=True)
class TrainingOptions:
    """The keywords of ``SampleBatch.to_training`` (its docstring says what each does), checked
    when built: a conflict or a malformed value raises here, before any data is read.

    Example:
        >>> TrainingOptions.from_keywords({"return_label": True}, where="to_torch_loader")
        Traceback (most recent call last):
        ...
        TypeError: to_torch_loader: 'return_label' is not a to_training keyword; did you mean 'return_labels'?
    """

    tokens_field: str = "auto"
    return_labels: bool = False
    dtype: Any = "auto"
    extra_fields: Sequence[str] = ()
    ignore_index: int = -100
    rename_fields: Mapping[str, str] | None = None
    flatten: bool = False
    exclude_fields: Sequence[str] = ()
    return_num_valid_tokens: bool = False
    return_loss_mask: bool = False
    return_cu_seqlens: bool = False
    return_padding_mask: bool = False
    eos_mask_loss: bool = False
    eos_token_id: int | None = None
    position_mode: PositionMode = "preserve"
    pad_token_id: int = 0
    zero_copy: bool = False
    device: Any = None
    non_blocking: bool = False

    @classmethod
    def from_keywords(cls, keywords: Mapping[str, Any], *, where: str, own: Sequence[str] = ()) -> TrainingOptions:
        """Options from ``keywords`` (a call's ``**to_training``); an unknown name is a
        TypeError from ``where`` that names the closest keyword, or lists them all. ``own``:
        ``where``'s other keywords, also offered (``num_worker`` meant ``num_workers``)."""
        known = [f.name for f in fields(cls)]
        for name in keywords:
            if name not in known:
                meant = closest(name, [*own, *known])
                hint = f"did you mean {meant!r}?" if meant else f"the keywords are {known}."
                what = f"neither one of {where}'s keywords nor" if own else "not"
                raise TypeError(f"{where}: {name!r} is {what} a to_training keyword; {hint}")
        return cls(**keywords)

    @functools.cached_property
    def transfer(self) -> TransferPlan:
        """Where ``device`` sends the tensors and what they become there (checked when the
        options are built; only with a ``device``)."""
        from zephon_columnar.device import OWN_DTYPE_OUTPUTS, TransferPlan, parse_device

        dtype, framework = _resolve_dtype(self.dtype)
        if framework != "torch":
            raise ConfigError(
                f"to_training: device={self.device!r} makes torch tensors, and dtype={self.dtype!r} does not; "
                "pass dtype='auto' or a torch dtype."
            )
        rename = self.rename_fields or {}
        return TransferPlan(
            device=parse_device(self.device),
            dtype=dtype,
            keep_dtype=frozenset(rename.get(name, name) for name in OWN_DTYPE_OUTPUTS),
            non_blocking=self.non_blocking,
        )

    def __post_init__(self) -> None:
        """Reject conflicting or malformed to_training options before any data is read (so an empty
        batch rejects them too); warn about an ``eos_token_id`` that would be ignored."""
        if self.device is not None:
            if self.zero_copy:
                raise ConfigError(
                    "to_training: zero_copy=True hands views of the loader's host memory over, and "
                    f"device={self.device!r} copies to the device; drop one of them."
                )
            _ = self.transfer  # checks the device and dtype now
        elif self.non_blocking:
            raise ConfigError("to_training: non_blocking applies to the copy to a device; pass device= too.")
        if isinstance(self.exclude_fields, str):
            raise WrongTypeError(
                f"to_training: exclude_fields must be a sequence of names, not a string; "
                f"write exclude_fields=({self.exclude_fields!r},)."
            )
        if self.return_loss_mask and not self.return_labels:
            raise ConfigError(
                "to_training: return_loss_mask requires return_labels=True (the mask is label-aligned); "
                "without labels a payload 'loss_mask' is passed through as it is."
            )
        if self.return_padding_mask and "padding_mask" in self.extra_fields:
            raise ConfigError(
                "to_training: extra_fields cannot include 'padding_mask' with return_padding_mask=True; drop one "
                "of them."
            )
        choice("to_training", "position_mode", self.position_mode, get_args(PositionMode))
        if self.eos_token_id is not None and (
            isinstance(self.eos_token_id, bool) or not isinstance(self.eos_token_id, Integral) or self.eos_token_id < 0
        ):
            raise ConfigError(
                f"to_training: eos_token_id must be a nonnegative integer or None, not {self.eos_token_id!r}."
            )
        if self.eos_mask_loss and not self.return_labels:
            raise ConfigError(
                "to_training: eos_mask_loss requires return_labels=True (it masks the labels whose input "
                "token is eos_token_id)."
            )
        if self.eos_mask_loss and self.eos_token_id is None:
            raise ConfigError(
                "to_training: eos_mask_loss requires an explicit eos_token_id (the id of your EOS token)."
            )
        if self.eos_token_id is not None and not self.eos_mask_loss:
            warn(
                "to_training: eos_token_id is ignored when eos_mask_loss=False; pass eos_mask_loss=True to "
                "mask the labels predicted from EOS tokens.",
                UserWarning,
            )
        if self.return_cu_seqlens and {"cu_seqlens", "max_seqlen"}.intersection(self.extra_fields):
            raise ConfigError(
                "to_training: extra_fields cannot include 'cu_seqlens' or 'max_seqlen' with "
                "return_cu_seqlens=True; drop one of them."
            )
        if self.return_num_valid_tokens:
            if not self.return_labels:
                raise ConfigError(
                    "to_training: return_num_valid_tokens requires return_labels=True (it counts labels)."
                )
            if "num_valid_tokens" in self.extra_fields:
                raise ConfigError(
                    "to_training: extra_fields cannot include 'num_valid_tokens' with "
                    "return_num_valid_tokens=True; drop one of them."
                )
        if self.return_labels and "loss_mask" in self.extra_fields:
            raise ConfigError(
                "to_training: extra_fields cannot include 'loss_mask' with return_labels=True: extra "
                "fields are input-aligned, not label-aligned. The payload mask already masks the labels; "
                "use return_loss_mask=True for the label-aligned mask, or return_labels=False for the "
                "raw mask."
            )


def to_training(
    rows: pa.Table | Sequence[SampleRecord], options: TrainingOptions, *, on_host: bool = False
) -> dict[str, Any]:
    """Training tensors of ``rows``: an Arrow table of a batch, or the records it was built from.

    With ``options.device`` they are built on the host first, integers in their own dtype and
    as views of the Arrow buffers where they can be, then moved and widened there
    (`zephon_columnar.device.move_to_device`); ``on_host`` stops before the move (for a loader
    whose device stage moves them, `zephon_columnar.device.DeviceLoader`).
    """
    if len(rows) == 0:
        return empty_training(options)
    if isinstance(rows, pa.Table):
        out = table_training(rows, options)
    else:
        out = records_training(rows, options)
    out = rename_and_exclude(out, options)
    if options.device is None or on_host:
        return out
    from zephon_columnar.device import move_to_device

    return move_to_device(out, options.transfer)


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


_NEEDS_POSITIONS = (
    "to_training: return_cu_seqlens requires a 'positions' field in every payload (the document "
    "boundaries); pack with pack_flat(emit_positions=True), or drop return_cu_seqlens."
)


def empty_training(o: TrainingOptions) -> dict[str, Any]:
    """to_training of an empty batch: lists (there is no row to stack), and what was asked for."""
    out: dict[str, Any] = {"ids": [], "texts": []}
    if o.return_num_valid_tokens:
        out["num_valid_tokens"] = 0
    if o.return_loss_mask:
        out["loss_mask"] = []
    if o.return_padding_mask:
        out["padding_mask"] = []
    if o.position_mode == "sequence":
        out["positions"] = []
    if o.return_cu_seqlens:
        out["cu_seqlens"] = [0] if o.flatten else []
        out["max_seqlen"] = 0 if o.flatten else []
    return rename_and_exclude(out, o, allow_missing_sources=True)


def rename_and_exclude(
    out: dict[str, Any], o: TrainingOptions, *, allow_missing_sources: bool = False
) -> dict[str, Any]:
    """Apply ``rename_fields`` (every source must be an emitted key, unless the batch is empty;
    final names must be unique, so swaps are fine), then drop ``exclude_fields`` (final names;
    absent ones are ignored)."""
    if o.rename_fields:
        missing = [k for k in o.rename_fields if k not in out]
        if missing and not allow_missing_sources:
            raise ConfigError(
                f"to_training: rename_fields source keys not in output: {missing}; the output has {list(out)}."
            )
        finals = [o.rename_fields.get(k, k) for k in out]
        collisions = sorted({k for k in finals if finals.count(k) > 1})
        if collisions:
            raise ConfigError(
                f"to_training: rename_fields target keys collide: {collisions}; give each output "
                "a distinct name (or exclude one of them by its name before renaming)."
            )
        out = {o.rename_fields.get(k, k): v for k, v in out.items()}
    for name in o.exclude_fields:
        out.pop(name, None)
    return out


# ---------------------------------------------------------------------- batches of records
_Framework: TypeAlias = "Literal['torch', 'numpy'] | None"


def _resolve_dtype(dtype: Any) -> tuple[Any, _Framework]:
    """(dtype, framework) of to_training's ``dtype``: "auto" is torch int64 (numpy int64 without
    torch), None is Python lists, a torch dtype is torch, anything numpy understands is numpy."""
    if dtype is None:
        return None, None
    if isinstance(dtype, str) and dtype == "auto":
        try:
            import torch
        except ImportError:
            return np.dtype(np.int64), "numpy"
        return torch.long, "torch"
    if type(dtype).__module__.split(".")[0] == "torch":
        return dtype, "torch"
    try:
        return np.dtype(dtype), "numpy"
    except TypeError as err:
        raise ConfigError(
            f"to_training: dtype={dtype!r} is not a dtype; use 'auto', a torch dtype, a numpy dtype, or None for lists."
        ) from err


def _record_pad_length(meta: SampleMeta) -> int:
    """A record's trailing pad count (`SampleMeta.padding_length`); 0 when it has none."""
    return int(meta.padding_length or 0)


def _has_length(value: Any) -> bool:
    """Whether a payload value can be a token sequence (what tokens_field="auto" accepts)."""
    return isinstance(value, (int, Sized)) or hasattr(value, "shape") or callable(getattr(value, "item", None))


def _row_len(row: Any) -> int | None:
    try:
        return len(row)
    except TypeError:
        return None


def _is_nested(rows: Any) -> bool:
    """Whether list rows hold containers rather than scalars (not a (B, L) batch)."""
    return any(
        isinstance(v, (list, tuple, dict, str, bytes)) or getattr(v, "ndim", 0) != 0 for row in rows for v in row
    )


def _stack_rows(rows: list[Any], dtype: Any, fw: _Framework, name: str) -> Any:
    """One batch of ``rows`` (lists, numpy arrays or torch tensors): a tensor / array of ``dtype``,
    or a list of per-row lists when ``fw`` is None. Rows of different lengths only stack as lists."""
    if fw is None:
        return [list(row) for row in rows]
    try:
        if fw == "torch":
            import torch

            if isinstance(rows[0], torch.Tensor):
                return torch.stack(list(rows)).to(dtype=dtype)
            if isinstance(rows[0], np.ndarray):
                return torch.from_numpy(np.stack(rows)).to(dtype=dtype)
            return torch.tensor(rows, dtype=dtype)
        return np.stack([np.asarray(row, dtype=dtype) for row in rows])
    except (ValueError, RuntimeError, TypeError) as err:
        lengths = sorted({n for n in map(_row_len, rows) if n is not None})
        raise ConfigError(
            f"to_training: the rows of {name!r} do not stack into one {fw} array (row lengths "
            f"{lengths[:8]}: {err}). Give every row the same length (pack_flat), or pass dtype=None "
            "for per-row lists."
        ) from err


def _fill_where(x: Any, cond: Any, value: int, fw: _Framework) -> Any:
    """``x`` with ``value`` where ``cond`` (a new array; ``x`` is left as it is)."""
    if fw == "torch":
        return x.masked_fill(cond, value)
    return np.where(cond, np.asarray(value).astype(x.dtype), x)


def _check_pad_lengths(pads: list[int], lengths: list[int]) -> None:
    for i, (n, length) in enumerate(zip(pads, lengths)):
        if not 0 <= n <= length:
            raise ConfigError(
                f"to_training: padding_length {n} of the record at index {i} must lie within its "
                f"token row's length ({length}); fix the record's meta."
            )


def records_training(records: Sequence[SampleRecord], o: TrainingOptions) -> dict[str, Any]:
    """to_training of a batch built from (at least one) records, from their payloads: dicts with
    a token field, or numpy arrays / torch tensors that are the token rows themselves (then there
    is no text, extra field, loss mask or positions). Rename and exclude are left to the caller.
    Payloads are never modified."""
    eos_token_id = o.eos_token_id if o.eos_mask_loss else None
    payloads = [r.payload for r in records]
    token_rows, texts, extras, mask_rows, field_name = _payload_rows(payloads, o.tokens_field, o.extra_fields)
    if o.return_cu_seqlens:
        if "positions" not in extras:
            raise ConfigError(_NEEDS_POSITIONS)
        for i, (tok, pos) in enumerate(zip(token_rows, extras["positions"])):
            if not isinstance(pos, Sized) or not isinstance(tok, Sized) or len(pos) != len(tok):
                raise ConfigError(
                    f"to_training: 'positions' must match the token sequence length at index {i} "
                    f"(got {pos!r:.60} for {_row_len(tok)} tokens)."
                )
    dtype, fw = _resolve_dtype(o.dtype)
    out: dict[str, Any] = {"ids": [r.meta.sample_id for r in records], "texts": texts}
    tokens = _stack_rows(token_rows, dtype, fw, field_name)
    row_lengths: list[int] = [len(row) for row in tokens] if fw is None else []
    if fw is not None:
        width = tokens.shape[1] if tokens.ndim >= 2 else 0
    pads = [_record_pad_length(r.meta) for r in records] if o.return_labels or o.return_padding_mask else []
    shift = int(o.return_labels)
    if o.return_padding_mask:
        if fw is not None and tokens.ndim != 2:
            raise ConfigError(
                f"to_training: return_padding_mask requires 2-D tokens; {field_name!r} stacks to "
                f"shape {tuple(tokens.shape)}."
            )
        _check_pad_lengths(pads, row_lengths if fw is None else [width] * len(pads))
        if fw is None:
            out["padding_mask"] = [
                [False] * min(n_row - n, max(0, n_row - shift)) + [True] * max(0, n - shift)
                for n_row, n in zip(row_lengths, pads)
            ]
        else:
            cutoff = np.asarray([width - n for n in pads], dtype=np.int64)
            mask = np.arange(max(0, width - shift))[None, :] >= cutoff[:, None]
            out["padding_mask"] = _to_fw(mask, fw, tokens)

    if o.return_labels:
        labels: Any  # lists when fw is None, else the framework's array
        if fw is None:
            out["input_ids"] = [row[:-1] for row in tokens]
            labels = [row[1:] for row in tokens]
        else:
            out["input_ids"], labels = tokens[..., :-1], tokens[..., 1:]
        if any(pads):
            _check_pad_lengths(pads, row_lengths if fw is None else [width] * len(pads))
            # After the shift a row's last ``pad`` labels are its pad tokens (one fewer when the
            # whole row is pad: the shift drops one of them).
            label_pads = [n - int(0 < n == (row_lengths[i] if fw is None else width)) for i, n in enumerate(pads)]
            if fw is None:
                labels = [
                    row[: len(row) - n] + [o.ignore_index] * n if n else row for row, n in zip(labels, label_pads)
                ]
            else:
                lw = labels.shape[-1]
                cut = np.asarray([lw - n for n in label_pads], dtype=np.int64)
                labels = _fill_where(
                    labels, _to_fw(np.arange(lw)[None, :] >= cut[:, None], fw, labels), o.ignore_index, fw
                )
        out["labels"] = labels
    else:
        out["input_ids"] = tokens

    for name, rows in extras.items():
        if name in out:
            raise ConfigError(
                f"to_training: extra_fields cannot overwrite generated field {name!r}; rename the "
                "payload field or drop it from extra_fields."
            )
        if name == "positions" and o.position_mode == "sequence" and not o.return_cu_seqlens:
            continue  # replaced below; the payload's positions are only needed for boundaries
        stacked = _stack_rows(rows, dtype, fw, name)
        if o.return_labels:
            stacked = [row[:-1] for row in stacked] if fw is None else stacked[..., :-1]
        out[name] = stacked

    if mask_rows is not None:
        masks = _stack_rows(mask_rows, dtype, fw, "loss_mask")
        if o.return_labels:
            # mask[i] gates token i as a label, i.e. label position i - 1: shift like labels.
            if fw is None:
                out["labels"] = [
                    [lab if m else o.ignore_index for lab, m in zip(row, mrow[1:])]
                    for row, mrow in zip(out["labels"], masks)
                ]
            else:
                out["labels"] = _fill_where(out["labels"], masks[..., 1:] == 0, o.ignore_index, fw)
        elif "loss_mask" not in out:
            out["loss_mask"] = masks

    if eos_token_id is not None:
        if fw is None:
            out["labels"] = [
                [o.ignore_index if tok == eos_token_id else lab for tok, lab in zip(trow, lrow)]
                for trow, lrow in zip(out["input_ids"], out["labels"])
            ]
        else:
            out["labels"] = _fill_where(out["labels"], out["input_ids"] == eos_token_id, o.ignore_index, fw)

    if o.return_loss_mask:
        if fw is None:
            out["loss_mask"] = [[float(v != o.ignore_index) for v in row] for row in out["labels"]]
        elif fw == "torch":
            out["loss_mask"] = (out["labels"] != o.ignore_index).float()
        else:
            out["loss_mask"] = (out["labels"] != o.ignore_index).astype(np.float32)
    num_valid = None
    if o.return_num_valid_tokens:
        if fw is None:
            num_valid = sum(v != o.ignore_index for row in out["labels"] for v in row)
        else:
            num_valid = (out["labels"] != o.ignore_index).sum()
        num_valid = int(num_valid)

    meta: dict[str, Any] = {}
    if o.return_cu_seqlens:
        positions = out["positions"]
        if fw is not None and tuple(positions.shape) != tuple(out["input_ids"].shape):
            raise ConfigError(
                f"to_training: 'positions' must match the input_ids shape "
                f"({tuple(positions.shape)} != {tuple(out['input_ids'].shape)})."
            )
        meta = dict(zip(("cu_seqlens", "max_seqlen"), _row_cu_seqlens(positions, fw, o.flatten)))

    if o.position_mode == "sequence":
        inputs = out["input_ids"]
        if (fw is None and _is_nested(inputs)) or (fw is not None and inputs.ndim != 2):
            raise ConfigError(
                "to_training: position_mode='sequence' requires 2-D input_ids (one token id per "
                f"position); {field_name!r} holds nested values."
            )
        if fw is None:
            out["positions"] = [list(range(len(row))) for row in inputs]
        elif fw == "torch":
            import torch

            out["positions"] = torch.arange(inputs.shape[1], dtype=inputs.dtype, device=inputs.device).repeat(
                inputs.shape[0], 1
            )
        else:
            out["positions"] = np.tile(np.arange(inputs.shape[1], dtype=inputs.dtype), (inputs.shape[0], 1))

    if o.flatten:
        out = {
            k: v if k in ("ids", "texts") else ([x for row in v for x in row] if fw is None else v.reshape(-1))
            for k, v in out.items()
        }
    if num_valid is not None:
        out["num_valid_tokens"] = num_valid
    out.update(meta)
    return out


def _payload_rows(
    payloads: list[Any], tokens_field: str, extra_fields: Sequence[str]
) -> tuple[list[Any], list[str], dict[str, list[Any]], list[Any] | None, str]:
    """(token rows, texts, extra rows by name (with ``positions`` when the payloads have it),
    loss-mask rows or None, token field name) of a batch's payloads."""
    if not isinstance(payloads[0], dict):
        for i, p in enumerate(payloads):
            if isinstance(p, dict):
                raise WrongTypeError(
                    f"to_training: mixed payload types at index {i} (expected all arrays, got "
                    "dict); give every record of a batch the same kind of payload."
                )
            if not hasattr(p, "shape") or isinstance(p, (str, bytes)):
                raise WrongTypeError(
                    f"to_training expects dict or array-like (numpy/torch) payloads; the record at "
                    f"index {i} has a {type(p).__name__}."
                )
        return payloads, [""] * len(payloads), {}, None, "payload"
    for i, p in enumerate(payloads):
        if not isinstance(p, dict):
            raise WrongTypeError(
                f"to_training: Expected dict payload, got: {type(p).__name__} (record at index {i}); "
                "give every record of a batch the same kind of payload."
            )
    texts = [str(p.get("text", "")) for p in payloads]
    name = tokens_field
    if tokens_field == "auto":
        first = payloads[0]
        found = [c for c in TOKEN_FIELD_CANDIDATES if c in first and _has_length(first[c])]
        if not found:
            raise ConfigError(
                f"to_training: Cannot auto-detect tokens field; payload keys: {list(first)}. Expected "
                f"one of: {', '.join(TOKEN_FIELD_CANDIDATES)}; or pass tokens_field=<name>."
            )
        name = found[0]
    for i, p in enumerate(payloads):
        if name not in p:
            raise ConfigError(
                f"to_training: Field {name!r} not found in payload at index {i} (tokens_field); every record needs it."
            )
    token_rows = [p[name] for p in payloads]
    extras: dict[str, list[Any]] = {}
    for field_name in extra_fields:
        for i, p in enumerate(payloads):
            if field_name not in p:
                raise ConfigError(
                    f"to_training: Extra field {field_name!r} not found in payload at index {i}; "
                    "drop it from extra_fields or add it to every record."
                )
        extras[field_name] = [p[field_name] for p in payloads]
    if "positions" in payloads[0] and "positions" not in extras:
        for i, p in enumerate(payloads):
            if "positions" not in p:
                raise ConfigError(
                    f"to_training: 'positions' present in some payloads but missing at index {i}; "
                    "give every record positions or none."
                )
        extras["positions"] = [p["positions"] for p in payloads]
    mask_rows = None
    if "loss_mask" in payloads[0]:
        for i, (p, tok) in enumerate(zip(payloads, token_rows)):
            if "loss_mask" not in p:
                raise ConfigError(
                    f"to_training: 'loss_mask' present in some payloads but missing at index {i}; "
                    "give every record a loss_mask or none."
                )
            mask = p["loss_mask"]
            if not isinstance(mask, Sized) or not isinstance(tok, Sized):
                raise ConfigError(f"to_training: 'loss_mask' and {name!r} must be sequences at index {i}.")
            if len(mask) != len(tok):
                raise ConfigError(
                    f"to_training: 'loss_mask' length {len(mask)} does not match {name!r} length "
                    f"{len(tok)} at index {i}."
                )
        mask_rows = [p["loss_mask"] for p in payloads]
    return token_rows, texts, extras, mask_rows, name


def _to_fw(mask: np.ndarray, fw: _Framework, like: Any) -> Any:
    """A numpy array as the framework's array (a torch tensor on ``like``'s device)."""
    if fw == "torch":
        import torch

        return torch.from_numpy(np.ascontiguousarray(mask)).to(device=like.device)
    return mask


def _row_cu_seqlens(positions: Any, fw: _Framework, flatten: bool) -> tuple[Any, Any]:
    """int32 cumulative segment boundaries (a segment starts where the position is 0) and
    segment maxima of input-aligned positions: per row, padded with the row's length to the
    batch's largest count ((B, K) and (B,)); flattened, one compact sequence over the batch and
    a Python int. Lists give Python ints."""
    if fw is None:
        if _is_nested(positions):
            raise ConfigError("to_training: return_cu_seqlens requires 2-D positions (one number per token).")
        bounds: list[list[int]] = []
        maxima: list[int] = []
        flat: list[int] = []
        offset = 0
        for row in positions:
            row = list(row)
            if row and row[0] != 0:
                raise ConfigError(
                    f"to_training: positions must start at zero in every nonempty row (a row starts at {row[0]})."
                )
            starts = [i for i, v in enumerate(row) if v == 0]
            cu = starts + [len(row)]
            maxima.append(max((b - a for a, b in pairwise(cu)), default=0))
            flat.extend(offset + s for s in starts)
            offset += len(row)
            bounds.append(cu)
        if flatten:
            return flat + [offset], max(maxima, default=0)
        k = max(map(len, bounds), default=0)
        return [cu + [cu[-1]] * (k - len(cu)) for cu in bounds], maxima
    arr = positions.detach().cpu().numpy() if fw == "torch" else np.asarray(positions)
    if arr.ndim != 2:
        raise ConfigError(f"to_training: return_cu_seqlens requires 2-D positions, not shape {arr.shape}.")
    _b, s = arr.shape
    if s and bool((arr[:, 0] != 0).any()):
        raise ConfigError("to_training: positions must start at zero in every nonempty row.")
    if (arr.size if flatten else s) > 2**31 - 1:
        raise ConfigError("to_training: cumulative sequence lengths exceed the int32 range; use shorter batches.")
    cu_array, longest = _segment_bounds(arr == 0, flatten)
    return _to_fw(cu_array, fw, positions), (longest if flatten else _to_fw(longest, fw, positions))


# ---------------------------------------------------------------------- helpers
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
        return arr.to_numpy(zero_copy_only=False)
    return arr.to_numpy()  # zero-copy and read-only


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
# views of immutable loader data, so the warning is noise, for that message from this module's
# calls only (a user's own torch.from_numpy of a read-only array still warns).
warnings.filterwarnings("ignore", message="The given NumPy array is not writable", module=r"zephon_columnar\.training$")
