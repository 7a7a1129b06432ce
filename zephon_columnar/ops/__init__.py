"""Operators: the contract (`BaseOp`, `OpTraits`, accumulators) and the built-in operators."""

from zephon_columnar.ops.accumulators import (
    Accumulator,
    CountingAccumulator,
    LaneAccumulator,
    PassthroughAccumulator,
    ReadyBatch,
)
from zephon_columnar.ops.base import BaseOp, OpContext, OpTraits, StageInfo

__all__ = [
    "Accumulator",
    "BaseOp",
    "CountingAccumulator",
    "LaneAccumulator",
    "OpContext",
    "OpTraits",
    "PassthroughAccumulator",
    "ReadyBatch",
    "StageInfo",
]
