"""Exceptions (and warnings) raised by zephon_columnar.

Every error names what went wrong (file, row, field, option) and what to do instead.
The classes derive from the built-in exception a caller would expect (``ValueError`` for bad
input, ``RuntimeError`` for a bad state), so ``except ValueError`` keeps working.
"""

from __future__ import annotations

import os
import sys
import warnings
from types import FrameType

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` attributed to the first frame outside this package and the loops that
    drive it (torch's DataLoader, torchdata, ``runpy``): a warning raised while a pipeline is
    iterated points at the user's loop, not at the engine or at torch's fetch (or at the
    package, when no user code is on the stack: a prefetch thread).

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as seen:
        ...     warnings.simplefilter("always")
        ...     warn("three rows dropped")
        >>> seen[0].filename.startswith(_PACKAGE), str(seen[0].message)
        (False, 'three rows dropped')
    """
    frame: FrameType | None = sys._getframe(1)  # noqa: SLF001 - the caller's frame, as warnings itself does
    level = 2
    while frame is not None and _drives_the_pipeline(frame):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level if frame is not None else 2)


#: Loops that call into a pipeline for the user (their frames sit between the user's loop and
#: the package): torch's DataLoader and torchdata's, and ``python -m``.
_DRIVERS = (f"{os.sep}torch{os.sep}utils{os.sep}data{os.sep}", f"{os.sep}torchdata{os.sep}", "<frozen runpy>")


def _drives_the_pipeline(frame: FrameType) -> bool:
    """Whether ``frame`` is the package's (its files, or code it generated: a dataclass's
    ``__init__``) or one of the `_DRIVERS`'."""
    filename = frame.f_code.co_filename
    if filename.startswith(_PACKAGE) or str(frame.f_globals.get("__name__", "")).startswith("zephon_columnar."):
        return True
    return any(d in filename for d in _DRIVERS) or filename.endswith("runpy.py")


class ZephonError(Exception):
    """Base class of every error raised on purpose by zephon_columnar."""


class DatasetFormatError(ZephonError, ValueError):
    """A data file is malformed: bad JSON line, corrupt Parquet, mismatched schema, ..."""


class DatasetNotFoundError(ZephonError, FileNotFoundError):
    """A dataset path does not exist or holds no data files."""


class ConfigError(ZephonError, ValueError):
    """A wrong option or argument (unknown mixture component, bad chunk size, ...)."""


class CheckpointError(ZephonError, ValueError, RuntimeError):
    """A checkpoint is malformed or was taken with a different data recipe (also a
    ``RuntimeError``, the class Zephon raises for a state it cannot load)."""


class PipelineError(ZephonError, RuntimeError):
    """An operator or worker failed while the pipeline ran; the original error is ``__cause__``."""


class NotIndexableError(ConfigError, RuntimeError):
    """``to_indexable_torch_dataset()`` on a pipeline without random access (an operator that is
    not 1:1, or an endless stream): a `ConfigError` and, as in Zephon, a ``RuntimeError``."""


class MissingFieldError(ZephonError, KeyError):
    """A field an operator needs is not in the rows (a ``KeyError``, as a dict lookup would be)."""

    def __str__(self) -> str:  # KeyError's own str() would quote the whole message
        return str(self.args[0]) if self.args else ""


class WrongTypeError(ZephonError, TypeError):
    """A field, value or operator output has the wrong type (a column of bytes where text is
    needed, a user function returning a list instead of a dict, ...)."""


_WRAPPED: dict[type, type] = {}


def operator_failure(err: BaseException, message: str) -> BaseException:
    """The error to raise in the caller when an operator raised ``err``: a `PipelineError` with
    ``message`` (which names the operator and sample) that is also an instance of ``err``'s
    class, so ``except ValueError`` catches a ValueError raised inside a worker as it would
    inline. ``err`` becomes ``__cause__``. Errors of this library pass through unchanged.

    Example:
        >>> e = operator_failure(ValueError("bad row"), "operator 'clean' failed: bad row")
        >>> isinstance(e, ValueError), isinstance(e, PipelineError), str(e)
        (True, True, "operator 'clean' failed: bad row")
    """
    if isinstance(err, ZephonError) or not isinstance(err, Exception):
        return err
    cls = type(err)
    wrapped = _WRAPPED.get(cls)
    if isinstance(err, (StopIteration, StopAsyncIteration)):
        wrapped = PipelineError  # raised from next(), these would end the caller's loop silently
    if wrapped is None:
        try:
            wrapped = type(
                cls.__name__,
                (cls, PipelineError),
                {
                    "__module__": __name__,
                    "__qualname__": f"PipelineError[{cls.__qualname__}]",
                    # The original class may want other constructor arguments (UnicodeDecodeError,
                    # OSError): build with the message only and print it as given.
                    "__new__": lambda klass, *args: cls.__new__(klass, *args),
                    "__init__": lambda self, *args: Exception.__init__(self, *args),
                    "__str__": lambda self: str(self.args[0]) if self.args else "",
                },
            )
        except TypeError:  # a class that cannot be subclassed (layout conflict): plain PipelineError
            wrapped = PipelineError
        _WRAPPED[cls] = wrapped
    out: BaseException = wrapped(message)
    out.__cause__ = err
    return out


# ---------------------------------------------------------------------- warnings
class ZephonWarning(UserWarning):
    """Base class of every warning zephon_columnar gives on purpose: filter them all with
    ``warnings.filterwarnings("ignore", category=ZephonWarning)``, or one kind by its subclass."""


class DataDroppedWarning(ZephonWarning):
    """Rows or tokens were dropped on purpose (an oversized document, a stream's final partial
    row, rows an exact mixture could not place); the counts are in ``metrics_snapshot()``."""


class OversizedDocumentWarning(DataDroppedWarning):
    """A packer dropped documents longer than ``max_length`` (first_fit / best_fit with
    ``drop_oversized=True``, the default): counts ``pack_oversized_docs`` / ``pack_oversized_tokens``."""


class MixtureDropWarning(DataDroppedWarning):
    """``ensure_mixture(max_buffer_size=None)`` dropped rows it could not place at a flush point
    to keep the mixture exact: count ``ensure_mixture_dropped``."""


class PassTailWarning(DataDroppedWarning):
    """A routine tail of a pass (a lane's last rows short of a batch, uncapped wrap's final
    partial row) that is more than 1% of what the pass delivered: small data, where the tail is
    a real part of it. Under 1%, the tail is logged (logger ``"zephon_columnar"``), not warned."""


class StarvedComponentWarning(DataDroppedWarning):
    """A mixture component delivered far fewer of its rows than the others (or none): operators
    after the read dropped them (a filter on a column its dataset lacks), so the stream's
    mixture is not the one asked for. Counts: ``metrics_snapshot()``'s ``component_rows_*``."""


class SkippedRecordWarning(DataDroppedWarning):
    """A dataset read with ``on_bad_record="skip"`` left records it could not read out of its
    rows (JSON Lines lines that are not one JSON object in UTF-8): said once per pass, with the
    count and the first lines; ``Dataset.skipped_records()`` has them."""


class EmptyPassWarning(ZephonWarning):
    """A whole pass over the data delivered no item (every row filtered out, or none read)."""


class ConfigurationWarning(ZephonWarning, RuntimeWarning):
    """A setting that is probably not what was meant (two data-parallel ranks that receive the
    same batches, an option with no effect); also a ``RuntimeWarning``, as Zephon's are."""
