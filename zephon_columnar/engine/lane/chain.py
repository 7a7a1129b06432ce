"""`LaneChain`: one lane's source, steps and collector, built from a `LaneSetup` and a start.

    Source -> ParallelStep (fetch ...) -> EmptyPassGuard -> [ParallelStep | OrderedStep]... -> Collector

The steps line up with the plan's stages. How the lane starts (the stream's start, a replayed
flush epoch, a snapshot) is its start object's business (`start.lane_start`), and how it is
checkpointed its ledger's (`start.lane_ledger`): the chain itself knows neither mode.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from zephon_columnar.engine.checkpoint import CheckpointMode, LaneState
from zephon_columnar.engine.lane.collector import Collector
from zephon_columnar.engine.lane.regenerate import Regenerator
from zephon_columnar.engine.lane.setup import LaneItem, LaneSetup, LaneShared
from zephon_columnar.engine.lane.snapshot import resume_floor
from zephon_columnar.engine.lane.source import Source
from zephon_columnar.engine.lane.start import LaneStart, lane_ledger
from zephon_columnar.engine.lane.steps import EmptyPassGuard, OrderedStep, ParallelStep, StageEpoch
from zephon_columnar.engine.plan import ParallelStage
from zephon_columnar.engine.runners import Runner
from zephon_columnar.losses import Notices


class LaneChain:
    """A lane's source, steps (aligned with the plan's stages) and collector, from ``start``;
    iterating it gives the lane's items. ``in_transit``: how many items delivered here may not
    have reached their consumer when a checkpoint is asked for (a side process's ring).

    Tell it of every item delivered to the caller (`delivered`); `state` is the lane's
    checkpoint after its first ``items`` items.
    """

    def __init__(
        self,
        setup: LaneSetup,
        lane: int,
        start: LaneStart,
        runner: Runner,
        notices: Notices,
        checkpoints: CheckpointMode,
        *,
        in_transit: int = 0,
    ) -> None:
        self.setup = setup
        self.lane = lane
        self.runner = runner
        self.restored_from = start.restored_from
        plan, k = setup.plan, setup.plan.flush_every
        ws = setup.work_source.clone_for_lane(lane, setup.canonical_replicas)
        ws.load_state_dict(start.source_state)
        start = start.restated(ws.state_dict())
        self.shared = LaneShared(lane, ws, setup.rows_per_item, notices, setup.canonical_replicas)
        start.prime(self.shared)
        self.ledger = lane_ledger(checkpoints, self, start, in_transit=in_transit)
        self.source = Source(setup, self.shared, ws, *start.source_position(k))
        epochs = start.flush_epochs(k, len(plan.ordered_stages()))  # by ordered stage, then the collector
        self.steps: list[ParallelStep | OrderedStep] = []
        self.regen = Regenerator(plan, runner, self.shared, self.steps)
        # A runner that computes at submit time: anything it ran ahead would only delay the item
        # being asked for.
        window = 0 if runner.traits.computes_at_submit else setup.window
        events: Iterator[Any] = iter(self.source)
        parallel_index = ordered_index = 0
        for pos, stage in enumerate(plan.stages):
            if isinstance(stage, ParallelStage):
                step: ParallelStep | OrderedStep = ParallelStep(events, runner, parallel_index, window)
                parallel_index += 1
            else:
                epoch = StageEpoch(epochs[ordered_index])  # the stage's own flush epoch, moved on by its step
                acc = stage.op.lane_accumulator(dataclasses.replace(self.shared.ctx, flush_epoch=epoch.get))
                queued, inbox = start.restore_stage(ordered_index, pos, acc, self.regen, op=stage.op.op_name())
                step = OrderedStep(events, stage.op, pos, self.shared, acc, queued, inbox, epoch)
                ordered_index += 1
            step.metrics, step.lane = runner.metrics, lane  # execution tracking
            self.steps.append(step)
            events = iter(step)
            if pos == 0:
                assert isinstance(step, ParallelStep)  # fetch is always first
                self.guard = EmptyPassGuard(
                    events, step, lane, self.shared.ctx.rows_per_pass, only_lane=self.shared.ctx.lanes == 1
                )
                events = iter(self.guard)
        skip, state = start.collector_skip()
        self.collector = Collector(setup, self.shared, events, epochs[-1], skip, state)
        self.source.resume_floor = lambda: resume_floor(self)
        start.restore_collector(self.collector, self.regen, len(plan.stages) - 1)

    def __iter__(self) -> Iterator[LaneItem]:
        return iter(self.collector)

    def delivered(self, item: LaneItem, items: int) -> None:
        """``item``, the lane's ``items``-th, reached the caller."""
        self.ledger.delivered(item, items)

    def state(self, items: int, undelivered: Sequence[pa.Table] = ()) -> LaneState:
        """The lane's checkpoint after its first ``items`` items, with the frames of items made
        and not handed over (``undelivered``) put back; read between two deliveries."""
        return self.ledger.state(items, undelivered)
