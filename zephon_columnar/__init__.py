"""zephon_columnar: Zephon's data-loader API on a columnar (Arrow) engine.

Deterministic, exactly resumable, elastic: the same recipe gives the same batches whatever
the runner or parallelism; ``checkpoint()`` at any step and ``restore()`` continues as if
never interrupted, on the same or another number of data-parallel ranks.

Example:
    >>> import zephon_columnar as zephon
    >>> ds = zephon.Dataset.from_path("web", "data/web")  # doctest: +SKIP
    >>> ws = zephon.StaticMixtureWorkSource([ds], {"web": 1.0}, chunk_size=1024)  # doctest: +SKIP
    >>> for batch in zephon.Pipeline(ws).batch(8):  # doctest: +SKIP
    ...     tensors = batch.to_training()
"""

from __future__ import annotations

from zephon_columnar import io, observability, ops, options, types, validation, work
from zephon_columnar.io.dataset import Dataset, InMemoryShard
from zephon_columnar.pipeline import Pipeline
from zephon_columnar.types import SampleBatch, SampleMeta, SampleRecord
from zephon_columnar.work import MixtureSpec, StaticMixtureWorkSource, WorkSource

__version__ = "0.1.0"

__all__ = [
    "Dataset",
    "InMemoryShard",
    "MixtureSpec",
    "Pipeline",
    "SampleBatch",
    "SampleMeta",
    "SampleRecord",
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
