"""End-to-end pipeline behaviour: exactly once, determinism, transforms, iteration lifecycle."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from zephon_columnar import Dataset, InMemoryShard, Pipeline, StaticMixtureWorkSource
from zephon_columnar.errors import ConfigError, PipelineError
from zephon_columnar.testing import collect
from tests.extras import require


def web_source(web_dir, **kw):
    kw.setdefault("chunk_size", 32)
    kw.setdefault("seed", 7)
    return StaticMixtureWorkSource([Dataset.from_path("web", str(web_dir))], {"web": 1.0}, **kw)


def mixed_source(web_dir, code_dir, **kw):
    kw.setdefault("chunk_size", 16)
    kw.setdefault("seed", 42)
    web = Dataset.from_path("web", str(web_dir))
    code = Dataset.from_path("code", str(code_dir))
    return StaticMixtureWorkSource([web, code], {"web": 0.7, "code": 0.3}, **kw)


def ids_of(pipe) -> list[int]:
    out = []
    for item in pipe:
        out.extend(item.to_pydict()["id"] if hasattr(item, "to_pydict") else [item.payload["id"]])
    return out


@pytest.mark.parametrize("chunk_size", [1, 7, 32, 120, 16384])
def test_every_row_exactly_once_including_last_partial_chunk(web_dir, chunk_size):
    ids = ids_of(Pipeline(web_source(web_dir, chunk_size=chunk_size)).batch(5, drop_last=False))
    assert sorted(ids) == list(range(120))


def test_records_without_batch_exactly_once(web_dir):
    recs = list(Pipeline(web_source(web_dir)))
    assert sorted(r.payload["id"] for r in recs) == list(range(120))
    assert all(r.payload["text"] for r in recs)


def test_drop_last_drops_only_the_short_tail(web_dir):
    batches = list(Pipeline(web_source(web_dir)).batch(7))
    assert all(len(b) == 7 for b in batches)
    assert len(batches) == 120 // 7


@pytest.mark.parametrize("opts", [
    dict(runner="inline"),
    dict(runner="threads", max_workers=1),
    dict(runner="threads", max_workers=4, prefetch_batches=1, op_queue_capacity=1),
    dict(runner="threads", max_workers=2, prefetch_batches=64, op_queue_capacity=32),
    dict(runner="process", max_workers=2),
])
def test_same_batches_whatever_the_runner_and_depths(web_dir, code_dir, opts):
    def build(**o):
        return (Pipeline(mixed_source(web_dir, code_dir)).fetch(parallelism=4, max_batch=5)
                .map_transform(pl.col("text").str.to_uppercase()).batch(4).options(**o))

    reference = collect(build(runner="inline"))
    assert len(reference) > 10
    assert collect(build(**opts)) == reference


def test_fetch_batch_size_does_not_change_data(web_dir, code_dir):
    a = collect(Pipeline(mixed_source(web_dir, code_dir)).fetch(max_batch=3).batch(4))
    b = collect(Pipeline(mixed_source(web_dir, code_dir)).fetch(max_batch=1000).batch(4))
    assert a == b


def test_seed_changes_order_not_content(web_dir):
    a = ids_of(Pipeline(web_source(web_dir, seed=1, shuffle_within_shard=True)).batch(4, drop_last=False))
    b = ids_of(Pipeline(web_source(web_dir, seed=2, shuffle_within_shard=True)).batch(4, drop_last=False))
    c = ids_of(Pipeline(web_source(web_dir, seed=1, shuffle_within_shard=True)).batch(4, drop_last=False))
    assert a == c and a != b and sorted(a) == sorted(b)


def test_mixture_ratio_and_components(web_dir, code_dir):
    # 120 web rows at 0.7: the source ends when both datasets completed a pass; code repeats.
    recs = list(Pipeline(mixed_source(web_dir, code_dir)))
    comp = Counter(r.meta.sample_id[0] for r in recs)
    assert comp[0] >= 120 and comp[1] >= 50
    assert abs(comp[0] / (comp[0] + comp[1]) - 0.7) < 0.03
    assert set(r.payload["id"] for r in recs if r.meta.sample_id[0] == 0) == set(range(120))


def test_map_transform_callable_drops_and_rewrites(web_dir):
    def keep_even(p):
        return {**p, "n_words": len(p["text"].split())} if p["id"] % 2 == 0 else None

    recs = list(Pipeline(web_source(web_dir)).map_transform(keep_even))
    assert sorted(r.payload["id"] for r in recs) == list(range(0, 120, 2))
    assert all(r.payload["n_words"] == len(r.payload["text"].split()) for r in recs)


def test_polars_and_arrow_filters(web_dir):
    a = ids_of(Pipeline(web_source(web_dir)).filter(pl.col("id") % 3 == 0).batch(4, drop_last=False))
    b = ids_of(Pipeline(web_source(web_dir)).filter(pc.equal(pc.divide(pc.field("id"), 3) * 3, pc.field("id"))).batch(4, drop_last=False))
    c = ids_of(Pipeline(web_source(web_dir)).filter(lambda p: p["id"] % 3 == 0).batch(4, drop_last=False))
    assert sorted(a) == list(range(0, 120, 3)) and a == b == c


def test_polars_expressions_list(web_dir):
    recs = list(Pipeline(web_source(web_dir)).map_transform(
        [pl.col("text").str.len_chars().alias("chars"), (pl.col("id") * 2).alias("twice")]))
    assert all(r.payload["chars"] == len(r.payload["text"]) and r.payload["twice"] == 2 * r.payload["id"]
               for r in recs)


def test_in_memory_dataset(tmp_path):
    ds = Dataset.from_dict("mem", {0: InMemoryShard([{"x": i} for i in range(10)]),
                                   1: InMemoryShard([{"x": 10 + i} for i in range(5)])})
    ws = StaticMixtureWorkSource([ds], {"mem": 1.0}, chunk_size=4)
    assert sorted(r.payload["x"] for r in Pipeline(ws)) == list(range(15))


def test_iterating_again_starts_from_the_beginning(web_dir):
    pipe = Pipeline(web_source(web_dir)).batch(4)
    first = collect(pipe, limit=3)
    again = collect(pipe)
    assert again[:3] == first and len(again) == 30


def test_second_concurrent_iteration_is_refused(web_dir):
    pipe = Pipeline(web_source(web_dir)).batch(4)
    it = iter(pipe)
    next(it)
    with pytest.raises(RuntimeError, match="already being iterated"):
        iter(pipe)
    it.close()
    assert len(collect(pipe)) == 30


@pytest.mark.parametrize("runner, place, resolved", [
    (None, "local", "threads"), ("inline", "local", "inline"), ("threads", "local", "threads"),
    ("process", "local", "process"), ("remote", "remote", "remote"), ("ray", "remote", "remote"),
])
def test_explain_names_each_runner_and_where_its_stages_run(web_dir, runner, place, resolved):
    # explain() once printed place=local for the Ray runner: it compared the resolved name with
    # "ray", which resolving had already turned into "remote". It reads the runner's traits now.
    if resolved == "remote":
        require("ray", "ray")  # the option checks that Ray is installed
    text = Pipeline(web_source(web_dir)).batch(2).options(runner=runner, max_workers=2).explain()
    stages = [line for line in text.splitlines() if line.startswith("Stage[")]
    assert stages and all(f"place={place}" in line for line in stages), text
    assert f"runner={resolved} " in text and f"on the {resolved!r} runner" in text, text
    # the inline runner computes at submit: no prefetch thread even when asked for
    asked = Pipeline(web_source(web_dir)).batch(2).options(runner=runner, prefetch_batches=2).explain()
    assert ("no prefetch thread" in asked) == (resolved == "inline"), asked


def _zephon_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("zephon")}


@pytest.mark.parametrize("prefetch_batches", [None, 0, 3])
def test_prefetch_thread_runs_only_when_asked_for(web_dir, prefetch_batches):
    # 0 is Zephon's "no batch prefetch": accepted, and no thread, as None.
    pipe = (Pipeline(web_source(web_dir, chunk_size=4)).fetch(max_batch=2).batch(2)
            .options(runner="threads", prefetch_batches=prefetch_batches))
    it = iter(pipe)
    next(it)
    running = "zephon-prefetch" in _zephon_threads()
    it.close()
    assert running == bool(prefetch_batches)
    assert ("prefetch thread 3 items ahead" in pipe.explain()) == bool(prefetch_batches)
    assert ("no prefetch thread" in pipe.explain()) == (not prefetch_batches)


@pytest.mark.parametrize("runner,prefetch_batches", [("threads", None), ("threads", 2), ("process", None)])
def test_closing_early_leaves_no_threads_or_processes(web_dir, runner, prefetch_batches):
    import multiprocessing

    before = _zephon_threads()
    pipe = (Pipeline(web_source(web_dir, chunk_size=4)).fetch(max_batch=2).batch(2)
            .options(runner=runner, prefetch_batches=prefetch_batches))
    it = iter(pipe)
    next(it)
    it.close()
    assert _zephon_threads() - before == set()
    # The pool's manager thread and close() both reap the workers; multiprocessing's own list can
    # lag a moment behind the OS (an ECHILD race in Popen.poll), so give it a short deadline. A
    # leaked worker stays listed forever.
    deadline = time.monotonic() + 5
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert multiprocessing.active_children() == []


def test_dropping_the_iterator_stops_the_engine(web_dir):
    before = _zephon_threads()
    for i, _ in enumerate(Pipeline(web_source(web_dir, chunk_size=4)).fetch(max_batch=2).batch(2)):
        if i == 2:
            break
    import gc

    gc.collect()
    assert _zephon_threads() - before == set()


@pytest.mark.parametrize("runner", ["inline", "threads", "process"])
def test_worker_error_reaches_next(web_dir, runner):
    def boom(p):
        if p["id"] == 77:
            raise KeyError("missing_field")
        return p

    pipe = Pipeline(web_source(web_dir)).map_transform(boom).batch(4).options(runner=runner)
    with pytest.raises(KeyError, match="missing_field") as info:  # the worker's error keeps its type
        collect(pipe)
    assert isinstance(info.value, PipelineError) and "id" not in str(type(info.value))


def test_an_unknown_option_names_the_closest_and_lists_the_working_ones_apart_from_the_inert(web_dir):
    from zephon_columnar.compatibility import INERT_OPTIONS

    with pytest.raises(ConfigError) as info:
        Pipeline(web_source(web_dir)).options(runer="threads", not_an_option=1)
    text = str(info.value)
    assert "'not_an_option', 'runer' (did you mean 'runner'?)" in text
    working, inert = text.split("; also accepted, for Zephon compatibility, with no effect here: ")
    assert "canonical_replicas" in working and "mp_context" in inert
    assert not any(f" {name}," in working or f" {name};" in working for name in INERT_OPTIONS)
    with pytest.raises(ConfigError, match=r"'num_workers' \(did you mean 'max_workers'\?\), \(DataLoader workers: "
                                          r"pipe\.to_torch_loader\(num_workers=\.\.\.\)\)"):
        Pipeline(web_source(web_dir)).options(num_workers=2)


def test_options_accumulate_over_calls_and_are_checked_together_at_iteration(web_dir):
    pipe = Pipeline(web_source(web_dir)).batch(4)
    pipe.options(dp_degree=2, dp_group_id=1, canonical_replicas=2, runner="inline")  # world_size comes later
    pipe.options(world_size=2, global_rank=1)
    assert pipe.spec.options.dp_degree == 2 and pipe.spec.options.world_size == 2  # the first call kept
    assert len(collect(pipe)) > 0
    pipe.options(world_size=3, global_rank=0)
    with pytest.raises(ConfigError, match="multiple of dp_degree"):
        iter(pipe)
    pipe.options(world_size=2, global_rank=2)
    with pytest.raises(ConfigError, match="global_rank"):
        pipe.explain()


def test_zephon_only_options_are_accepted(web_dir):
    pipe = Pipeline(web_source(web_dir)).batch(4).options(
        mtp_mode=False, shm_enabled=True, ipc_transport="pipe", worker_allocation="global",
        shm_coalesce=True, shm_min_item_bytes=1, aggregate_serializer="msgpack", deterministic=True)
    assert len(collect(pipe)) == 30


def test_op_after_batch_is_refused(web_dir):
    with pytest.raises(ConfigError, match="only map_batch may follow batch"):
        Pipeline(web_source(web_dir)).batch(4).map_transform(lambda p: p)


def test_explain_names_stages(web_dir):
    text = Pipeline(web_source(web_dir)).map_transform(lambda p: p).batch(4).explain()
    assert "fetch" in text and "map_transform" in text and "batch(4" in text


@pytest.mark.parametrize("parallelism", [1, 2, 4])
def test_fetch_parallelism_does_not_change_data(web_dir, code_dir, parallelism):
    def build(p):
        return (Pipeline(mixed_source(web_dir, code_dir)).fetch(parallelism=p, max_batch=4)
                .map_transform(lambda row: {**row, "n": len(row["text"])}, parallelism=p).batch(3)
                .options(runner="threads", max_workers=4))

    assert collect(build(parallelism)) == collect(build(1).options(runner="inline"))


@pytest.mark.parametrize("prefetch_batches", [None, 2])
def test_close_from_another_thread_stops_the_consumer(web_dir, prefetch_batches):
    import time

    def slow(p):
        time.sleep(0.002)
        return p

    before = _zephon_threads()
    pipe = (Pipeline(web_source(web_dir, chunk_size=4)).fetch(max_batch=2).map_transform(slow).batch(2)
            .options(prefetch_batches=prefetch_batches))
    it = iter(pipe)
    got = []

    def consume():
        got.extend(it)

    t = threading.Thread(target=consume)
    t.start()
    time.sleep(0.05)
    it.close()
    t.join(10)
    assert not t.is_alive() and 0 < len(got) < 60
    it.close()
    assert _zephon_threads() - before == set()


def test_options_cannot_change_during_iteration_and_checkpoint_describes_the_run(web_dir):
    pipe = Pipeline(web_source(web_dir)).batch(4)
    it = iter(pipe)
    next(it)
    with pytest.raises(RuntimeError, match="being iterated"):
        pipe.options(flush_every_k_chunks=3)
    it.close()


def test_restore_keeps_every_lane_until_iteration(web_dir):
    def build(groups, rank):
        return Pipeline(web_source(web_dir, chunk_size=4)).batch(2).options(
            runner="inline", canonical_replicas=2, world_size=groups, global_rank=rank)

    full = {sig for sig in collect(build(1, 0))}
    single = build(1, 0)
    it = iter(single)
    head = [next(it) for _ in range(6)]
    ckpt = single.checkpoint()
    it.close()
    pipe = build(1, 0)
    pipe.restore(ckpt)
    pipe.options(world_size=2, global_rank=1)  # now owns lane 1 only
    rest = collect(pipe)
    other = build(2, 0)
    other.restore(ckpt)
    rest += collect(other)
    from zephon_columnar.testing import signature

    delivered = [signature(b) for b in head] + rest
    assert set(delivered) == full and len(delivered) == len(full)  # nothing skipped or repeated


@pytest.fixture(scope="module")
def parquet_and_jsonl(tmp_path_factory):
    """A Parquet dataset (uid, text, n, vec) and a JSONL dataset (uid, text, n, meta)."""
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("mix")
    (root / "p").mkdir()
    (root / "j").mkdir()
    for s in range(2):
        pq.write_table(pa.table({"uid": list(range(s * 30, s * 30 + 30)), "text": ["p"] * 30, "n": [1] * 30,
                                 "vec": [[0.5, 1.5]] * 30}), root / "p" / f"{s}.parquet", row_group_size=7)
        with open(root / "j" / f"{s}.jsonl", "w") as f:
            for i in range(25):
                f.write(json.dumps({"uid": 1000 + s * 25 + i, "text": "j", "n": 2, "meta": {"src": "j"}}) + "\n")
    return (Dataset.from_path("p", str(root / "p")), Dataset.from_path("j", str(root / "j")))


def test_records_hold_their_own_datasets_fields_only(parquet_and_jsonl):
    ws = StaticMixtureWorkSource(list(parquet_and_jsonl), {"p": 0.5, "j": 0.5}, chunk_size=16)
    seen = set()
    for batch in Pipeline(ws).batch(4):
        for rec in batch.records:
            keys = sorted(rec.payload)
            want = ["n", "text", "uid", "vec"] if rec.meta.sample_id[0] == 0 else ["meta", "n", "text", "uid"]
            assert keys == want, (rec.meta.sample_id, keys)
            seen.add(rec.meta.sample_id[0])
    assert seen == {0, 1}  # batches really mixed both datasets
    for rec in Pipeline(ws):  # records without batch(): the same rule
        assert ("meta" in rec.payload) == (rec.meta.sample_id[0] == 1)


@pytest.mark.parametrize("runner", ["inline", "threads", "process"])
def test_arrow_filter_over_a_mixture_flows_through_empty_chunks(parquet_and_jsonl, runner):
    ws = StaticMixtureWorkSource(list(parquet_and_jsonl), {"p": 0.5, "j": 0.5}, chunk_size=16)
    everything = collect(Pipeline(ws).batch(1).options(runner="inline"))
    for expr, keep in ((pc.field("n") == 2, 2), (pc.field("n") == 1, 1), (pc.field("uid") < 0, None)):
        got = collect(Pipeline(ws).filter(expr).batch(1).options(runner=runner))
        want = [s for s in everything if keep is not None and json.loads(s[3])["n"] == [keep]]
        assert got == want


def test_builder_signatures_show_their_literal_options():
    """inspect.signature (IDEs, CLI builders) sees each string option's Literal itself, not its
    name as a string: the builder module does not postpone annotations."""
    import inspect
    import typing

    from zephon_columnar.ops import config

    literals = [getattr(config, name) for name in config.__all__]
    seen = []
    for name, method in inspect.getmembers(Pipeline, inspect.isfunction):
        if name.startswith("_") or method.__module__ != Pipeline.__module__:
            continue
        for param in inspect.signature(method).parameters.values():
            assert not isinstance(param.annotation, str), (name, param.name, param.annotation)
            for arg in (param.annotation, *typing.get_args(param.annotation)):
                seen += [lit for lit in literals if arg is lit]
    missing = [name for name, lit in zip(config.__all__, literals) if not any(lit is s for s in seen)]
    assert not missing, missing


def test_repr_says_what_the_pipeline_reads_and_does_and_whether_it_is_running(web_dir):
    pipe = Pipeline(web_source(web_dir, chunk_size=4)).shuffle(8, seed=1).batch(2)
    text = repr(pipe)
    assert text.startswith("Pipeline(StaticMixtureWorkSource(") and text.endswith("-> fetch -> shuffle -> batch)")
    it = iter(pipe)
    next(it)
    assert repr(pipe).endswith("-> fetch -> shuffle -> batch, iterating)")
    it.close()
    assert not repr(pipe).endswith("iterating)")


def test_explain_starts_with_the_data_recipe(web_dir, code_dir):
    web, code = Dataset.from_path("web", str(web_dir)), Dataset.from_path("code", str(code_dir))
    ws = StaticMixtureWorkSource([web, code], {"web": 0.75, "code": 0.25}, chunk_size=8, seed=11,
                                 exhausted_policy={"web": "stop", "code": "repeat"})
    lines = Pipeline(ws).batch(2).explain().splitlines()
    read = sum(len(b) for b in Pipeline(ws).batch(2, drop_last=False))  # what explain says is read, is read
    bound = "" if read == ws.rows_per_pass() else f" (a pass is at most {ws.rows_per_pass():,})"
    assert lines[0] == ("Data: StaticMixtureWorkSource: chunk_size=8, seed=11, samples mixed by rows; "
                        f"the stream reads {read:,} rows{bound}")
    assert lines[1] == f"  web: parquet at {web_dir}, 3 shard(s), 120 rows, weight 0.750, exhausted_policy='stop'"
    assert lines[2] == f"  code: jsonl at {code_dir}, 2 shard(s), 50 rows, weight 0.250, repeats"
    assert lines[3].startswith("Stage[0]")
