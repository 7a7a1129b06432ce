"""The records path of `to_training`: a batch built from `SampleRecord`s, read from their payloads.

Contract: payloads are dicts with a token field (and optional text, extra fields, loss mask,
positions), or numpy arrays / torch tensors that are the token rows themselves; they are never
modified. Rows stack into the framework ``dtype`` asks for (lists with ``dtype=None``); a
record's ``meta.padding_length`` marks its pad tail. Rename and exclude are left to the caller
(`conversion.to_training`).
"""

from __future__ import annotations

from collections.abc import Sequence, Sized
from itertools import pairwise
from typing import Any

import numpy as np

from zephon_columnar.errors import ConfigError, WrongTypeError
from zephon_columnar.records import SampleMeta, SampleRecord
from zephon_columnar.training.options import TOKEN_FIELD_CANDIDATES, TrainingOptions, _Framework, _resolve_dtype
from zephon_columnar.training.segments import _NEEDS_POSITIONS, _segment_bounds


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
