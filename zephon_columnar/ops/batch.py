"""`BatchOp`: group each lane's rows into `SampleBatch`es of ``microbatch_size`` rows.

Batching is the last ordered step of a lane: it cuts the lane's row stream into consecutive
groups, so a batch never mixes lanes and its boundaries depend only on the row count (not on
how rows arrived in frames). ``drop_last=True`` drops the short remainder at the end of the
lane's stream; ``drop_last=False`` emits it. Flush points do not cut batches.
"""

from __future__ import annotations

from typing import Any

from zephon_columnar.errors import ConfigError
from zephon_columnar.keywords import flag
from zephon_columnar.ops.base import BaseOp, OpTraits


class BatchOp(BaseOp):
    name = "batch"
    builtin = True

    def __init__(self, microbatch_size: int, *, drop_last: bool = True) -> None:
        super().__init__()
        if not isinstance(microbatch_size, int) or microbatch_size < 1:
            raise ConfigError(f"batch: microbatch_size={microbatch_size!r}; pass a positive int.")
        self.microbatch_size = microbatch_size
        self.drop_last = flag("batch", "drop_last", drop_last)

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True)

    def process_many(self, elems: list[Any]) -> list[Any]:
        raise TypeError("batch is each lane's collector inside a pipeline, not an operator on a list of records.")

    def fingerprint(self) -> dict[str, Any]:
        return {"op": self.name, "microbatch_size": self.microbatch_size, "drop_last": self.drop_last}
