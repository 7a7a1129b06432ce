"""Every error reaches the caller as an instance of the built-in class a user would catch."""

from __future__ import annotations

import pyarrow as pa
import pytest

from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.errors import PipelineError, operator_failure
from zephon_columnar.testing import collect


class QualityModelError(ValueError):
    """A user's own exception class, raised inside a worker."""


def rows_pipeline(fn, runner):
    ds = Dataset.from_tables("t", [pa.table({"x": list(range(20))})])
    ws = StaticMixtureWorkSource([ds], {"t": 1.0}, chunk_size=8)
    return Pipeline(ws).map_transform(fn).batch(2).options(runner=runner)


@pytest.mark.parametrize("runner", ["inline", "threads", "process"])
@pytest.mark.parametrize("exc", [ValueError, KeyError, TypeError, FileNotFoundError, QualityModelError])
def test_a_worker_error_keeps_its_class(runner, exc):
    def fn(p):
        if p["x"] == 13:
            raise exc("row thirteen is bad")
        return p

    with pytest.raises(exc) as info:
        collect(rows_pipeline(fn, runner))
    err = info.value
    assert isinstance(err, PipelineError)
    assert "row thirteen is bad" in str(err) and "map_transform" in str(err)
    assert isinstance(err.__cause__, exc)


def test_stop_iteration_in_user_code_does_not_end_the_stream_silently():
    def fn(p):
        if p["x"] == 5:
            raise StopIteration
        return p

    with pytest.raises(PipelineError) as info:
        collect(rows_pipeline(fn, "threads"))
    assert not isinstance(info.value, StopIteration)


def test_operator_failure_passes_library_errors_through():
    from zephon_columnar.errors import ConfigError

    err = ConfigError("bad option")
    assert operator_failure(err, "ignored") is err
