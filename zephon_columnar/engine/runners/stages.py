"""Running a stage: each worker's copies of the operators (`setup_stages`), and one stage's
operators on a frame (`run_stage`), with an operator's failure named and its declared ``emits``
held to what it did.

Example:
    >>> import pyarrow as pa
    >>> from zephon_columnar.ops.base import FrameOp, OpTraits
    >>> class Double(FrameOp):
    ...     def traits(self):
    ...         return OpTraits(preserves_cursor_order=True, emits="one")
    ...     def process_frame(self, frame):
    ...         return frame.set_column(0, "x", pa.compute.multiply(frame.column("x"), 2))
    >>> [ops] = setup_stages([[Double()]], {})
    >>> run_stage(ops, pa.table({"x": [1, 2]})).column("x").to_pylist()
    [2, 4]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.engine.metrics import run_tracked
from zephon_columnar.errors import PipelineError, WrongTypeError, ZephonError, operator_failure
from zephon_columnar.ops.base import BaseOp, OpContext, StageInfo


def setup_stages(stages: Sequence[Sequence[BaseOp]], services: dict[str, Any]) -> list[list[BaseOp]]:
    copies = []
    for si, ops in enumerate(stages):
        row = []
        for oi, op in enumerate(ops):
            clone = op.clone()
            clone.setup(
                OpContext(
                    services=services,
                    stage_info=StageInfo(
                        stage_index=si,
                        op_index=oi,
                        stage_name=op.op_name(),
                        collect_stats=bool(services.get("collect_stats")),
                    ),
                )
            )
            row.append(clone)
        copies.append(row)
    return copies


def _run_op(op: BaseOp, frame: pa.Table) -> pa.Table:
    try:
        out = op.process_frame(frame)
    except ZephonError:
        raise
    except Exception as err:
        where = ""
        if frame.num_rows and F.LANE in frame.column_names:
            where = (
                f" (lane {frame.column(F.LANE)[0].as_py()}, chunk {frame.column(F.CHUNK)[0].as_py()}, "
                f"{frame.num_rows} rows)"
            )
        raise operator_failure(err, f"operator {op.op_name()!r} failed{where}: {type(err).__name__}: {err}") from err
    if not isinstance(out, pa.Table):
        raise WrongTypeError(
            f"operator {op.op_name()!r}: process_frame returned {type(out).__name__}, not a pyarrow.Table"
        )
    if out.num_rows > frame.num_rows and (emits := op.traits().emits) != "any":
        # Checkpoints trust the declaration (they resume by input position): a wrong one must not pass.
        raise PipelineError(
            f"operator {op.op_name()!r} declares emits={emits!r} (OpTraits) but made "
            f"{out.num_rows} rows of {frame.num_rows}; declare emits='any' if a row may become several."
        )
    return out


def run_stage(
    ops: Sequence[BaseOp], frame: pa.Table, stage: int = -1, sink: Callable[..., None] | None = None
) -> pa.Table:
    """The operators of a stage on ``frame``; with ``sink`` (execution tracking), each one's
    counts are reported to it."""
    if sink is not None:
        return run_tracked(ops, frame, stage, _run_op, sink)
    for op in ops:
        frame = _run_op(op, frame)
    return frame
