"""Faults on every runner: a worker that dies, a user function that never returns, a killed
parent, an iterator shared by two threads. Each ends in an error naming what happened (or a
clean end), never a hang, and leaves no process behind."""

from __future__ import annotations

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
from zephon_columnar.errors import PipelineError
from zephon_columnar.ops import BaseOp, OpTraits

ROOT = Path(__file__).resolve().parents[2]
DS = Dataset.from_tables("a", [pa.table({"x": list(range(200_000))})])
STUCK_AT = 15_000  # a row the workers reach while the caller is still far behind
HANG_GUARD_S = 30  # generous: a liveness check (it returns at all), not a speed figure


class DiesInWorkers(BaseOp):
    """Exits its process in ``setup`` (or on its first frame) inside a process runner's worker."""

    name = "dies"

    def __init__(self, when: str) -> None:
        super().__init__()
        self.when = when

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True)

    def setup(self, ctx) -> None:
        if self.when == "setup" and os.environ.get("ZEPHON_COLUMNAR_PROCESS_WORKER") == "1":
            os._exit(3)

    def process_many(self, records):
        if self.when == "frame" and os.environ.get("ZEPHON_COLUMNAR_PROCESS_WORKER") == "1":
            os._exit(4)
        return records


def source(rows: int = 200_000) -> StaticMixtureWorkSource:
    ds = DS if rows == 200_000 else Dataset.from_tables("a", [pa.table({"x": list(range(rows))})])
    return StaticMixtureWorkSource([ds], {"a": 1.0}, seed=1, chunk_size=64)


def hangs_on_one_row(row: dict) -> dict:
    if row["x"] == STUCK_AT:
        time.sleep(10**6)
    return row


def stuck(runner: str, *, mtp: bool = False, **options) -> Pipeline:
    return (Pipeline(source(20_000)).map_transform(hangs_on_one_row).batch(4)
            .options(runner=runner, mtp_mode=mtp, **options))


def run_in_thread(fn) -> threading.Thread:
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("when", ["setup", "frame"])
def test_a_worker_that_dies_is_a_pipeline_error_naming_the_stage_and_sample(when):
    pipe = (Pipeline(source()).add_op(DiesInWorkers(when)).options(runner="process", max_workers=2))
    with pytest.raises(PipelineError, match=r"a worker process died .* operator\(s\) fetch -> dies \(stage 0\) on "
                                            r"\d+ rows of lane 0, chunk \d+ from offset \d+ \(first sample: dataset "
                                            r"id 0, shard 0, row \d+\)"):
        sum(1 for _ in pipe)
    in_process = iter(pipe.options(runner="threads"))
    assert [next(in_process).payload["x"] for _ in range(3)] == [0, 1, 2]  # the same pipeline runs in-process
    in_process.close()


@pytest.mark.parametrize("runner, mtp", [("threads", False), ("threads", True), ("process", False), ("process", True)])
def test_close_from_another_thread_releases_a_next_blocked_on_a_stuck_function(runner, mtp):
    it = iter(stuck(runner, mtp=mtp))
    got: list = []

    def consume() -> None:
        got.extend(it)  # ends (StopIteration) once closed

    consumer = run_in_thread(consume)
    deadline = time.monotonic() + HANG_GUARD_S
    while not got and time.monotonic() < deadline:  # started (a side process may take a while on a busy machine)
        time.sleep(0.05)
    time.sleep(1.5)  # the caller now waits on the stuck row
    closer = run_in_thread(it.close)
    closer.join(HANG_GUARD_S)
    consumer.join(HANG_GUARD_S)
    assert not closer.is_alive() and not consumer.is_alive()
    assert 0 < len(got) <= STUCK_AT // 4


def hangs_on_row_5(row: dict) -> dict:
    if row["x"] == 5:
        time.sleep(10**6)
    return row


def test_close_from_another_thread_releases_a_next_blocked_while_the_process_runner_starts():
    """Until its first worker is up the process runner computes frames on the driver: a user
    function stuck there kept the caller's next() blocked after close() (issue 25)."""
    it = iter(Pipeline(source(2_000)).map_transform(hangs_on_row_5).batch(4).options(runner="process"))
    got: list = []
    consumer = run_in_thread(lambda: got.extend(it))
    time.sleep(1.0)
    assert consumer.is_alive() and len(got) <= 1  # blocked on row 5 (in the first frames)
    closer = run_in_thread(it.close)
    closer.join(HANG_GUARD_S)
    consumer.join(HANG_GUARD_S)
    assert not closer.is_alive() and not consumer.is_alive()


@pytest.mark.parametrize("runner", ["threads", "process"])
def test_close_from_the_consumer_returns_while_a_worker_is_stuck(runner):
    it = iter(Pipeline(source()).map_transform(hangs_on_one_row).batch(4).options(runner=runner))
    if runner == "process":  # else the driver runs the first frames itself, the stuck row among them
        assert it._run._runner._up.wait(HANG_GUARD_S)  # noqa: SLF001
    for _ in range(3000):
        next(it)
    time.sleep(0.5)  # the workers are ahead, one of them inside the stuck row
    closer = run_in_thread(it.close)
    closer.join(HANG_GUARD_S)
    assert not closer.is_alive()


@pytest.mark.parametrize("runner", ["threads", "process"])
def test_op_timeout_names_the_operator_and_the_first_sample(runner):
    pipe = stuck(runner, op_timeout_s=1.5)
    with pytest.raises(PipelineError, match=r"operator\(s\) fetch -> map_transform \(stage 0\) on \d+ rows of lane 0, "
                                            r"chunk \d+ .*first sample: dataset id 0, shard 0, row \d+\) ran for more "
                                            r"than options\(op_timeout_s=1.5\) seconds"):
        sum(1 for _ in pipe)
    with pytest.raises(ValueError, match="op_timeout_s"):
        stuck(runner, op_timeout_s=0)


@pytest.mark.parametrize("runner", ["threads", "process"])
def test_the_interpreter_exits_with_a_worker_stuck_in_a_user_function(runner, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from tests.engine.test_runners import stuck
        try:
            sum(1 for _ in stuck({runner!r}, op_timeout_s=1))
        except RuntimeError as err:
            print("stopped:", type(err).__name__, flush=True)
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=HANG_GUARD_S * 2)
    assert done.returncode == 0 and "stopped: PipelineError" in done.stdout, done.stderr[-2000:]


def test_the_interpreter_exits_with_an_iterator_left_open_while_a_worker_reads_a_shard(tmp_path):
    """A script that ends without closing its iterator (it hung, every time): the iterator is
    collected at exit, while a daemon worker, stopped by the exit, held a shard reader."""
    import numpy as np
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    for d in range(10):
        (tmp_path / f"d{d}").mkdir()
        docs = [rng.integers(0, 1000, int(n), dtype=np.int32) for n in rng.integers(50, 1500, 64)]
        pq.write_table(pa.table({"input_ids": docs}), tmp_path / f"d{d}" / "p.parquet")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource

        datasets = [Dataset.from_path(f"d{{d}}", {str(tmp_path)!r} + f"/d{{d}}") for d in range(10)]
        ws = StaticMixtureWorkSource(datasets, {{ds.name: 1.0 for ds in datasets}}, seed=1, chunk_size=1024,
                                     stop_after_passes=None, exhausted_policy="repeat")
        it = iter(Pipeline(ws).pack_flat(2048, algorithm="wrap").batch(8))
        for _ in range(20):
            next(it)
        print("leaving", flush=True)
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=HANG_GUARD_S * 2)
    assert done.returncode == 0 and "leaving" in done.stdout, done.stderr[-2000:]


def descendants(pid: int) -> set[int]:
    """Every live process under ``pid`` (from /proc)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                parents[int(entry.name)] = int(fields[1])
    out, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - out
        out |= frontier
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("mtp", [False, True])
def test_sigkill_of_the_trainer_leaves_no_worker_or_resource_tracker_behind(mtp, tmp_path):
    script = tmp_path / "train.py"  # no `if __name__ == "__main__"` guard, as many training scripts
    script.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from tests.engine.test_runners import stuck
        it = iter(stuck("process", mtp={mtp}))
        next(it)
        print("running", flush=True)
        time.sleep(600)
    """))
    trainer = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert trainer.stdout.readline().strip() == "running"
        deadline = time.monotonic() + HANG_GUARD_S
        while len(children := descendants(trainer.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)  # a worker and the resource tracker (and the side process in mtp mode)
        assert len(children) >= 2
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(HANG_GUARD_S)
        deadline = time.monotonic() + HANG_GUARD_S
        while (alive := {p for p in children if Path(f"/proc/{p}").exists() and
                         (Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z")}) and \
                time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive
    finally:
        trainer.kill()


@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_one_iterator_shared_by_two_threads_fails_in_both(runner):
    it = iter(Pipeline(source()).map_transform(lambda r: r).batch(4).options(runner=runner))
    outcome: dict[str, object] = {}

    def consume(name: str) -> None:
        try:
            for _ in it:
                pass
            outcome[name] = "ended"
        except PipelineError as err:
            outcome[name] = str(err)

    threads = [run_in_thread(lambda n=n: consume(n)) for n in ("a", "b")]
    for t in threads:
        t.join(HANG_GUARD_S)
    assert set(outcome) == {"a", "b"}
    assert all("used by two threads at once" in str(v) for v in outcome.values()), outcome
