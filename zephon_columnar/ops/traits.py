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
from typing import Literal

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
    """

    preserves_cursor_order: bool
    indexable: bool = True
    calibration_replayable: bool = False
    parallelism: int = 1
    batch_shape_sensitive: bool = False
    requires_serial_state: bool = False
    emits: Emits = "any"

    @property
    def fans_out(self) -> bool:
        """Whether one input row may become several output rows."""
        return self.emits == "any"

    def workers(self) -> int:
        """The workers the engine gives the op: ``parallelism``, or 1 with serial state."""
        return 1 if self.requires_serial_state else max(1, int(self.parallelism))


__all__ = ["Emits", "OpTraits"]
