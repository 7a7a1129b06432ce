"""What is accepted for Zephon compatibility and has no effect: listed in one place
(`zephon_columnar.compatibility`), never read by the engine, and named by ``explain()`` when set."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pytest

from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.compatibility import INERT_OPTIONS, PLACEMENT
from zephon_columnar.errors import ConfigError
from zephon_columnar.ops import Accumulator, CountingAccumulator
from zephon_columnar.options import RuntimeOptions

PACKAGE = Path(__file__).resolve().parent.parent / "zephon_columnar"


def _pipe() -> Pipeline:
    ds = Dataset.from_tables("d", [pa.table({"text": [f"row {i}" for i in range(16)]})])
    return Pipeline(StaticMixtureWorkSource([ds], {"d": 1.0}, chunk_size=4))


def test_every_option_is_read_by_the_package_or_listed_as_inert_never_both():
    sources = {p: p.read_text() for p in PACKAGE.rglob("*.py") if p.name != "compatibility.py"}
    for name in RuntimeOptions.field_names():
        readers = sorted(str(p.relative_to(PACKAGE)) for p, text in sources.items() if re.search(rf"\.{name}\b", text))
        if name in INERT_OPTIONS:
            assert not readers, f"options({name}=...) is listed as having no effect but {readers} read it"
        else:
            assert readers, f"options({name}=...) is read nowhere: make it work or list it in INERT_OPTIONS"


def test_explain_names_the_inert_settings_a_pipeline_sets_and_only_those():
    plain = _pipe().shuffle(4).batch(2)
    assert "Accepted for Zephon compatibility" not in plain.explain()

    pipe = (
        _pipe()
        .shuffle(4, placement="driver")
        .batch(2)
        .map_batch(lambda b: b, parallelism=3)
        .options(deterministic=False, shm_enabled=False, max_workers=2)
    )
    text = pipe.explain()
    inert = text.split("Accepted for Zephon compatibility, no effect here:\n", 1)[1].splitlines()
    assert inert == [
        f"  options(deterministic=False): {INERT_OPTIONS['deterministic']}",
        f"  options(shm_enabled=False): {INERT_OPTIONS['shm_enabled']}",
        f"  shuffle(placement='driver'): {PLACEMENT}",
        "  map_batch(parallelism=3): map_batch runs in the iterating thread",
    ]
    # ... and they change nothing in the data.
    same = _pipe().shuffle(4).batch(2).options(max_workers=2)
    assert [b.to_pydict()["text"] for b in pipe] == [b.to_pydict()["text"] for b in same]


def test_a_placement_outside_zephons_values_is_refused_by_every_builder():
    with pytest.raises(ConfigError, match=r"shuffle\(placement='gpu'\): use one of"):
        _pipe().shuffle(4, placement="gpu")
    with pytest.raises(ConfigError, match=r"prefetch\(placement='gpu'\)"):
        _pipe().prefetch(placement="gpu")
    with pytest.raises(ConfigError, match=r"filter\(placement='gpu'\)"):
        _pipe().filter(lambda p: True, placement="gpu")


def test_explain_names_accumulator_hooks_the_engine_never_calls():
    class EarlyReset(Accumulator):
        def __init__(self):
            self.held = []

        def push_many(self, elems):
            return [(list(elems), 0)]

        def flush(self, *, reset=False, lane_id=None):
            return []

        def try_epoch_reset(self, boundary_chunk_id, lane_id=None):
            return True

    pipe = _pipe().add_op("early", process_many=lambda rs: rs, preserves_cursor_order=True, accumulator=EarlyReset)
    pipe = pipe.add_op(
        "timed",
        process_many=lambda rs: rs,
        preserves_cursor_order=True,
        accumulator=lambda: CountingAccumulator(4, max_latency_ms=50),
    )
    text = pipe.explain()
    assert "early: EarlyReset.try_epoch_reset: every flush point resets the accumulator" in text
    assert "timed: CountingAccumulator(max_latency_ms=50): calls are cut by count only" in text
    assert "reads_payload" not in text


def test_the_options_keywords_an_editor_sees_are_runtime_options_fields():
    import dataclasses
    import inspect
    import typing

    from zephon_columnar.options import OptionHints

    fields = typing.get_type_hints(RuntimeOptions)
    assert [f.name for f in dataclasses.fields(RuntimeOptions)] == list(fields)
    assert typing.get_type_hints(OptionHints) == fields  # the same names and types
    assert OptionHints.__total__ is False
    hints = inspect.signature(Pipeline.options).parameters["hints"]
    assert hints.kind is inspect.Parameter.VAR_KEYWORD
    assert typing.get_args(hints.annotation) == (OptionHints,)  # Unpack[OptionHints]
