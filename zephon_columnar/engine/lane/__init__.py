"""One lane's stream as objects a checkpoint can read: source -> steps -> collector.

    setup       `LaneSetup` (what a lane is built from: the plan, the work source, frame sizes,
                the runner's look-ahead), `LaneItem`, `EpochStart`, `LaneShared`
    source      `Source`: pointer frames of the lane's chunks, an `EpochStart` every K chunks
    steps       `ParallelStep` (a stateless stage on the runner, re-sequenced), `EmptyPassGuard`,
                `OrderedStep` (an accumulator)
    collector   `Collector`: cuts the rows into batches or records
    chain       `LaneChain`: the parts put together from a `LaneSetup` and a start
    start       where a lane starts (`lane_start`: from a `LaneCursor` or a `LaneSnapshot`) and
                what a run keeps to checkpoint it (`lane_ledger`: by replay or by reference)
    snapshot    a lane's checkpoint by reference; `rewind`: as a source position
    regenerate  rows computed again from their references, for a restore by reference

Every buffer is an attribute, so a checkpoint by reference is a *snapshot* of the chain taken
between two deliveries: where the source resumes, each ordered stage's own state (scalars and
the rows it holds, by reference), and the rows in transit, by reference. Restore builds the
same chain again: stages get their state back and compute held rows only when they emit them,
rows in transit are computed again, and the source continues from its position. Nothing
already delivered is read again.

Plans with an ordered stage that cannot be described that way (user state) are checkpointed
by replay: the flush epoch and how many of its rows were delivered; restore replays the epoch
(`zephon_columnar.engine.checkpoint`, which also decides the mode).

A chain needs no `Engine`: a `LaneSetup`, a runner (`zephon_columnar.engine.runners`) and a
start are enough (tests/engine/lane/ builds them so).
"""

from zephon_columnar.engine.lane.chain import LaneChain
from zephon_columnar.engine.lane.collector import DROPPED_FINAL_ROWS
from zephon_columnar.engine.lane.setup import EpochStart, LaneItem, LaneSetup, LaneShared
from zephon_columnar.engine.lane.source import FIRST_FRAME_ROWS
from zephon_columnar.engine.lane.start import LaneStart, lane_start

__all__ = [
    "DROPPED_FINAL_ROWS",
    "FIRST_FRAME_ROWS",
    "EpochStart",
    "LaneChain",
    "LaneItem",
    "LaneSetup",
    "LaneShared",
    "LaneStart",
    "lane_start",
]
