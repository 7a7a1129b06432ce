"""`to_training`: picks the conversion path for a batch's rows, then renames, excludes and moves
to the device what either path built.

Contract: an empty batch gives lists (`empty_training`); an Arrow table goes through
`columnar.table_training`, records through `records.records_training`; both outputs then pass
`rename_and_exclude`, and with ``options.device`` `zephon_columnar.device.move_to_device`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from zephon_columnar.errors import ConfigError
from zephon_columnar.records import SampleRecord
from zephon_columnar.training.columnar import table_training
from zephon_columnar.training.options import TrainingOptions
from zephon_columnar.training.records import records_training


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
