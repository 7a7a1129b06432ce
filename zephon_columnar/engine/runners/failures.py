"""An operator's failure in another process (a process runner's worker, a Ray actor), carried
back to the caller and raised there with its original class when it unpickles."""

from __future__ import annotations

import traceback

import cloudpickle

from zephon_columnar.errors import PipelineError, ZephonError, operator_failure


class WorkerFailure(Exception):
    """What a worker process sends back when an operator fails: the caller's message, and the
    original exception (cloudpickled, None if it cannot be) so the caller can re-raise it with
    its type (a dynamically made subclass would not unpickle in the parent)."""

    def __init__(self, message: str, original: bytes | None) -> None:
        super().__init__(message, original)
        self.message, self.original = message, original


def worker_failure(err: BaseException) -> BaseException:
    """What a worker process sends back for ``err`` raised by its operators (inside an
    ``except``): this library's own errors as they are (they pickle), else a `WorkerFailure`."""
    if isinstance(err, ZephonError) and not isinstance(err, PipelineError):
        return err
    cause = err.__cause__ if isinstance(err, PipelineError) and err.__cause__ is not None else err
    try:
        original = cloudpickle.dumps(cause)
    except Exception:  # noqa: BLE001 - whatever does not pickle travels as its message alone
        original = None
    # Tracebacks do not survive pickling; keep the worker's in the message.
    return WorkerFailure(f"{err}\n(in a worker process)\n{traceback.format_exc()}", original)


def raise_worker_failure(failure: WorkerFailure) -> None:
    """Raise, in the caller, the error a worker's `WorkerFailure` stands for (its original
    class when it unpickles, see `operator_failure`)."""
    original = None
    if failure.original is not None:
        try:
            original = cloudpickle.loads(failure.original)
        except Exception:  # noqa: BLE001 - an original that does not unpickle here: its message is raised
            original = None
    if original is None:
        raise PipelineError(failure.message) from None
    raise operator_failure(original, failure.message) from original
