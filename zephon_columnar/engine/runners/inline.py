"""The inline runner: every stage in the calling thread, nothing in the background."""

from __future__ import annotations

import concurrent.futures as cf
from typing import Any

import pyarrow as pa

from zephon_columnar.engine.runners.base import RunnerBase, RunnerTraits
from zephon_columnar.engine.runners.stages import run_stage, setup_stages


class InlineRunner(RunnerBase):
    """Runs stages in the calling thread; ``submit`` returns a finished future (``time_limit_s``
    does not apply: a call here runs in the caller's own thread)."""

    traits = RunnerTraits(
        name="inline", place="local", computes_at_submit=True, own_readers=False, starts_processes=False
    )

    def start_workers(self) -> None:
        self.workers = 1
        self._ops = setup_stages(self.stages, self.services)

    def result(self, fut: cf.Future[Any]) -> pa.Table:
        out: pa.Table = fut.result()
        return out

    def submit(self, stage: int, frame: pa.Table) -> cf.Future[Any]:
        fut: cf.Future[Any] = cf.Future()
        try:
            fut.set_result(run_stage(self._ops[stage], frame, stage, self.sink))
        except BaseException as err:  # noqa: BLE001 - delivered where the result is read, like other runners
            fut.set_exception(err)
        return fut

    def cancel(self) -> None:
        self.cancelled.set()

    def close(self) -> None:
        for row in self._ops:
            for op in row:
                op.teardown()
