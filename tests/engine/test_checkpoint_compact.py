"""A wide mixture's work-source state in a checkpoint (engine/checkpoint/compact.py): tens of
bytes a dataset in each lane until the dataset is read, the very state back on restore, and
checkpoints written before (version 3) still restored."""

from __future__ import annotations

import itertools
import json

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.engine.checkpoint import load_checkpoint, with_digests
from zephon_columnar.engine.checkpoint.compact import (
    COMPACT_FROM,
    compacted,
    compacted_recipe,
    expanded,
    expanded_recipe,
)
from zephon_columnar.testing import signature


def wide(datasets: int, lanes: int = 2) -> Pipeline:
    parts = [Dataset.from_tables(f"d{i:04d}", [pa.table({"x": list(range(i * 10, i * 10 + 10))})])
             for i in range(datasets)]
    ws = StaticMixtureWorkSource(parts, {f"d{i:04d}": 1.0 + i % 4 for i in range(datasets)}, chunk_size=16, seed=2)
    return Pipeline(ws).batch(4).options(canonical_replicas=lanes)


def source_state(lane: dict) -> dict:
    return lane["resume"]["source_state"] if "resume" in lane else lane["source_state"]


def test_a_dataset_costs_tens_of_bytes_in_each_lane_until_it_is_read():
    lane, whole = {}, {}
    for n in (100, 400):
        pipe = wide(n)
        it = iter(pipe)
        next(it)
        ckpt = pipe.checkpoint()
        it.close()
        lane[n] = len(json.dumps(source_state(ckpt["lanes"]["1"])))
        whole[n] = len(json.dumps(ckpt))
    # Was ~420 bytes a dataset in each lane (a dozen maps with an entry per dataset) and ~180 in
    # the recipe; now its name, weight and shard digest in the recipe, and a few bytes a lane.
    assert (lane[400] - lane[100]) / 300 < 10, lane
    assert (whole[400] - whole[100]) / 300 < 80, whole


def test_the_stream_after_a_restore_is_the_uninterrupted_one():
    full = [signature(x) for x in itertools.islice(wide(40), 60)]
    for cut in (1, 13, 37):
        pipe = wide(40)
        it = iter(pipe)
        head = [signature(x) for x in itertools.islice(it, cut)]
        ckpt = json.loads(json.dumps(pipe.checkpoint()))
        it.close()
        resumed = wide(40)
        resumed.restore(ckpt)
        assert head + [signature(x) for x in itertools.islice(resumed, 60 - cut)] == full


def test_a_version_3_checkpoint_with_the_maps_written_out_still_restores():
    pipe = wide(20)
    it = iter(pipe)
    head = [signature(x) for x in itertools.islice(it, 9)]
    ckpt = load_checkpoint(pipe.checkpoint())
    it.close()
    work_source = ckpt["recipe"]["work_source"]
    old = dict(ckpt, version=3, lanes={})
    for key, lane in ckpt["lanes"].items():
        whole = dict(expanded(source_state(lane), f"lanes.{key}", work_source), recipe="<recipe.work_source>")
        assert "<common>" not in json.dumps(whole) and "<in_order>" not in json.dumps(whole)
        old["lanes"][key] = dict(lane, resume=dict(lane["resume"], source_state=whole))
    resumed = wide(20)
    resumed.restore(with_digests(old))
    assert head + [signature(x) for x in itertools.islice(resumed, 20)] == [
        signature(x) for x in itertools.islice(wide(20), 29)]


values = st.one_of(st.none(), st.integers(-3, 3), st.sampled_from(["a", "0", "1/3"]),
                   st.fixed_dictionaries({"epoch": st.integers(0, 2), "position": st.integers(0, 5)}))


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 3 * COMPACT_FROM), data=st.data())
def test_every_state_comes_back_whole(n, data):
    order = [f"c{i}" for i in range(n)]
    maps = data.draw(st.lists(st.lists(values, min_size=n, max_size=n), min_size=1, max_size=4))
    state = {"component_order": order, "scalar": 7, **{f"m{j}": dict(zip(order, m)) for j, m in enumerate(maps)}}
    recipe = {"mixture": {c: 1.0 for c in order}, "datasets": [{"name": c} for c in order]}
    state["dataset_ids"] = {c: i for i, c in enumerate(order)}
    small = json.loads(json.dumps(compacted(state, recipe)))
    assert expanded(small, "state", recipe) == state
    if n < COMPACT_FROM:
        assert small == state
    work_source = dict(recipe, mixture={c: 1.0 + i % 2 for i, c in enumerate(order)},
                       datasets=[{"name": c, "rows": i} for i, c in enumerate(order)],
                       **{k: v for k, v in state.items() if k.startswith("m")})
    written = json.loads(json.dumps(compacted_recipe({"work_source": work_source, "ops": []})))
    assert expanded_recipe(written) == {"work_source": work_source, "ops": []}
