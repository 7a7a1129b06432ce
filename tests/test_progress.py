"""The progress readout (``Pipeline.show_progress``): counts, real and padded tokens, where the
stream is in its pass with an ETA, lane positions, a final line at the end of the pass; plain
lines off a terminal, a bar on one; one readout in the trainer process under loader workers; and
nothing when it is not turned on."""

from __future__ import annotations

import io
import re
import time

import pyarrow as pa
import pytest

from tests.engine.test_mtp import build
from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource


def token_totals(batches: list) -> tuple[int, int]:
    """(real, padded) tokens of the batches: lengths less pad tails, and rows at each batch's
    longest row."""
    real = padded = 0
    for b in batches:
        lengths = [len(r.payload["input_ids"]) for r in b.records]
        real += sum(lengths) - sum(r.meta.padding_length or 0 for r in b.records)
        padded += len(lengths) * max(lengths)
    return real, padded


def test_progress_lines_count_items_rows_and_tokens_and_end_with_the_totals():
    out = io.StringIO()
    pipe = build("stateful", mtp=False).show_progress(every_s=0.0, file=out, use_tqdm=False)
    batches = list(pipe)
    lines = out.getvalue().splitlines()
    assert len(lines) == len(batches) + 1  # one per item (every_s=0), then the final one
    real, padded = token_totals(batches)
    assert real < padded  # best_fit_wrap pads some rows
    last = lines[-1]
    assert last.startswith(f"zephon_columnar: {len(batches):,} items, {sum(len(b) for b in batches):,} rows")
    assert f"| {real:,} tokens ({padded:,} padded: {1 - real / padded:.1%} padding) |" in last
    assert re.search(r"\| [\d,]+ tok/s \([\d,]+ padded\) \|", last)
    # 120 rows in chunks of 8 on 2 lanes; the stream runs one pass (stop_after_passes=1)
    assert "| pass 1/1: 100% of 120 rows |" in last
    assert any(re.search(r"pass 1/1: \d+% of 120 rows, ETA \d+:\d\d:\d\d \|", line) for line in lines[:-2])
    lanes = dict(re.findall(r"(\d+):(\d+)@chunk\d+", last))
    assert sorted(lanes) == ["0", "1"] and sum(map(int, lanes.values())) == len(batches)


@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_counts_against_its_share_of_the_pass(rank):
    out = io.StringIO()
    pipe = build("stateless", mtp=False).options(dp_degree=2, dp_group_id=rank).show_progress(
        every_s=3600, file=out, use_tqdm=False
    )
    list(pipe)
    assert "| pass 1/1: 100% of 64 rows |" in out.getvalue().splitlines()[-1]  # 15 chunks of 8: at most 8 a lane


def test_an_endless_stream_counts_passes_and_gives_the_eta_of_this_one():
    ds = Dataset.from_tables("a", [pa.table({"input_ids": [[i, i] for i in range(40)]})])
    source = StaticMixtureWorkSource([ds], {"a": 1.0}, chunk_size=8, seed=0, exhausted_policy="repeat",
                                     stop_after_passes=None)
    out = io.StringIO()
    pipe = Pipeline(source).batch(4).show_progress(every_s=0.0, file=out, use_tqdm=False)
    for step, _ in enumerate(pipe):
        if step == 14:  # 60 rows: half way through the second pass
            break
    line = out.getvalue().splitlines()[-1]
    assert re.search(r"\| pass 2: 50% of 40 rows, ETA \d+:\d\d:\d\d \(this pass\)", line), line


def test_plain_lines_off_a_terminal_and_a_bar_on_one():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    plain, terminal = io.StringIO(), Terminal()
    list(build("stateless", mtp=False).show_progress(every_s=3600, file=plain))  # tqdm installed, not a tty
    list(build("stateless", mtp=False).show_progress(every_s=3600, file=terminal))
    assert "\r" not in plain.getvalue() and plain.getvalue().startswith("zephon_columnar: ")
    assert "\r" in terminal.getvalue() and "item" in terminal.getvalue()  # tqdm redraws its bar


def test_loader_workers_feed_one_readout_in_the_trainer_process(capfd):
    out = io.StringIO()
    pipe = build("stateful", mtp=False).show_progress(every_s=0.05, file=out, use_tqdm=False)
    expected = list(build("stateful", mtp=False))
    loader = pipe.to_torch_loader(num_workers=2, timeout=120)
    batches = list(loader)
    assert len(batches) == len(expected)
    real, padded = token_totals(expected)
    deadline = time.monotonic() + 10
    while f"{len(expected):,} items" not in out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.05)  # the trainer's thread reports what the workers counted
    last = out.getvalue().splitlines()[-1]
    assert last.startswith(f"zephon_columnar: {len(expected):,} items, {sum(len(b) for b in expected):,} rows")
    assert f"| {real:,} tokens ({padded:,} padded" in last and "| pass 1/1: 100% of 120 rows" in last
    assert "zephon_columnar:" not in capfd.readouterr().err  # no worker drew a readout of its own


def test_progress_is_off_unless_asked_for_and_every_s_none_turns_it_off(capsys):
    pipe = build("stateless", mtp=False)
    list(pipe)
    pipe.show_progress(every_s=0.0, use_tqdm=False).show_progress(every_s=None)
    list(pipe)
    assert "zephon_columnar:" not in capsys.readouterr().err


def test_records_are_counted_as_rows_with_their_tokens():
    ds = Dataset.from_tables("a", [pa.table({"input_ids": [[i] * (1 + i % 3) for i in range(40)]})])
    out = io.StringIO()
    pipe = Pipeline(StaticMixtureWorkSource([ds], {"a": 1.0}, chunk_size=8)).show_progress(0.0, file=out)
    assert len(list(pipe)) == 40
    last = out.getvalue().splitlines()[-1]
    tokens = sum(1 + i % 3 for i in range(40))
    assert last.startswith(f"zephon_columnar: 40 items, 40 rows | {tokens} tokens ({tokens} padded: 0.0% padding)")
    assert "| pass 1/1: 100% of 40 rows" in last


def mixture_pipeline(drop_b: bool = False) -> Pipeline:
    a = Dataset.from_tables("a", [pa.table({"input_ids": [[i, i] for i in range(60)], "keep": [True] * 60})])
    b = Dataset.from_tables("b", [pa.table({"input_ids": [[i] for i in range(20)], "keep": [not drop_b] * 20})])
    source = StaticMixtureWorkSource([a, b], {"a": 3.0, "b": 1.0}, chunk_size=8, seed=0)
    return Pipeline(source).filter(lambda row: row["keep"]).batch(4, drop_last=False)


def delivered_shares(batches: list) -> dict[int, float]:
    counts: dict[int, int] = {}
    for batch in batches:
        for record in batch.records:
            for cid, n in record.meta.component_sample_counts.items():
                counts[cid] = counts.get(cid, 0) + n
    total = sum(counts.values())
    return {cid: n / total for cid, n in counts.items()}


@pytest.mark.parametrize("drop_b", [False, True])
def test_the_readout_shows_the_delivered_mixture_next_to_its_target(drop_b):
    out = io.StringIO()
    batches = list(mixture_pipeline(drop_b).show_progress(every_s=3600, file=out, use_tqdm=False))
    shares = delivered_shares(batches)
    last = out.getvalue().splitlines()[-1]
    expected = f"| mixture a {shares.get(0, 0):.1%} (target 75%), b {shares.get(1, 0):.1%} (target 25%)"
    assert expected in last, last
    assert ("b 0.0%" in last) == drop_b  # a starved component shows as such while the run goes on


def test_loader_workers_add_up_the_mixture_in_the_trainer_process():
    out = io.StringIO()
    expected = delivered_shares(list(mixture_pipeline()))
    pipe = mixture_pipeline().options(canonical_replicas=2).show_progress(every_s=0.05, file=out, use_tqdm=False)
    batches = list(pipe.to_torch_loader(num_workers=2, raw_batches=True, timeout=120))
    assert delivered_shares(batches) == pytest.approx(expected, abs=0.03)
    shares = delivered_shares(batches)
    want = f"| mixture a {shares[0]:.1%} (target 75%), b {shares[1]:.1%} (target 25%)"
    deadline = time.monotonic() + 10
    while want not in out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.05)  # the trainer's thread reports what the workers counted
    assert want in out.getvalue().splitlines()[-1], out.getvalue().splitlines()[-1]


def test_a_mixture_of_many_components_shows_those_furthest_behind_first():
    from zephon_columnar.progress import SHOWN_COMPONENTS, Counts, Progress, StreamShape

    names = tuple(f"d{i}" for i in range(20))
    readout = Progress(every_s=3600, file=io.StringIO(), use_tqdm=False,
                       stream=StreamShape(components=names, targets=(0.05,) * 20))
    readout.show(Counts(items=1, documents=(10,) * 13 + (0,) + (10,) * 6))
    mixture = next(part for part in readout.line().split(" | ") if part.startswith("mixture "))
    assert mixture.startswith("mixture d13 0.0% (target 5%), ")  # the starved one first
    assert mixture.count("(target") == SHOWN_COMPONENTS and mixture.endswith(f"and {20 - SHOWN_COMPONENTS} more")
