"""The engine in a side process (``options(mtp_mode=True)``): the same data as in process, exact
checkpoints while the iterator is open, restore before the first ``next()``, errors with their
type, queue statistics, and no process left behind by ``close()`` or by a killed parent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource

ROOT = Path(__file__).resolve().parents[2]


def source() -> StaticMixtureWorkSource:
    shards = [pa.table({"id": list(range(s * 30, s * 30 + 30)),
                        "input_ids": [[i] * (1 + i % 7) for i in range(s * 30, s * 30 + 30)]}) for s in range(4)]
    return StaticMixtureWorkSource([Dataset.from_tables("a", shards)], {"a": 1.0}, chunk_size=8, seed=2)


def hold_and_reverse(held: list, records: list) -> tuple[list, list]:
    """User state (checkpointed by replay): records are held and emitted reversed, five at a time."""
    held = held + list(records)
    return ([], held[::-1]) if len(held) >= 5 else (held, [])


def build(kind: str, *, mtp: bool, runner: str = "threads") -> Pipeline:
    p = Pipeline(source())
    if kind == "stateful":
        p = p.shuffle(buffer_size=16, seed=1).pack_flat(max_length=12, algorithm="best_fit_wrap", pad_token_id=0)
    if kind == "replay":
        p = p.stateful_transform("hold_and_reverse", init_state=list, push=hold_and_reverse, flush=lambda h: h[::-1])
    p = p.map_transform(lambda row: {**row, "input_ids": list(row["input_ids"]) + [0]}) if kind == "stateless" else p
    return p.batch(3).options(runner=runner, mtp_mode=mtp, canonical_replicas=2)


def rows(batch) -> list:
    return [list(map(int, r.payload["input_ids"])) for r in batch.records]


@pytest.mark.parametrize("kind", ["stateless", "stateful", "replay"])
@pytest.mark.parametrize("runner", ["inline", "threads", "process"])
def test_side_process_gives_the_in_process_data(kind, runner):
    expected = [rows(b) for b in build(kind, mtp=False)]
    assert [rows(b) for b in build(kind, mtp=True, runner=runner)] == expected


@pytest.mark.parametrize("kind", ["stateless", "stateful", "replay"])
def test_checkpoints_taken_while_open_resume_exactly_in_or_out_of_mtp_mode(kind):
    """Checkpoints while the side process has items on their way (its ring): by reference they
    go back into the lane; by replay (``kind="replay"``) the cursor before them is the state."""
    expected = [rows(b) for b in build(kind, mtp=False)]
    assert ("by replay" in build(kind, mtp=False).explain()) == (kind == "replay")
    pipe = build(kind, mtp=True)
    it = iter(pipe)
    saved = {}
    for step in range(len(expected)):
        if step in (0, 3, 7):
            saved[step] = json.loads(json.dumps(pipe.checkpoint()))
        assert rows(next(it)) == expected[step]
    it.close()
    for step, ckpt in saved.items():
        for mtp in (True, False):
            resumed = build(kind, mtp=mtp)
            resumed.restore(ckpt)  # before the first next()
            assert [rows(b) for b in resumed] == expected[step:], (step, mtp)


def test_a_checkpoint_after_the_end_and_an_empty_rest():
    pipe = build("stateful", mtp=True)
    n = sum(1 for _ in pipe)
    ckpt = pipe.checkpoint()
    again = build("stateful", mtp=True)
    again.restore(ckpt)
    assert n > 0 and list(again) == []


def test_queue_stats_report_depth_and_bytes_within_capacity():
    pipe = build("stateless", mtp=True).options(mtp_buffer=4, mtp_buffer_bytes=1 << 16)
    assert pipe.mtp_queue_stats() is None
    it = iter(pipe)
    next(it)
    deadline = time.monotonic() + 10
    while pipe.mtp_queue_stats()["depth"] < 4 and time.monotonic() < deadline:
        time.sleep(0.01)  # the side process fills the ring while this one waits
    stats = pipe.mtp_queue_stats()
    assert stats["depth"] == stats["capacity"] == 4
    assert 0 < stats["staged_bytes"] <= stats["capacity_bytes"] == 1 << 16
    it.close()
    assert pipe.mtp_queue_stats() is None


def test_map_batch_runs_on_the_trainer_side_and_errors_keep_their_type():
    lock = threading.Lock()  # cannot be pickled: map_batch must not travel
    seen = []

    def note(batch):
        with lock:
            seen.append(len(batch.records))
        return batch

    pipe = build("stateless", mtp=True).map_batch(note)
    assert len(list(pipe)) == len(seen) > 0

    def broken(row):
        raise KeyError("no such field 'title'")

    bad = Pipeline(source()).map_transform(broken).batch(2).options(mtp_mode=True)
    with pytest.raises(KeyError, match="title"):
        next(iter(bad))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped) is gone for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_close_leaves_no_process_behind():
    pipe = build("stateful", mtp=True)
    it = iter(pipe)
    next(it)
    proc = pipe.session.run._proc  # noqa: SLF001
    it.close()
    assert not proc.is_alive()


def test_a_killed_parent_takes_the_side_process_with_it(tmp_path):
    # a training script without an `if __name__ == "__main__"` guard: the side process must not run it again
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from tests.engine.test_mtp import build
        pipe = build("stateless", mtp=True)
        it = iter(pipe)
        next(it)
        print(pipe.session.run._proc.pid, flush=True)
        time.sleep(600)
    """))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert _alive(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        parent.kill()


def test_inside_a_dataloader_worker_the_engine_runs_in_that_worker():
    from torch.utils.data import DataLoader

    expected = [rows(b) for b in build("stateless", mtp=False)]
    loader = DataLoader(build("stateless", mtp=True).to_torch_dataset(), batch_size=None, num_workers=1)
    assert sorted(map(str, (rows(b) for b in loader))) == sorted(map(str, expected))
