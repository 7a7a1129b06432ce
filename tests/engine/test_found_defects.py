"""Regression tests for defects found by trying the loader as a user would (issue 25, §1).

Each test is named for what broke; each failed before its fix. They check the stream a resumed
pipeline delivers, not only that no error is raised.
"""

from __future__ import annotations

import itertools
import json
import threading
import warnings

import pytest

from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.errors import CheckpointError, DataDroppedWarning, EmptyPassWarning, PipelineError
from zephon_columnar.testing import signature
from tests.ops._tokenizers import make_texts, make_tokenizer


def _in_memory(name: str, rows: int, start: int = 0) -> Dataset:
    return Dataset.from_dict(name, {0: [{"x": start + i} for i in range(rows)]})


def _resume(build, k: int, *, restore_into=None) -> list[tuple]:
    """The first ``k`` items of ``build()``, checkpoint (JSON round trip), and the rest from a
    restore into ``restore_into()`` (default ``build()``)."""
    pipe = build()
    it = iter(pipe)
    head = [signature(x) for x in itertools.islice(it, k)]
    ckpt = json.loads(json.dumps(pipe.checkpoint()))
    it.close()
    resumed = (restore_into or build)()
    resumed.restore(ckpt)
    return head + [signature(x) for x in resumed]


@pytest.mark.parametrize("runner", ["inline", "threads", "process"])
@pytest.mark.parametrize("chunk_size", [1, 4, 8, 16])
def test_checkpoint_every_10_batches_of_a_stateless_plan_with_small_chunks(runner, chunk_size):
    """A stateless plan's frames span hundreds of chunks (4,096 rows); the work-source state of
    the chunk a checkpoint resumes in was dropped after 256 chunks ('no work-source state for
    chunk N' in up to 87% of the calls)."""
    def build():
        ws = StaticMixtureWorkSource([_in_memory("d", 3000)], {"d": 1.0}, chunk_size=chunk_size, seed=0,
                                     stop_after_passes=1)
        return Pipeline(ws).batch(8).options(runner=runner)

    full = [signature(x) for x in build()]
    pipe = build()
    checkpoints = {}
    for step, item in enumerate(pipe):
        if step % 10 == 0:
            checkpoints[step + 1] = json.loads(json.dumps(pipe.checkpoint()))
    assert len(checkpoints) == 38
    for after in (1, 101, 201, 371):
        resumed = build()
        resumed.restore(checkpoints[after])
        assert full[:after] + [signature(x) for x in resumed] == full, after


@pytest.mark.parametrize("mtp", [False, True])
def test_prefetched_checkpoint_keeps_the_chunk_targets_of_ensure_mixture(mtp):
    """With prefetch_batches (or mtp mode) the lane snapshot was rebuilt field by field where the
    prefetched items were put back, and its chunk targets were lost: ensure_mixture then
    balanced toward nothing after the restore (1 restore in 10 differed)."""
    def build(prefetch=None, seed=0, mtp_mode=False):
        ws = StaticMixtureWorkSource([_in_memory("a", 300), _in_memory("b", 200, 1000)], {"a": 0.6, "b": 0.4},
                                     chunk_size=5, seed=seed, stop_after_passes=1)
        pipe = Pipeline(ws).shuffle(16, seed=1).ensure_mixture(max_buffer_size=6, weight_by="samples").batch(2)
        return pipe.options(prefetch_batches=prefetch, runner="threads", flush_every_k_chunks=3, mtp_mode=mtp_mode)

    for seed in range(1 if mtp else 3):  # mtp: a side process per checkpoint, so fewer of them
        full = [signature(x) for x in build(seed=seed)]
        for k in range(0, len(full), 23 if mtp else 11):
            got = _resume(lambda: build(4, seed, mtp), k, restore_into=lambda: build(seed=seed))
            assert got == full, (seed, k)


@pytest.mark.parametrize("runner", ["inline", "threads", "process"])
def test_checkpoint_soon_after_a_restore_that_held_prefetched_rows(runner):
    """A checkpoint taken while prefetch_batches had made items ahead holds their rows by
    reference; restored, then checkpointed again before those rows were delivered, the lane had
    no work-source state for the rows' chunk (a job that restarts and saves at its first step)."""
    def build(prefetch=None, runner=runner):
        ws = StaticMixtureWorkSource([_in_memory("d", 600)], {"d": 1.0}, chunk_size=4, seed=0, stop_after_passes=1)
        return Pipeline(ws).batch(3).options(runner=runner, prefetch_batches=prefetch)

    full = [signature(x) for x in build()]
    for k in (0, 5, 17, 40):
        first = build(4, "threads")  # the inline runner has no prefetch thread
        it = iter(first)
        head = [signature(x) for x in itertools.islice(it, k)]
        ckpt = json.loads(json.dumps(first.checkpoint()))
        it.close()
        for taken in (0, 1, 2):  # checkpoint again after 0, 1, 2 more items
            second = build(4 if taken % 2 else None)
            second.restore(ckpt)
            it2 = iter(second)
            mid = [signature(x) for x in itertools.islice(it2, taken)]
            again = json.loads(json.dumps(second.checkpoint()))
            it2.close()
            third = build()
            third.restore(again)
            assert head + mid + [signature(x) for x in third] == full, (k, taken)


@pytest.mark.parametrize(("strategy", "flush_every"), [
    ("random", 1), ("length", 3),
    pytest.param("length", 1, marks=pytest.mark.slow), pytest.param("random", 3, marks=pytest.mark.slow)])
def test_replayed_stage_and_wrap_with_a_shuffle_strategy_resume_unshifted(strategy, flush_every):
    """A stateful_transform makes checkpoints replay the flush epoch, priming the fresh packer
    with the partial row it carried; with shuffle_strategy the carried row went through the
    shuffle window again, so the resumed token stream was shifted (most checkpoint steps)."""
    tok = make_tokenizer()
    rows = [{"text": t} for t in make_texts(300, seed=3)]

    def build():
        ws = StaticMixtureWorkSource([Dataset.from_dict("d", {0: rows})], {"d": 1.0}, chunk_size=8, seed=0,
                                     stop_after_passes=1)
        pipe = (Pipeline(ws).tokenize(tokenizer=tok, field="text")
                .stateful_transform("keep", init_state=lambda: 0, push=lambda state, records: (state, records))
                .pack_flat(32, algorithm="wrap", shuffle_strategy=strategy).batch(2))
        return pipe.options(flush_every_k_chunks=flush_every, canonical_replicas=2)

    full = [signature(x) for x in build()]
    for k in range(0, len(full), 5):
        assert _resume(build, k) == full, k


def _filtered(policy: dict, runner: str, *, keep=lambda x: x < 0) -> Pipeline:
    ws = StaticMixtureWorkSource([_in_memory("d", 500)], {"d": 1.0}, chunk_size=8, seed=0, **policy)
    return Pipeline(ws).filter(lambda r: keep(r["x"])).batch(1).options(runner=runner)


@pytest.mark.parametrize("runner", ["inline", "threads", "process"])
def test_a_filter_that_drops_every_row_of_a_repeating_source_is_an_error_not_a_spin(runner):
    """exhausted_policy='repeat' and a filter that keeps nothing: next() spun at 100% CPU forever."""
    with pytest.raises(PipelineError, match=r"lane 0 read \d+ rows since a row last came through its first stage, "
                                            r"more than 2 passes' worth of the data \(500 rows a pass\)"):
        next(iter(_filtered({"exhausted_policy": "repeat"}, runner)))


@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_one_pass_that_delivers_nothing_warns_once(runner):
    with pytest.warns(EmptyPassWarning, match="this pass read 500 rows of lanes \\[0\\] and delivered nothing") as seen:
        assert list(_filtered({"stop_after_passes": 1}, runner)) == []
    assert len([w for w in seen if issubclass(w.category, EmptyPassWarning)]) == 1
    with warnings.catch_warnings():  # a filter that keeps some rows: no warning, and no error on repeat
        warnings.simplefilter("error", EmptyPassWarning)
        assert len(list(_filtered({"stop_after_passes": 1}, runner, keep=lambda x: x == 499))) == 1
        assert len(list(itertools.islice(_filtered({"exhausted_policy": "repeat"}, runner,
                                                   keep=lambda x: x == 499), 3))) == 3


def test_an_exact_mixture_that_cannot_be_met_is_an_error_not_a_hang():
    """An endless source, ensure_mixture(max_buffer_size=None) and one component filtered out:
    next() never returned."""
    a = _in_memory("a", 500)
    b = _in_memory("b", 300, start=-300)
    ws = StaticMixtureWorkSource([a, b], {"a": 0.5, "b": 0.5}, chunk_size=8, seed=0, exhausted_policy="repeat")
    pipe = Pipeline(ws).filter(lambda r: r["x"] < 0).ensure_mixture(max_buffer_size=None, weight_by="samples").batch(4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataDroppedWarning)
        with pytest.raises(PipelineError, match=r"lane 0 received \d+ rows, more than 5 passes' worth of the data "
                                                r"\(1000 rows a pass\), and could emit none: target component\(s\) "
                                                r"\['a'\]"):
            next(iter(pipe))


def test_exact_mixture_drops_are_warned_once_per_pass_and_counted():
    a, b = _in_memory("a", 300), _in_memory("b", 100, start=1000)
    ws = StaticMixtureWorkSource([a, b], {"a": 0.5, "b": 0.5}, chunk_size=8, seed=0,
                                 exhausted_policy={"a": "stop", "b": "stop"})
    pipe = (Pipeline(ws).ensure_mixture(max_buffer_size=None, weight_by="samples", mixture={"a": 0.9, "b": 0.1}).batch(4)
            .options(canonical_replicas=2))
    for _ in range(2):  # each pass warns once, whatever the lanes and flush points
        with pytest.warns(DataDroppedWarning) as seen:
            list(pipe)
        drops = [w for w in seen if "ensure_mixture(max_buffer_size=None) dropped" in str(w.message)]
        assert len(drops) == 1
    dropped = [r["value"] for r in pipe.metrics_snapshot().records if r.get("name") == "ensure_mixture_dropped"]
    assert sum(dropped) > 0


@pytest.mark.parametrize("runner", ["threads", "process"])
@pytest.mark.parametrize("prefetch", [None, 2])
def test_a_checkpoint_taken_after_close_keeps_the_rows_not_delivered(runner, prefetch):
    """Found by the option oracle: close() shut the runner while a lane was taking a frame from
    its source; the frame was never submitted nor recorded in transit, so a checkpoint after
    close() resumed past it (rows lost in about 6 of 10 tries)."""
    def build(**options):
        ws = StaticMixtureWorkSource([_in_memory("d", 50)], {"d": 1.0}, chunk_size=1, seed=0, stop_after_passes=1)
        return Pipeline(ws).batch(2).options(**options)

    full = [signature(x) for x in build(runner="inline")]
    for trial in range(12):
        pipe = build(runner=runner, prefetch_batches=prefetch)
        it = iter(pipe)
        head = [signature(x) for x in itertools.islice(it, trial % 4)]
        it.close()
        ckpt = json.loads(json.dumps(pipe.checkpoint()))
        resumed = build(runner="inline")
        resumed.restore(ckpt)
        assert head + [signature(x) for x in resumed] == full, trial


def test_no_empty_pass_error_for_a_lane_that_reads_a_share_of_each_pass():
    """Found by the option oracle: with 3 lanes over 3 rows, a lane reads one row a pass
    (reshuffled), so a few filtered rows in a row said nothing about the data; the guard raised
    'every row is filtered out' depending on fetch(max_batch)."""
    ws = StaticMixtureWorkSource([_in_memory("a", 3)], {"a": 1.0}, chunk_size=1, exhausted_policy="repeat")
    for max_batch in (1, None):
        pipe = (Pipeline(ws).fetch(max_batch=max_batch).filter(lambda r: r["x"] != 1)
                .options(runner="inline", canonical_replicas=3))
        assert len(list(itertools.islice(pipe, 300))) == 300


def test_peers_checkpointed_at_the_same_step_merge_even_when_their_read_ahead_differs():
    """Found by the option oracle: two checkpoints of one position can be written differently
    (the prefetch thread had read further for one), so tensor-parallel peers' checkpoints of the
    same step did not merge ('disagrees'). Both restore the same continuation; peers at
    different steps are still refused."""
    def build(prefetch=None):
        ws = StaticMixtureWorkSource([_in_memory("d", 400)], {"d": 1.0}, chunk_size=1, seed=0, stop_after_passes=1)
        return Pipeline(ws).shuffle(8, seed=1).batch(3).options(runner="threads", prefetch_batches=prefetch)

    full = [signature(x) for x in build()]
    peers = []
    for prefetch in (None, 8):  # no read-ahead, and a queue of made items held by reference
        pipe = build(prefetch)
        it = iter(pipe)
        head = [signature(x) for x in itertools.islice(it, 5)]
        peers.append(json.loads(json.dumps(pipe.checkpoint())))
        it.close()
    assert peers[0]["lanes"] != peers[1]["lanes"]
    resumed = build()
    resumed.restore(Pipeline.merge_checkpoints(peers))
    assert head + [signature(x) for x in resumed] == full
    later = build()
    it = iter(later)
    list(itertools.islice(it, 6))
    with pytest.raises(CheckpointError, match="has 6 item\\(s\\) of lane 0 delivered, an earlier one 5"):
        Pipeline.merge_checkpoints([peers[0], later.checkpoint()])
    it.close()


def test_the_rows_drop_last_drops_are_counted_and_warned_once_per_pass():
    """batch(drop_last=True), Zephon's default, dropped each lane's last rows short of a batch
    without a word."""
    ws = StaticMixtureWorkSource([_in_memory("d", 103)], {"d": 1.0}, chunk_size=8, seed=0, stop_after_passes=1)
    pipe = Pipeline(ws).batch(4).options(canonical_replicas=2)
    with pytest.warns(DataDroppedWarning, match=r"batch\(4\) dropped \d of 103 rows \([\d.]+%\) in this pass") as seen:
        delivered = sum(len(b.ids) for b in pipe)
    assert len([w for w in seen if "drop_last" in str(w.message)]) == 1
    dropped = sum(r["value"] for r in pipe.metrics_snapshot().records if r.get("name") == "batch_dropped_final_rows")
    assert delivered + dropped == 103 and 0 < dropped < 8
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataDroppedWarning)
        keep = Pipeline(ws).batch(4, drop_last=False).options(canonical_replicas=2)
        assert sum(len(b.ids) for b in keep) == 103


def test_checkpoint_right_after_the_prefetch_thread_queued_the_item_just_delivered(monkeypatch):
    """Found by the option oracle (seed 19, a StatefulDataLoader worker's snapshot): the prefetch
    thread marks the item it is making as "in hand" and clears the mark after queueing it; a
    checkpoint taken after the caller took that item from the queue but before the mark was
    cleared counted the item as made-not-delivered, so the restore delivered it again."""
    from zephon_columnar.engine import engine as engine_module

    original_put = engine_module.Channel.put
    queued, release = threading.Event(), threading.Event()

    def put_then_pause_once(self, item, stopped):
        ok = original_put(self, item, stopped)
        if threading.current_thread().name == "zephon-prefetch" and not queued.is_set():
            queued.set()
            release.wait(10)  # the pump stops here, between queueing the item and clearing its mark
        return ok

    def build():
        ws = StaticMixtureWorkSource([_in_memory("d", 40)], {"d": 1.0}, chunk_size=8, seed=0, stop_after_passes=1)
        return Pipeline(ws).shuffle(8, seed=1).batch(4).options(runner="threads", prefetch_batches=2)

    full = [signature(x) for x in build()]
    monkeypatch.setattr(engine_module.Channel, "put", put_then_pause_once)
    pipe = build()
    it = iter(pipe)
    head = [signature(next(it))]
    assert queued.wait(10)
    ckpt = json.loads(json.dumps(pipe.checkpoint()))
    release.set()
    it.close()
    monkeypatch.setattr(engine_module.Channel, "put", original_put)
    resumed = build()
    resumed.restore(ckpt)
    assert head + [signature(x) for x in resumed] == full


def _split_source(tmp_path, *, stop: bool = False) -> StaticMixtureWorkSource:
    """Two tiny Parquet datasets (2 shards and 1) whose documents tokenize(max_length=5,
    split_long_samples=True) cuts into several pieces each."""
    from tests.conftest import write_parquet_dataset

    a = write_parquet_dataset(tmp_path / "a", shards=2, rows_per_shard=30)
    b = write_parquet_dataset(tmp_path / "b", shards=1, rows_per_shard=20, start=500)
    policy = {"exhausted_policy": "stop"} if stop else {"stop_after_passes": 1}
    return StaticMixtureWorkSource([Dataset.from_path("a", a), Dataset.from_path("b", b)], {"a": 0.6, "b": 0.4},
                                   chunk_size=4, seed=0, **policy)


@pytest.mark.parametrize("packer", ["pack_flat", "pack_sequences"])
@pytest.mark.parametrize("algorithm", ["wrap", "best_fit", "best_fit_wrap"])
@pytest.mark.parametrize("strategy", ["length", "random"])
def test_split_documents_packed_with_a_shuffle_strategy_resume_exactly(tmp_path, packer, algorithm, strategy):
    """Found by a probe: with documents split by tokenize, the shuffle window and the packer both
    held documents at a checkpoint; their references were joined with the packer's per-row state
    (``__s_skip``, ``__s_length``) null in the window's rows, and the restore refused the
    pipeline's own checkpoint as damaged ('column '__s_skip' has nulls')."""
    tok = make_tokenizer()
    source = _split_source(tmp_path)

    def build():
        pipe = Pipeline(source).tokenize(tok, field="text", max_length=5, split_long_samples=True)
        bins = {"num_bins": 2} if algorithm == "best_fit" else {}
        pack = getattr(pipe, packer)
        return pack(16, algorithm=algorithm, shuffle_strategy=strategy, **bins).options(canonical_replicas=2)

    full = [signature(x) for x in build()]
    for k in (0, 1, 5, 20):
        assert _resume(build, k) == full, k


def _kinds(value):
    """``value`` with every list and array replaced by its type and elements: equal only when the
    values and their Python types are."""
    if isinstance(value, dict):
        return {k: _kinds(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or hasattr(value, "tolist"):
        return (type(value).__name__, [_kinds(v) for v in value])
    return (type(value).__name__, value)


def test_packed_samples_are_python_lists_after_a_restore_too(tmp_path):
    """Found by a probe: rows held for the collector at a checkpoint are packed again at restore
    by a reader of their own, which found the tokens were Python lists, but were emitted by the
    lane's reader, reset at the flush point since: their packed_samples came as numpy arrays
    where the uninterrupted stream had Python lists."""
    tok = make_tokenizer()
    source = _split_source(tmp_path, stop=True)

    def build():
        return (Pipeline(source).tokenize(tok, field="text", max_length=5, split_long_samples=True)
                .shuffle(8, seed=1).ensure_mixture(max_buffer_size=6, weight_by="samples")
                .pack_sequences(16, algorithm="best_fit_wrap").options(canonical_replicas=4))

    full = list(build())
    pipe = build()
    it = iter(pipe)
    head = list(itertools.islice(it, 1))
    ckpt = json.loads(json.dumps(pipe.checkpoint()))
    it.close()
    resumed = build()
    resumed.restore(ckpt)
    got = head + list(resumed)
    assert [signature(x) for x in got] == [signature(x) for x in full]
    assert [_kinds(x.payload) for x in got] == [_kinds(x.payload) for x in full]
    assert isinstance(got[-1].payload["packed_samples"][0]["input_ids"], list)
