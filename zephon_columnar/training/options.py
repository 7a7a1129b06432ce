"""`TrainingOptions`: ``SampleBatch.to_training``'s keywords, checked once when built, and the
dtype they ask for.

Contract: building a `TrainingOptions` raises (ConfigError, WrongTypeError, or a TypeError naming
the closest keyword) on a conflict or a malformed value, before any data is read; both
conversion paths (`columnar`, `records`) may then trust it. `_resolve_dtype` maps ``dtype`` to
the ``(dtype, framework)`` the tensors are built in.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from numbers import Integral
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, get_args

import numpy as np

from zephon_columnar.errors import ConfigError, WrongTypeError, warn
from zephon_columnar.keywords import choice, closest

if TYPE_CHECKING:
    from zephon_columnar.device import TransferPlan


PositionMode = Literal["preserve", "sequence"]
# What tokens_field="auto" looks for, in this order; the .npy names are WebDataset's members of
# pre-tokenized ids (zephon_columnar.io.webdataset), whose column is named by extension.
TOKEN_FIELD_CANDIDATES = ("input_ids", "tokens", "token_ids", "ids", "input_ids.npy", "tokens.npy")


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
