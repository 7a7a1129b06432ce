"""A user-written WorkSource drives the same engine: fetch, batching, checkpoints."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from zephon_columnar import Dataset, Pipeline, WorkSource
from zephon_columnar.testing import assert_resumes_exactly
from zephon_columnar.work import WorkChunk

DS = Dataset.from_tables("nums", [pa.table({"n": list(range(100))})])


class EveryThird(WorkSource):
    """Rows 0, 3, 6, ... of one shard, 7 per chunk: the smallest useful custom source."""

    def __init__(self) -> None:
        self.position = 0

    def next_chunk(self) -> WorkChunk | None:
        rows = np.arange(self.position, min(self.position + 21, 100), 3)
        if len(rows) == 0:
            return None
        self.position += 21
        return WorkChunk({"nums": np.stack([np.zeros_like(rows), np.zeros_like(rows), rows], axis=1)})

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state) -> None:
        self.position = state["position"]

    def component_ids(self) -> dict[str, int]:
        return {"nums": 0}

    @property
    def datasets_by_id(self) -> dict:
        return {0: DS}


def test_custom_source_end_to_end_and_resume():
    rows = [n for b in Pipeline(EveryThird()).batch(4, drop_last=False) for n in b.to_pydict()["n"]]
    assert rows == list(range(0, 100, 3))
    assert_resumes_exactly(lambda: Pipeline(EveryThird()).batch(4, drop_last=False), ks=[0, 1, 4, 8, 9])


class ForgetsItsPosition(EveryThird):
    """A Zephon-style source that leaves state_dict to the base class (lane identity only)."""

    state_dict = WorkSource.state_dict
    load_state_dict = WorkSource.load_state_dict


def test_a_source_whose_state_holds_no_position_is_warned_about_at_checkpoint():
    import pytest

    from zephon_columnar.errors import ConfigurationWarning

    pipe = Pipeline(ForgetsItsPosition()).batch(4, drop_last=False)
    it = iter(pipe)
    next(it)
    with pytest.warns(ConfigurationWarning, match="restore starts it from its first chunk"):
        pipe.checkpoint()
    it.close()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = Pipeline(EveryThird()).batch(4, drop_last=False)
        next(iter(first))
        first.checkpoint()  # a source that saves its position: no warning
