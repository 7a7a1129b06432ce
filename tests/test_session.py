"""`Session`: one engine per run, from restore() to iterate(); what a holder of a run reads goes
through the `Run` protocol."""

from __future__ import annotations

import pyarrow as pa
import pytest

from zephon_columnar import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource
from zephon_columnar.engine.spec import PipelineSpec
from zephon_columnar.testing import collect

DS = Dataset.from_tables("a", [pa.table({"id": list(range(s * 20, s * 20 + 20))}) for s in range(3)])


def _pipe(**options):
    ws = StaticMixtureWorkSource([DS], MixtureSpec({"a": 1.0}), chunk_size=8, seed=2)
    return Pipeline(ws).fetch(max_batch=4).shuffle(6, seed=1).batch(3).options(runner="inline", **options)


@pytest.fixture
def engines_built(monkeypatch):
    built = []
    original = PipelineSpec.build_engine

    def counting(self):
        engine = original(self)
        built.append(engine)
        return engine

    monkeypatch.setattr(PipelineSpec, "build_engine", counting)
    return built


def _checkpoint_after(k):
    pipe = _pipe()
    it = iter(pipe)
    for _ in range(k):
        next(it)
    ckpt = pipe.checkpoint()
    it.close()
    return ckpt


def test_restore_and_the_next_pass_share_one_engine(engines_built):
    full = collect(_pipe())
    ckpt = _checkpoint_after(4)
    pipe = _pipe()
    engines_built.clear()
    pipe.restore(ckpt)
    rest = collect(pipe)
    assert len(engines_built) == 1  # restore() built it, iterate() started it
    assert pipe.session.engine() is engines_built[0]
    assert full[4:] == rest


def test_options_changed_after_restore_get_a_fresh_engine(engines_built):
    full = collect(_pipe())
    ckpt = _checkpoint_after(4)
    pipe = _pipe()
    pipe.restore(ckpt)
    restored = engines_built[-1]
    pipe = pipe.options(prefetch_batches=2)  # the same data, another spec
    rest = collect(pipe)
    assert pipe.session.engine() is not restored
    assert full[4:] == rest


@pytest.mark.parametrize("mtp_mode", [False, True])
def test_the_session_keeps_the_engine_its_run_started_from(engines_built, mtp_mode):
    pipe = _pipe(mtp_mode=mtp_mode)
    it = iter(pipe)
    next(it)
    engine = pipe.session.engine()
    assert engine is engines_built[-1]
    it.close()
    assert pipe.session.engine() is engine  # the last run's, after it closed
