"""Operators: the contract (`BaseOp`, `OpTraits`, accumulators) and the built-in operators."""

from zephon_columnar.ops.accumulators import Accumulator, CountingAccumulator, PassthroughAccumulator, ReadyBatch
from zephon_columnar.ops.accumulators.lane import LaneAccumulator, LaneContext
from zephon_columnar.ops.base import BaseOp, ColumnarOp, OpContext, OpTraits, StageInfo
from zephon_columnar.ops.children import pack_meta, spawn_child, tombstone_meta, tombstones_for_record
from zephon_columnar.ops.config import LossScope, MissingFieldMode, PackingAlgorithm, SpanSource, SpecialTokensMode
from zephon_columnar.ops.grouping import DomainGroups
from zephon_columnar.ops.pack.spec import FlushStrategy, Homogeneity, ShuffleStrategy
from zephon_columnar.ops.shuffle import ShuffleAlgorithm

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
    "LossScope",
    "MissingFieldMode",
    "OpContext",
    "OpTraits",
    "PackingAlgorithm",
    "PassthroughAccumulator",
    "ReadyBatch",
    "ShuffleAlgorithm",
    "ShuffleStrategy",
    "SpanSource",
    "SpecialTokensMode",
    "StageInfo",
    "pack_meta",
    "spawn_child",
    "tombstone_meta",
    "tombstones_for_record",
]
