"""Operators: the contract (`BaseOp`, `OpTraits`, accumulators) and the built-in operators."""

from zephon_columnar.ops.accumulators import (
    Accumulator,
    CountingAccumulator,
    LaneAccumulator,
    LaneContext,
    PassthroughAccumulator,
    ReadyBatch,
)
from zephon_columnar.ops.base import BaseOp, OpContext, OpTraits, StageInfo
from zephon_columnar.ops.pack.spec import (
    DomainGroups,
    FlushStrategy,
    Homogeneity,
    PackAlgorithm,
    ShuffleStrategy,
)
from zephon_columnar.ops.shuffle import ShuffleAlgorithm

__all__ = [
    "Accumulator",
    "BaseOp",
    "CountingAccumulator",
    "DomainGroups",
    "FlushStrategy",
    "Homogeneity",
    "LaneAccumulator",
    "LaneContext",
    "OpContext",
    "OpTraits",
    "PackAlgorithm",
    "PassthroughAccumulator",
    "ReadyBatch",
    "ShuffleAlgorithm",
    "ShuffleStrategy",
    "StageInfo",
]
