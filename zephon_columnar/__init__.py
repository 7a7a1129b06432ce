"""zephon_columnar: Zephon's data-loader API on a columnar (Arrow) engine.

Deterministic, exactly resumable, elastic: the same recipe gives the same batches whatever
the runner or parallelism; ``checkpoint()`` at any step and ``restore()`` continues as if
never interrupted, on the same or another number of data-parallel ranks.

Example:
    >>> import zephon_columnar as zephon
    >>> ds = zephon.Dataset.from_path("web", "data/web")
    >>> ws = zephon.StaticMixtureWorkSource([ds], {"web": 1.0}, chunk_size=1024)
    >>> pipe = (zephon.Pipeline(ws)
    ...         .tokenize(tokenizer_id="tok/", field="text")
    ...         .pack_flat(33, algorithm="wrap")  # rows of exactly 33 tokens
    ...         .batch(8))
    >>> for batch in pipe:
    ...     tensors = batch.to_training(return_labels=True)
    >>> tensors["input_ids"].shape, tensors["labels"].shape
    (torch.Size([8, 32]), torch.Size([8, 32]))
"""

from __future__ import annotations

from zephon_columnar import io, observability, ops, options, types, validation, work
from zephon_columnar.io.dataset import Dataset, InMemoryShard
from zephon_columnar.pipeline import Pipeline
from zephon_columnar.types import SampleBatch, SampleMeta, SampleRecord
from zephon_columnar.work import (
    MixtureSchedule,
    MixtureSpec,
    ScheduledMixtureWorkSource,
    SchedulePoint,
    StaticMixtureWorkSource,
    WorkSource,
)

__version__ = "0.1.0"

__all__ = [
    "Dataset",
    "InMemoryShard",
    "MixtureSchedule",
    "MixtureSpec",
    "Pipeline",
    "SampleBatch",
    "SampleMeta",
    "SampleRecord",
    "SchedulePoint",
    "ScheduledMixtureWorkSource",
    "StaticMixtureWorkSource",
    "WorkSource",
    "__version__",
    "io",
    "observability",
    "ops",
    "options",
    "types",
    "validation",
    "work",
]
