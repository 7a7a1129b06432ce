"""Exceptions raised by zephon_columnar.

Every error names what went wrong (file, row, field, option) and what to do instead.
The classes derive from the built-in exception a caller would expect (``ValueError`` for bad
input, ``RuntimeError`` for a bad state), so ``except ValueError`` keeps working.
"""

from __future__ import annotations


class ZephonError(Exception):
    """Base class of every error raised on purpose by zephon_columnar."""


class DatasetFormatError(ZephonError, ValueError):
    """A data file is malformed: bad JSON line, corrupt Parquet, mismatched schema, ..."""


class DatasetNotFoundError(ZephonError, FileNotFoundError):
    """A dataset path does not exist or holds no data files."""


class ConfigError(ZephonError, ValueError):
    """A wrong option or argument (unknown mixture component, bad chunk size, ...)."""


class CheckpointError(ZephonError, ValueError):
    """A checkpoint is malformed or was taken with a different data recipe."""


class PipelineError(ZephonError, RuntimeError):
    """An operator or worker failed while the pipeline ran; the original error is ``__cause__``."""
