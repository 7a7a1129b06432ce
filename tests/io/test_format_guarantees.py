"""The guarantees every format keeps, checked on each format's files as its own library writes
them: every row once per pass (shuffled, several shards), random access to the stream's rows
(the map-style torch dataset), exact resume at random steps on every runner through tokenize and
packing in a mixture with Parquet, and a checkpoint taken on 2 data-parallel groups resumed on 1,
and that one's resumed on 4, without a row skipped or repeated.

Each format's writer is in `WRITERS`: the same three shards (30, 25 and 35 rows of ``id``,
``text`` and, where the format holds arrays, pre-tokenized ``tokens``) in the format's files.
"""

from __future__ import annotations

import json
import pickle
import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.extras import require
from tests.format_writers import litdata, streaming
from tests.ops._tokenizers import make_texts, make_tokenizer
from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.testing import collect, signature

SIZES = (30, 25, 35)
TEXTS = make_texts(sum(SIZES), seed=21)
LANES = 4


def shard_tables() -> list[pa.Table]:
    out, start = [], 0
    for n in SIZES:
        ids = list(range(start, start + n))
        tokens = [[(i * 7 + k) % 500 + 3 for k in range(1 + i % 40)] for i in ids]
        out.append(pa.table({"id": pa.array(ids, pa.int64()), "text": TEXTS[start:start + n],
                             "tokens": pa.array(tokens, pa.list_(pa.int32()))}))
        start += n
    return out


def write_parquet(folder: Path) -> Path:
    folder.mkdir(parents=True)
    for s, table in enumerate(shard_tables()):
        pq.write_table(table, folder / f"part-{s:03d}.parquet", row_group_size=8)
    return folder


def write_webdataset(folder: Path) -> Path:
    wds = require("webdataset", "formats")
    folder.mkdir(parents=True)
    for s, table in enumerate(shard_tables()):
        with wds.TarWriter(str(folder / f"shard-{s:03d}.tar")) as sink:
            for row in table.to_pylist():
                sink.write({"__key__": f"r{row['id']:05d}", "id": str(row["id"]).encode(), "text": row["text"].encode()})
    return folder


def write_lance(folder: Path) -> Path:
    lance = require("lance", "lance")
    path = folder / "corpus.lance"
    for s, table in enumerate(shard_tables()):  # one fragment per write
        lance.write_dataset(table, str(path), mode="create" if s == 0 else "append")
    return path


def write_vortex(folder: Path) -> Path:
    vortex = require("vortex", "vortex")
    folder.mkdir(parents=True)
    for s, table in enumerate(shard_tables()):
        vortex.io.write(table, str(folder / f"part-{s:03d}.vortex"))
    return folder


def write_mds(folder: Path) -> Path:
    columns = {"id": "int", "text": "str", "tokens": "ndarray:int32"}
    with streaming().MDSWriter(out=str(folder), columns=columns, size_limit=6000) as sink:  # shards by bytes
        for row in pa.concat_tables(shard_tables()).to_pylist():
            sink.write({**row, "tokens": np.asarray(row["tokens"], np.int32)})
    return folder


def write_litdata(folder: Path) -> Path:
    writer = litdata().streaming.writer.BinaryWriter(str(folder), chunk_size=30, compression="zstd")
    for i, row in enumerate(pa.concat_tables(shard_tables()).to_pylist()):
        writer.add_item(i, {**row, "tokens": np.asarray(row["tokens"], np.int32)})
    writer.done()
    writer.merge()
    return folder


WRITERS: dict[str, Callable[[Path], Path]] = {
    "parquet": write_parquet,
    "webdataset": write_webdataset,
    "lance": write_lance,
    "vortex": write_vortex,
    "mds": write_mds,
    "litdata": write_litdata,
}
HAS_TOKENS = {"parquet", "lance", "vortex", "mds", "litdata"}
WRITER_CUTS_SHARDS = {"mds", "litdata"}  # by bytes or a fixed count: not SIZES


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("formats")
    return {fmt: write(root / fmt) for fmt, write in WRITERS.items()}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    make_tokenizer().save(str(path))
    return str(path)


def dataset(corpora: dict[str, Path], fmt: str) -> Dataset:
    ds = Dataset.from_path(fmt, corpora[fmt])
    assert ds.format_name == fmt and ds.total() == sum(SIZES) and len(ds.shards) > 2
    assert fmt in WRITER_CUTS_SHARDS or ds.counts().tolist() == list(SIZES)
    return ds


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_a_shuffled_pass_reads_every_row_once_with_its_values(corpora, fmt):
    ws = StaticMixtureWorkSource([dataset(corpora, fmt)], {fmt: 1.0}, chunk_size=7, seed=3, shuffle_within_shard=True)
    rows = [r for b in Pipeline(ws).batch(5, drop_last=False).options(runner="inline", canonical_replicas=2)
            for r in b.table.select(["id", "text"]).to_pylist()]
    assert sorted(r["id"] for r in rows) == list(range(sum(SIZES)))
    assert all(r["text"] == TEXTS[r["id"]] for r in rows)
    assert [r["id"] for r in rows] != sorted(r["id"] for r in rows)  # shuffled: the order is the recipe's


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_a_pickled_dataset_reads_the_same_rows(corpora, fmt):
    """Process workers receive datasets by pickle."""
    ds = dataset(corpora, fmt)
    back = pickle.loads(pickle.dumps(ds))
    assert (back.name, back.path, back.shards, back.schema, back.format) == (ds.name, ds.path, ds.shards, ds.schema,
                                                                             ds.format)
    for shard in ds.shards:
        rows = np.arange(shard.num_rows)[::-2]
        assert back.open_reader().take(shard.shard_id, rows).equals(ds.open_reader().take(shard.shard_id, rows))


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_random_access_through_the_map_style_torch_dataset_reads_the_streams_rows(corpora, fmt):
    def source() -> StaticMixtureWorkSource:
        return StaticMixtureWorkSource([dataset(corpora, fmt)], {fmt: 1.0}, chunk_size=7, seed=3,
                                       shuffle_within_shard=True)

    stream = [r["id"] for b in Pipeline(source()).batch(5, drop_last=False).options(runner="inline")
              for r in b.table.select(["id"]).to_pylist()]
    mapped = Pipeline(source()).to_indexable_torch_dataset()
    picks = random.Random(fmt).sample(range(len(stream)), 12)
    assert [int(mapped[i]["id"]) for i in picks] == [stream[i] for i in picks]


def mixture(corpora: dict[str, Path], fmt: str, tokenizer: str, runner: str, *, groups: int = 1, group: int = 0
            ) -> Pipeline:
    """The format's rows with Parquet's, tokenized (or pre-tokenized ``tokens``) and packed."""
    other = Dataset.from_path("p", corpora["parquet"])
    ws = StaticMixtureWorkSource([dataset(corpora, fmt), other], {fmt: 0.6, "p": 0.4}, chunk_size=6, seed=5,
                                 shuffle_within_shard=True)
    pipe = Pipeline(ws)
    if fmt in HAS_TOKENS:
        pipe = pipe.pack_flat(29, algorithm="wrap", tokens_field="tokens")
    else:
        pipe = pipe.tokenize(tokenizer_id=tokenizer, field="text", special_tokens="eos").pack_flat(29, algorithm="wrap")
    return pipe.batch(2).options(runner=runner, canonical_replicas=LANES, world_size=groups, global_rank=group)


@pytest.mark.parametrize("runner", ["inline", "threads", "process"])
@pytest.mark.parametrize("fmt", sorted(set(WRITERS) - {"parquet"}))
def test_resume_at_random_steps_on_every_runner_gives_the_uninterrupted_stream(corpora, tokenizer, fmt, runner):
    whole = collect(mixture(corpora, fmt, tokenizer, "inline"))
    assert len(whole) > 12
    rng = random.Random(f"{fmt}-{runner}")
    for step in sorted(rng.sample(range(len(whole)), 2)):
        pipe = mixture(corpora, fmt, tokenizer, runner)
        it = iter(pipe)
        head = [signature(next(it)) for _ in range(step)]
        ckpt = json.loads(json.dumps(pipe.checkpoint()))
        it.close()
        resumed = mixture(corpora, fmt, tokenizer, runner)
        resumed.restore(ckpt)
        assert head + collect(resumed) == whole, f"{fmt} on {runner}, checkpoint at step {step}"


def run_groups(corpora, fmt, tokenizer, groups: int, state: dict | None, steps: int | None) -> tuple[Counter, dict]:
    """``steps`` batches from each of ``groups`` groups (None: to the end) restored from
    ``state``, and their merged checkpoint."""
    got, states = Counter(), []
    for g in range(groups):
        pipe = mixture(corpora, fmt, tokenizer, "inline", groups=groups, group=g)
        if state is not None:
            pipe.restore(state)
        it = iter(pipe)
        got.update(signature(b) for b in (it if steps is None else (next(it) for _ in range(steps))))
        states.append(json.loads(json.dumps(pipe.checkpoint())))
        it.close()
    return got, Pipeline.merge_checkpoints(states)


@pytest.mark.parametrize("fmt", sorted(set(WRITERS) - {"parquet"}))
def test_a_checkpoint_on_two_groups_resumes_on_one_then_on_four(corpora, tokenizer, fmt):
    everything = Counter(collect(mixture(corpora, fmt, tokenizer, "inline")))
    on_two, state = run_groups(corpora, fmt, tokenizer, 2, None, 3)
    on_one, state = run_groups(corpora, fmt, tokenizer, 1, state, 4)
    on_four, _ = run_groups(corpora, fmt, tokenizer, 4, state, None)
    assert on_two + on_one + on_four == everything, f"{fmt}: 2 -> 1 -> 4 groups"
    assert sum(on_four.values()) > 0

