"""Accumulators: all state that spans rows.

- `Accumulator` and its stock kinds (`CountingAccumulator`, `PassthroughAccumulator`): Zephon's
  API for grouping a user operator's records into calls (``base``, ``counting``, ``passthrough``).
- `LaneAccumulator` (``lane``): the engine's own per-lane state of a built-in ordered stage.
"""

from zephon_columnar.ops.accumulators.base import Accumulator, ReadyBatch, SourceExhaustion
from zephon_columnar.ops.accumulators.counting import CountingAccumulator
from zephon_columnar.ops.accumulators.passthrough import PassthroughAccumulator

__all__ = ["Accumulator", "CountingAccumulator", "PassthroughAccumulator", "ReadyBatch", "SourceExhaustion"]
