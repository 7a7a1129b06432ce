"""A node's processes share one shard cache folder (s3:// on a local S3 server, real processes).

What eight ranks started together on one node rely on: every remote shard is downloaded once
and every footer read once for all of them, every rank reads the same rows, the cache keeps to
its byte limit while they download at the same time, and a rank killed half way through a
download leaves nothing that another rank trusts (the next one downloads the shard itself).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.extras import require

require("s3fs", "s3")
require("moto", "s3")

import fsspec  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import s3fs  # noqa: E402

from tests.s3_server import TEST_CREDENTIALS, FaultyS3Server, upload_dir  # noqa: E402

RANKS, SHARDS, ROWS = 8, 4, 3000  # ~120 KB per shard
# Fresh processes, as spawn makes them, forked from a server that has imported the libraries
# once (eight imports of pyarrow and s3fs would take most of a test's time on two cores).
SPAWN = multiprocessing.get_context("forkserver")
SPAWN.set_forkserver_preload(["numpy", "pyarrow.parquet", "s3fs", "zephon_columnar", "tests.io.test_shared_shard_cache"])


@pytest.fixture(scope="module")
def server():
    srv = FaultyS3Server().start()
    yield srv
    srv.stop()


@pytest.fixture
def dataset(server, tmp_path):
    """``(url, sizes)``: 4 Parquet shards in a fresh bucket, the server's counters zeroed."""
    server.configure(latency_s=0.0, bytes_per_s=0)
    os.environ.update(TEST_CREDENTIALS)
    client = s3fs.S3FileSystem(skip_instance_cache=True, endpoint_url=server.endpoint)
    bucket = f"zc-{uuid.uuid4().hex[:12]}"
    client.mkdir(bucket)
    local = tmp_path / "web"
    local.mkdir()
    for s in range(SHARDS):
        ids = list(range(s * ROWS, (s + 1) * ROWS))
        table = pa.table({"id": ids, "text": [f"document {i} " * 4 for i in ids]})
        pq.write_table(table, local / f"part-{s}.parquet", row_group_size=500, compression="none")
    keys = upload_dir(client, str(local), f"s3://{bucket}/web")
    server.reset_stats()
    return f"s3://{bucket}/web", {k: client.size(k) for k in keys}


# ---------------------------------------------------------------- one rank, in its own process
def read_everything(endpoint: str, url: str, cache: str, limit: int | None, rank: int, barrier, results,
                    env: dict[str, str] | None = None) -> None:
    """Discover ``url`` and read every row, shards in an order that starts at ``rank``; put
    ``(rank, ids in shard order, downloads, folders listed)`` on ``results``. ``env``: more environment, with
    ``{rank}`` in a value replaced by the rank."""
    os.environ.update(TEST_CREDENTIALS)
    os.environ.update({k: v.format(rank=rank) for k, v in (env or {}).items()})
    os.environ["FSSPEC_S3_ENDPOINT_URL"] = endpoint
    os.environ["ZEPHON_COLUMNAR_CACHE"] = cache
    from zephon_columnar import Dataset
    from zephon_columnar.io import fs

    shard_cache = fs.configure_shard_cache(limit_bytes=limit)
    listed, list_data_files = [], fs.list_data_files
    fs.list_data_files = lambda path: listed.append(path) or list_data_files(path)
    if barrier is not None:
        barrier.wait(timeout=60)
    ds = Dataset.from_path("web", url)
    reader = ds.open_reader(columns=["id"])
    ids: dict[int, list[int]] = {}
    for k in range(len(ds.shards)):
        shard = ds.shards[(rank + k) % len(ds.shards)]
        ids[shard.shard_id] = reader.take(shard.shard_id, np.arange(shard.num_rows)).column("id").to_pylist()
    results.put((rank, [i for s in sorted(ids) for i in ids[s]], shard_cache.downloads, len(listed)))


def start_ranks(url: str, cache: Path, n: int, limit: int | None = None,
                env: dict[str, str] | None = None) -> tuple[list, object, object]:
    """``n`` ranks started (behind a barrier when several): ``(processes, their results, the
    barrier)``; the caller keeps the barrier alive until they have passed it."""
    barrier = SPAWN.Barrier(n) if n > 1 else None
    results = SPAWN.Queue()
    endpoint = os.environ["FSSPEC_S3_ENDPOINT_URL"]
    procs = [
        SPAWN.Process(target=read_everything, args=(endpoint, url, str(cache), limit, r, barrier, results, env))
        for r in range(n)
    ]
    for p in procs:
        p.start()
    return procs, results, barrier


def finish(procs: list, results, barrier, timeout: float = 60) -> list[tuple[int, list[int], int, int]]:
    got = [results.get(timeout=timeout) for _ in procs]
    for p in procs:
        p.join(timeout=10)
        assert p.exitcode == 0, p.exitcode
    return sorted(got)


@pytest.fixture
def endpoint_env(server, monkeypatch):
    monkeypatch.setenv("FSSPEC_S3_ENDPOINT_URL", server.endpoint)


def whole_gets(server) -> dict[str, int]:
    """Per object key: GETs of the whole object (downloads), not of a range."""
    stats = server.stats()
    gets = {k.split(" ", 1)[1]: n for k, n in stats["requests"].items() if k.startswith("GET ") and "/" in k}
    return {k: n - stats["ranged"].get(k, 0) for k, n in gets.items() if n - stats["ranged"].get(k, 0)}


def files_in(folder: Path) -> list[Path]:
    """The files directly in ``folder`` (the copies and any temp files)."""
    return [p for p in folder.iterdir() if p.is_file()] if folder.exists() else []


# ---------------------------------------------------------------- the invariants
def test_eight_ranks_download_each_shard_once_and_read_each_footer_once(dataset, server, endpoint_env, tmp_path):
    url, sizes = dataset
    server.configure(latency_s=0.05)  # requests overlap: ranks that want one shard ask for it together
    got = finish(*start_ranks(url, tmp_path / "cache", RANKS))
    expected = list(range(SHARDS * ROWS))
    assert all(ids == expected for _, ids, *_ in got)  # every rank reads the same rows
    assert whole_gets(server) == {k: 1 for k in sizes}, server.stats()  # one download per shard, node-wide
    assert sum(downloads for _, _, downloads, _ in got) == SHARDS
    ranged = server.stats()["ranged"]
    assert all(ranged.get(k, 0) <= 2 for k in sizes), ranged  # one rank reads a footer (1-2 ranges), the rest share it
    shards = tmp_path / "cache" / "shards"
    assert sorted(p.stat().st_size for p in files_in(shards)) == sorted(sizes.values())  # no temp file left


def test_the_byte_limit_holds_while_eight_ranks_download(dataset, server, endpoint_env, tmp_path):
    url, sizes = dataset
    limit = int(2.5 * max(sizes.values()))  # room for two shards, not for all four
    shards = tmp_path / "cache" / "shards"
    peak, stop = [0], threading.Event()

    def watch() -> None:  # bytes in the folder (copies and downloads in flight), sampled
        while not stop.is_set():
            before = sorted(p.name for p in files_in(shards))
            total = 0
            for name in before:
                try:
                    total += (shards / name).stat().st_size
                except FileNotFoundError:
                    pass
            if sorted(p.name for p in files_in(shards)) == before:  # a consistent sample
                peak[0] = max(peak[0], total)
            time.sleep(0.001)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        got = finish(*start_ranks(url, tmp_path / "cache", RANKS, limit=limit), timeout=90)
    finally:
        stop.set()
        watcher.join()
    assert all(ids == list(range(SHARDS * ROWS)) for _, ids, *_ in got)
    assert 0 < peak[0] <= limit, (peak[0], limit)


def test_a_rank_killed_mid_download_leaves_nothing_trusted(dataset, server, endpoint_env, tmp_path):
    url, sizes = dataset
    shards = tmp_path / "cache" / "shards"
    server.configure(bytes_per_s=100_000)  # a shard takes over a second
    procs, results, barrier = start_ranks(url, tmp_path / "cache", 1)
    deadline = time.monotonic() + 30
    while not any(".tmp-" in p.name and p.stat().st_size > 0 for p in files_in(shards)):
        assert time.monotonic() < deadline, "the first download never started"
        time.sleep(0.005)
    os.kill(procs[0].pid, signal.SIGKILL)
    del results, barrier
    procs[0].join(timeout=10)
    left = files_in(shards)
    assert left and all(".tmp-" in p.name for p in left)  # half a download, under a temp name only
    server.configure(bytes_per_s=0)
    got = finish(*start_ranks(url, tmp_path / "cache", 1))
    assert got[0][1] == list(range(SHARDS * ROWS))  # the next rank downloads the shard itself, whole
    # What is left is the finished copies, each whole; the killed rank's temp file was cleaned up.
    assert sorted(p.stat().st_size for p in files_in(shards)) == sorted(sizes.values())


def test_a_remembered_footer_is_used_only_for_the_same_version_of_the_file(dataset, server, tmp_path, monkeypatch):
    url, sizes = dataset
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": server.endpoint})
    monkeypatch.setenv("ZEPHON_COLUMNAR_CACHE", str(tmp_path / "cache"))
    from zephon_columnar import Dataset

    assert Dataset.from_path("web", url).counts().tolist() == [ROWS] * SHARDS
    server.reset_stats()
    s3fs.S3FileSystem.clear_instance_cache()  # as a fresh process: nothing known but the cache folder
    assert Dataset.from_path("web", url).counts().tolist() == [ROWS] * SHARDS
    assert server.stats()["ranged"] == {}  # every footer from the cache
    client = s3fs.S3FileSystem(skip_instance_cache=True, endpoint_url=server.endpoint)
    first = sorted(sizes)[0]
    ids = list(range(1, ROWS + 1))  # other values, the same layout: a file of the same size
    table = pa.table({"id": ids, "text": [f"document {i} " * 4 for i in range(ROWS)]})
    pq.write_table(table, tmp_path / "new.parquet", row_group_size=500, compression="none")
    client.put_file(str(tmp_path / "new.parquet"), f"s3://{first}")  # rewritten: a new ETag
    assert client.size(first) == sizes[first]
    server.reset_stats()
    s3fs.S3FileSystem.clear_instance_cache()
    assert Dataset.from_path("web", url).counts().tolist() == [ROWS] * SHARDS
    assert set(server.stats()["ranged"]) == {first}  # its new footer was read; the others were remembered


@pytest.mark.parametrize("shared", [pytest.param(False, marks=pytest.mark.slow), True])  # node-local: test_manifest.py
def test_in_a_job_one_rank_lists_the_folder_and_the_others_read_its_manifest(dataset, server, endpoint_env, tmp_path,
                                                                            shared):
    """Eight ranks of one job: without a job id each lists the folder; with one, the writer (RANK
    0 with a manifest folder in the bucket every node sees, LOCAL_RANK 0 with the node's cache)
    lists it and the others read its manifest (each still checks that the folder exists: one
    request, not a listing of every object), every rank the same rows."""
    url, _ = dataset
    bucket = url.split("/")[2]
    alone = finish(*start_ranks(url, tmp_path / "alone", RANKS))
    env = {"ZEPHON_COLUMNAR_JOB_ID": "job-7", "RANK": "{rank}", "LOCAL_RANK": "{rank}"}
    if shared:
        env["ZEPHON_COLUMNAR_MANIFESTS"] = f"s3://{bucket}/manifests"
    in_job = finish(*start_ranks(url, tmp_path / "job", RANKS, env=env))
    assert [ids for _, ids, *_ in in_job] == [ids for _, ids, *_ in alone] == [list(range(SHARDS * ROWS))] * RANKS
    assert [listed for *_, listed in alone] == [1] * RANKS
    assert [listed for *_, listed in in_job] == [1] + [0] * (RANKS - 1)
