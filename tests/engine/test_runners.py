"""The process runner's failures: a worker that dies is an error naming what happened, never a hang."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.errors import PipelineError
from zephon_columnar.ops import BaseOp, OpTraits

DS = Dataset.from_tables("a", [pa.table({"x": list(range(200_000))})])


class DiesInWorkers(BaseOp):
    """Exits its process in ``setup`` (or on its first frame) inside a process runner's worker."""

    name = "dies"

    def __init__(self, when: str) -> None:
        super().__init__()
        self.when = when

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True)

    def setup(self, ctx) -> None:
        if self.when == "setup" and os.environ.get("ZEPHON_COLUMNAR_PROCESS_WORKER") == "1":
            os._exit(3)

    def process_many(self, records):
        if self.when == "frame" and os.environ.get("ZEPHON_COLUMNAR_PROCESS_WORKER") == "1":
            os._exit(4)
        return records


@pytest.mark.parametrize("when", ["setup", "frame"])
def test_a_worker_that_dies_is_a_pipeline_error_not_a_hang(when):
    pipe = (Pipeline(StaticMixtureWorkSource([DS], {"a": 1.0}, seed=1, chunk_size=64))
            .add_op(DiesInWorkers(when)).options(runner="process", max_workers=2))
    with pytest.raises(PipelineError, match="a worker process died"):
        sum(1 for _ in pipe)
    in_process = iter(pipe.options(runner="threads"))
    assert [next(in_process).payload["x"] for _ in range(3)] == [0, 1, 2]  # the same pipeline runs in-process
    in_process.close()
