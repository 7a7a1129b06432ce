"""Checkpoint state: per lane, by reference (`LaneSnapshot`) or by replay (`LaneCursor`), as
typed frozen values (`state`), their one JSON form (`codec`, with a wide mixture's work-source
maps written compactly by `compact`), what restore checks before any
work (`checks`), merging the ranks' checkpoints (`merge`) and gathering them from every rank
(`gather`: through ``torch.distributed`` or a shared directory), which mode a plan gets
(`mode`), and the torch loader's part
(`loader`: DataLoader worker states, how a loader's state finds every lane on another layout).

*By reference* (every built-in operator): a snapshot of the lane's chain between two
deliveries (`engine.lane`): where the source resumes (a chunk, an offset in it, and the
work-source state before that chunk), each ordered stage's state (small scalars and the rows
it holds as references), and the rows in transit as references. Restore recomputes only the
rows that are needed, when they are needed; nothing delivered is read again.

*By replay* (plans with user state that cannot be described): the position of the last item
handed to the caller as ``(epoch, rows)``: the flush epoch it belongs to, the work-source
state at that epoch's start, and how many of the epoch's rows were already delivered. Restore
loads that source state, replays the epoch (a few chunks at most) and skips the delivered
rows; since every accumulator is fresh at an epoch start (but for what it carries across, kept
in the checkpoint), the continuation equals the uninterrupted stream.

Both are O(lanes x (components + rows held)): they do not grow with the samples consumed.

A checkpoint also records the data recipe (work-source identity, lanes, flush cadence,
operators); restoring into a pipeline with another recipe raises, naming each difference.
"""

from zephon_columnar.engine.checkpoint.checks import check_lane_state, check_recipe
from zephon_columnar.engine.checkpoint.codec import (
    FORMAT,
    VERSION,
    build_checkpoint,
    check_numbers,
    checkpoint_bytes,
    lane_from_json,
    lane_to_json,
    load_checkpoint,
    parse_checkpoint,
    verify_digests,
    with_digests,
)
from zephon_columnar.engine.checkpoint.merge import merge_checkpoints
from zephon_columnar.engine.checkpoint.mode import CheckpointBy, CheckpointMode, checkpoint_mode
from zephon_columnar.engine.checkpoint.state import (
    EpochMarker,
    HeldRows,
    LaneCursor,
    LaneSnapshot,
    LaneState,
    PipelineState,
    QueueEntry,
    ResumePoint,
    StageState,
    held_for_collector,
    source_state_field,
    source_state_of,
)

__all__ = [
    "FORMAT",
    "VERSION",
    "CheckpointBy",
    "CheckpointMode",
    "EpochMarker",
    "HeldRows",
    "LaneCursor",
    "LaneSnapshot",
    "LaneState",
    "PipelineState",
    "QueueEntry",
    "ResumePoint",
    "StageState",
    "build_checkpoint",
    "check_lane_state",
    "check_numbers",
    "check_recipe",
    "checkpoint_bytes",
    "checkpoint_mode",
    "held_for_collector",
    "lane_from_json",
    "lane_to_json",
    "load_checkpoint",
    "merge_checkpoints",
    "parse_checkpoint",
    "source_state_field",
    "source_state_of",
    "verify_digests",
    "with_digests",
]
