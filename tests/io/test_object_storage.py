"""s3:// against a real S3-compatible server on loopback (moto), with injected faults.

What a user reading from object storage relies on: footers are read by range, every shard is
downloaded once into the shard cache (also with ``prefetch()``), the cache keeps to
``CacheOptions.limit_bytes``, transient failures (500, 503, dropped connections, responses cut
short) are retried and lose nothing, and a failure that does not go away names the URL.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from tests.extras import require  # noqa: E402

require("s3fs", "s3")
require("moto", "s3")

import fsspec  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import s3fs  # noqa: E402

from tests.conftest import doc_text, write_jsonl_dataset  # noqa: E402
from tests.s3_server import TEST_CREDENTIALS, FaultyS3Server, upload_dir  # noqa: E402
from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource  # noqa: E402
from zephon_columnar.io import fs  # noqa: E402
from zephon_columnar.io.retry import RetriesExhaustedError, RetryPolicy  # noqa: E402

SHARDS, ROWS = 4, 3000  # ~100-200 KB per Parquet shard: footers are a small part of each file


@pytest.fixture(scope="module")
def server():
    old_env = {k: os.environ.get(k) for k in [*TEST_CREDENTIALS, "FSSPEC_S3_ENDPOINT_URL"]}
    srv = FaultyS3Server().start()
    os.environ.update(TEST_CREDENTIALS)
    os.environ["FSSPEC_S3_ENDPOINT_URL"] = srv.endpoint  # read by fsspec in spawned workers
    old_conf = fsspec.config.conf.get("s3")
    fsspec.config.conf["s3"] = {"endpoint_url": srv.endpoint}
    yield srv
    srv.stop()
    if old_conf is None:
        fsspec.config.conf.pop("s3", None)
    else:
        fsspec.config.conf["s3"] = old_conf
    for k, v in old_env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def s3(server):
    """A fresh bucket; faults off and counters zero at the start of each test."""
    server.configure(latency_s=0.0, fault_share=0.0, failing_keys=(), seed=0)
    server.reset_stats()
    client = s3fs.S3FileSystem(skip_instance_cache=True)
    bucket = f"zc-{uuid.uuid4().hex[:12]}"
    client.mkdir(bucket)
    return client, bucket


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A private shard cache root (the default cache follows the variable)."""
    monkeypatch.setenv("ZEPHON_COLUMNAR_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "shards"


@pytest.fixture
def no_backend_retries(server, monkeypatch):
    """s3fs and botocore give up at once: only this library's retries remain (their own would
    multiply every try of ours)."""
    monkeypatch.setitem(fsspec.config.conf, "s3", {
        "endpoint_url": server.endpoint, "config_kwargs": {"retries": {"total_max_attempts": 1, "mode": "standard"}}})
    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)


@pytest.fixture
def patient_retries():
    """Many quick tries: at a 30% fault share all five default tries of a request fail once in
    400 requests; all twelve, once in two million."""
    cache = fs.default_shard_cache()
    saved = cache.metadata_policy, cache.download_policy
    cache.metadata_policy = cache.download_policy = RetryPolicy(attempts=12, first_delay_s=0.005, max_delay_s=0.05)
    yield
    cache.metadata_policy, cache.download_policy = saved


def write_parquet(root: Path, shards: int = SHARDS, rows: int = ROWS) -> Path:
    root.mkdir(parents=True)
    for s in range(shards):
        ids = list(range(s * rows, (s + 1) * rows))
        pq.write_table(pa.table({"id": ids, "text": [doc_text(i) * 2 for i in ids]}), root / f"part-{s}.parquet",
                       row_group_size=500, compression="none")
    return root


def upload(tmp_path: Path, s3, kind: str = "parquet", shards: int = SHARDS) -> tuple[Path, str, dict[str, int]]:
    """A local dataset, its copy on the server, and the size of every uploaded key."""
    client, bucket = s3
    local = write_parquet(tmp_path / kind, shards, ROWS * SHARDS // shards) if kind == "parquet" else \
        write_jsonl_dataset(tmp_path / kind, shards=SHARDS, rows_per_shard=ROWS)
    url = f"s3://{bucket}/{kind}"
    keys = upload_dir(client, str(local), url)
    return local, url, {k: client.size(k) for k in keys}


def cached_bytes(root: Path) -> int:
    """Bytes of the finished copies in a cache root now (a copy may be evicted meanwhile)."""
    total = 0
    for p in root.iterdir():
        try:
            total += p.stat().st_size if ".tmp-" not in p.name else 0
        except FileNotFoundError:
            pass
    return total


def ids(data: str | Dataset, *, prefetch: bool = False, **options) -> list[int]:
    """The ids a pipeline over ``data`` (a path, or a Dataset already discovered) delivers."""
    ds = data if isinstance(data, Dataset) else Dataset.from_path("web", data)
    ws = StaticMixtureWorkSource([ds], {"web": 1.0}, chunk_size=256, seed=3)
    pipe = Pipeline(ws)
    if prefetch:
        pipe = pipe.prefetch(buffer_size=4 * ROWS, parallelism=2)
    pipe = pipe.batch(64).options(**options)
    return [i for batch in pipe for i in batch.to_pydict()["id"]]


def test_footers_are_read_by_range_without_downloading_shards(tmp_path, s3, server, cache_dir):
    _, url, sizes = upload(tmp_path, s3)
    server.reset_stats()
    before = fs.default_shard_cache().downloads
    ds = Dataset.from_path("web", url)
    assert ds.counts().tolist() == [ROWS] * SHARDS
    served = server.stats()["bytes"]
    for key, size in sizes.items():
        assert served.get(key, 0) < size / 2, (key, served.get(key), size)  # the footer's range, not the file
    assert fs.default_shard_cache().downloads == before
    assert not cache_dir.exists() or not [p for p in cache_dir.iterdir() if p.is_file()]  # footers only


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_remote_data_equals_local_and_each_shard_is_downloaded_once(tmp_path, s3, server, cache_dir, kind):
    local, url, sizes = upload(tmp_path, s3, kind)
    expected = ids(str(local))
    cache = fs.default_shard_cache()
    downloads, hits = cache.downloads, cache.hits
    server.reset_stats()
    ds = Dataset.from_path("web", url)
    discovery = server.stats()["bytes"]
    server.reset_stats()
    ws = StaticMixtureWorkSource([ds], {"web": 1.0}, chunk_size=256, seed=3)
    pipe = Pipeline(ws).prefetch(buffer_size=4 * ROWS, parallelism=2).batch(64).enable_observability()
    assert [i for batch in pipe for i in batch.to_pydict()["id"]] == expected
    if kind == "parquet":  # discovery reads footer ranges; the pass downloads every shard, once
        assert all(discovery[k] < size / 2 for k, size in sizes.items())
        assert server.stats()["bytes"] == sizes
    else:  # a JSONL row count needs the whole file: discovery downloads it, the pass reads the copy
        assert discovery == sizes and server.stats()["bytes"] == {}
    assert cache.downloads - downloads == SHARDS
    fetch = pipe.fetch_timing_snapshot()
    snapshot = fetch.cache
    assert snapshot["downloads"] == cache.downloads and snapshot["hits"] > hits  # readers open the copies
    # Per shard: each one's rows, and the cache lookups its reads made (a download or a copy reused).
    shard_totals = fetch.stages[0].shard_totals
    assert sorted(t.samples for t in shard_totals.values()) == sorted([ROWS] * SHARDS)
    assert all(t.cache_hits + t.cache_misses >= 1 for t in shard_totals.values())
    assert sorted(p.stat().st_size for p in cache_dir.iterdir() if p.is_file()) == sorted(sizes.values())
    server.reset_stats()
    assert ids(ds, prefetch=True) == expected  # a second pass reads the cached copies only
    assert server.stats()["bytes"] == {}


def test_the_cache_keeps_to_limit_bytes_evicting_the_least_recently_used(tmp_path, s3, cache_dir):
    local, url, sizes = upload(tmp_path, s3)
    limit = int(2.5 * max(sizes.values()))
    evictions = fs.default_shard_cache().evictions
    ws = StaticMixtureWorkSource([Dataset.from_path("web", url)], {"web": 1.0}, chunk_size=256, seed=3)
    pipe = (Pipeline(ws).batch(64).enable_observability()
            .options(io_options={"cache": {"enabled": True, "root": str(cache_dir), "limit_bytes": limit}}))
    got, peak = [], 0
    for batch in pipe:
        got += batch.to_pydict()["id"]
        peak = max(peak, cached_bytes(cache_dir))
    assert got == ids(str(local))
    assert peak <= limit  # never more than the limit on disk (the shard in use included)
    snapshot = pipe.fetch_timing_snapshot().cache
    assert snapshot["downloads"] >= SHARDS and snapshot["evictions"] - evictions >= SHARDS - 2
    # The most recently used shards stay: the last two read.
    assert len([p for p in cache_dir.iterdir() if p.is_file()]) == 2


@pytest.mark.parametrize("backend_retries", [True, False], ids=["backend-retries-on", "backend-retries-off"])
def test_transient_faults_are_retried_and_lose_nothing(tmp_path, s3, server, cache_dir, request, patient_retries,
                                                       backend_retries):
    local, url, _ = upload(tmp_path, s3, shards=12)  # ~50 requests: a dozen faults
    expected = ids(str(local))
    if not backend_retries:
        request.getfixturevalue("no_backend_retries")
    server.configure(fault_share=0.3, seed=11)
    retries = fs.default_shard_cache().retries
    assert ids(url, prefetch=True) == expected
    faults = server.stats()["faults"]
    assert set(faults) == {"500", "503", "reset", "truncate"}, server.stats()  # every kind of fault was met
    if not backend_retries:
        assert fs.default_shard_cache().retries - retries >= sum(faults.values()) // 2


def test_transient_faults_on_the_process_runner_lose_nothing(tmp_path, s3, server, cache_dir):
    local, url, _ = upload(tmp_path, s3)
    expected = ids(str(local))
    server.configure(fault_share=0.3, seed=5)
    assert ids(url, runner="process", max_workers=2) == expected
    assert sum(server.stats()["faults"].values()) > 0


def test_a_download_that_keeps_failing_names_the_url(tmp_path, s3, server, cache_dir, no_backend_retries):
    _, url, sizes = upload(tmp_path, s3)
    ds = Dataset.from_path("web", url)
    bad = sorted(sizes)[1]
    server.configure(failing_keys=[bad])
    ws = StaticMixtureWorkSource([ds], {"web": 1.0}, chunk_size=256, seed=3)
    pipe = Pipeline(ws).batch(64).options(io_options={"cache": {"download_retry": 2, "download_timeout": 30}})
    t0 = time.monotonic()
    with pytest.raises(OSError, match=f"s3://{bad}: download failed 3 time"):
        for _ in pipe:
            pass
    assert time.monotonic() - t0 < 30


def test_a_footer_that_keeps_failing_names_the_url(tmp_path, s3, server, no_backend_retries):
    _, url, sizes = upload(tmp_path, s3)
    bad = sorted(sizes)[2]
    server.configure(failing_keys=[bad])
    with pytest.raises(RetriesExhaustedError, match=f"s3://{bad}: .* failed 5 time"):
        Dataset.from_path("web", url)


def test_a_missing_shard_fails_at_once_naming_it(tmp_path, s3, server, cache_dir):
    client, _ = s3
    _, url, sizes = upload(tmp_path, s3)
    ds = Dataset.from_path("web", url)
    gone = sorted(sizes)[0]
    client.rm(gone)
    server.reset_stats()
    ws = StaticMixtureWorkSource([ds], {"web": 1.0}, chunk_size=256, seed=3)
    with pytest.raises(FileNotFoundError, match=gone):
        for _ in Pipeline(ws).batch(64):
            pass
    requests = server.stats()["requests"]
    assert sum(n for k, n in requests.items() if k.endswith(gone)) <= 3  # not retried


def test_missing_credentials_name_the_url_and_where_credentials_come_from(tmp_path, s3, server, monkeypatch):
    """Found by a new-user probe: s3:// without credentials gave botocore's text alone, with
    neither the dataset's URL nor what to set."""
    _, url, _ = upload(tmp_path, s3)
    for name in TEST_CREDENTIALS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    s3fs.S3FileSystem.clear_instance_cache()
    with pytest.raises(PermissionError, match=rf"{url}.*needs credentials.*AWS_ACCESS_KEY_ID"):
        Dataset.from_path("web", url)
