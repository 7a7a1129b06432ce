"""`to_training`: a batch's rows as training tensors, vectorized over the Arrow buffers.

`TrainingOptions` holds ``SampleBatch.to_training``'s keywords, checked once when it is built;
`to_training` turns an Arrow table of rows (or the records a batch was built from) into
``input_ids`` (B, L) and what else was asked for (labels, masks, positions, sequence metadata).

The package's modules, each importing only those above it: `options` (`TrainingOptions`,
dtype resolution), `segments` (``cu_seqlens`` shared by both paths), `columnar` (an Arrow
table's path, `table_training`), `records` (the records' path, `records_training`) and
`conversion` (`to_training`).

Example:
    >>> out = to_training(batch.table, TrainingOptions(return_labels=True, return_loss_mask=True))
    >>> sorted(out), out["labels"].shape
    (['ids', 'input_ids', 'labels', 'loss_mask', 'positions', 'texts'], torch.Size([4, 64]))
"""

import warnings

from zephon_columnar.training.columnar import PADDING_LENGTH, table_training
from zephon_columnar.training.conversion import empty_training, rename_and_exclude, to_training
from zephon_columnar.training.options import TOKEN_FIELD_CANDIDATES, PositionMode, TrainingOptions
from zephon_columnar.training.records import records_training

__all__ = [
    "PADDING_LENGTH",
    "TOKEN_FIELD_CANDIDATES",
    "PositionMode",
    "TrainingOptions",
    "empty_training",
    "records_training",
    "rename_and_exclude",
    "table_training",
    "to_training",
]

# Zero-copy hand-off of Arrow buffers: torch warns that they are read-only; the tensors are
# views of immutable loader data, so the warning is noise, for that message from this package's
# calls only (a user's own torch.from_numpy of a read-only array still warns).
warnings.filterwarnings(
    "ignore", message="The given NumPy array is not writable", module=r"zephon_columnar\.training(\.\w+)?$"
)
