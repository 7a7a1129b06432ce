"""Operators: the contract (`BaseOp`, `OpTraits`, accumulators) and the built-in operators."""

from zephon_columnar.ops.accumulators import (
    Accumulator,
    CountingAccumulator,
    LaneAccumulator,
    LaneContext,
    PassthroughAccumulator,
    ReadyBatch,
)
from zephon_columnar.ops.base import BaseOp, ColumnarOp, OpContext, OpTraits, StageInfo
from zephon_columnar.ops.pack.spec import (
    DomainGroups,
    FlushStrategy,
    Homogeneity,
    PackAlgorithm,
    ShuffleStrategy,
)
from zephon_columnar.ops.shuffle import ShuffleAlgorithm
from zephon_columnar.records import pack_meta, spawn_child, tombstone_meta, tombstones_for_record

__all__ = [
    "Accumulator",
    "BaseOp",
    "ColumnarOp",
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
    "pack_meta",
    "spawn_child",
    "tombstone_meta",
    "tombstones_for_record",
]
