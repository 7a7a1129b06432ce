"""`OpTraits`: what an operator declares about itself, the one thing the planner reads from it.

Example:
    >>> OpTraits(preserves_cursor_order=True).workers()
    1
    >>> OpTraits(preserves_cursor_order=False, parallelism=4, requires_serial_state=True).workers()
    1
    >>> OpTraits(preserves_cursor_order=True).fans_out, OpTraits(preserves_cursor_order=True, emits="one").fans_out
    (True, False)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    import pyarrow as pa

#: How many rows an operator emits for each row it takes: exactly ``"one"`` (a map),
#: ``"at_most_one"`` (a filter, a map that may drop), or ``"any"`` number (a split, a fan-out).
Emits = Literal["one", "at_most_one", "any"]


@dataclass(frozen=True, kw_only=True)
class OpTraits:
    """How an operator behaves, for the planner (see the module docstring for what reads each).

    ``preserves_cursor_order``: outputs keep the order of their inputs (1:1 maps, filters).
    ``indexable``: the op can serve a map-style (by position) dataset.
    ``calibration_replayable``: running it on one record at a time gives the same output.
    ``parallelism``: preferred worker count for the pure part.
    ``batch_shape_sensitive``: output depends on how rows are grouped into calls.
    ``requires_serial_state``: the op must run on one worker.
    ``emits``: rows out per row in (`Emits`). Zephon's operators do not say, so the default is
    the safe ``"any"``; an operator that emits at most one row per input row says so, and a
    checkpoint then resumes from the first row not delivered instead of replaying its chunk.
    ``reads``: the payload columns the operator reads (a Polars expression's root columns);
    ``writes``: those it adds or replaces. None: not known (a Python callable may read or write
    anything). The engine checks them against each dataset's columns: a column only some
    datasets of a mixture have is null in the others' rows (`zephon_columnar.engine.realized`).
    ``composes_rows``: an ordered operator whose output rows are built of pieces of several
    input rows (a packer). A checkpoint by reference names such a row by its pieces, so a plan
    with more than one is checkpointed by replay (`zephon_columnar.engine.checkpoint.mode`).
    """

    preserves_cursor_order: bool
    indexable: bool = True
    calibration_replayable: bool = False
    parallelism: int = 1
    batch_shape_sensitive: bool = False
    requires_serial_state: bool = False
    emits: Emits = "any"
    reads: frozenset[str] | None = None
    writes: frozenset[str] | None = None
    composes_rows: bool = False

    @property
    def fans_out(self) -> bool:
        """Whether one input row may become several output rows."""
        return self.emits == "any"

    def workers(self) -> int:
        """The workers the engine gives the op: ``parallelism``, or 1 with serial state."""
        return 1 if self.requires_serial_state else max(1, int(self.parallelism))


@runtime_checkable
class KeepsRows(Protocol):
    """An operator that keeps or drops rows by their values (a filter): the engine asks it, before
    the first row is read, whether a row whose ``columns`` are all null is kept, to warn when a
    mixture component lacks a column it reads (`zephon_columnar.engine.realized`)."""

    def keeps_null_row(self, columns: pa.Schema) -> bool | None:
        """Whether a row whose ``columns`` (those it reads) are all null is kept; None: cannot tell."""
        ...


__all__ = ["Emits", "KeepsRows", "OpTraits"]
