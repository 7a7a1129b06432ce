"""Discovery once per job (`zephon_columnar.io.manifest`): one process lists a Parquet folder and
reads its footers, the job's others read the manifest it writes; a new job discovers again."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon_columnar import Dataset
from zephon_columnar.errors import ConfigurationWarning, DatasetNotFoundError
from zephon_columnar.io import fs, manifest


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A Parquet folder of 2 files, the cache root in tmp_path, no job variable set."""
    monkeypatch.setenv("ZEPHON_COLUMNAR_CACHE", str(tmp_path / "cache"))
    for var in ("ZEPHON_COLUMNAR_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "ZEPHON_COLUMNAR_MANIFESTS",
                "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    data = tmp_path / "web"
    data.mkdir()
    for f in range(2):
        pq.write_table(pa.table({"id": np.arange(f * 100, f * 100 + 100)}), data / f"part-{f}.parquet", row_group_size=30)
    return data


@pytest.fixture
def listings(monkeypatch) -> list[str]:
    """Every folder listed by discovery (fs.list_data_files), in order."""
    seen: list[str] = []
    real = fs.list_data_files

    def counted(path: str) -> list[str]:
        seen.append(path)
        return real(path)

    monkeypatch.setattr(fs, "list_data_files", counted)
    return seen


def rows(ds: Dataset) -> list[int]:
    reader = ds.open_reader()
    return [i for s in ds.shards for i in reader.take(s.shard_id, np.arange(s.num_rows)).column("id").to_pylist()]


def test_without_a_job_id_every_process_discovers_and_nothing_is_written(folder, listings, tmp_path):
    Dataset.from_path("web", str(folder))
    Dataset.from_path("web", str(folder))
    assert len(listings) == 2 and not (tmp_path / "cache" / "manifests").exists()


@pytest.mark.parametrize("job_variable", ["ZEPHON_COLUMNAR_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"])
def test_in_a_job_the_dataset_is_discovered_once_and_read_back_the_same(folder, listings, monkeypatch, job_variable,
                                                                        tmp_path):
    monkeypatch.setenv(job_variable, "job-1")
    if job_variable != "ZEPHON_COLUMNAR_JOB_ID":  # a scheduler's id counts once a manifest folder is named
        monkeypatch.setenv("ZEPHON_COLUMNAR_MANIFESTS", str(tmp_path / "manifests"))
    first = Dataset.from_path("web", str(folder))
    monkeypatch.setattr("zephon_columnar.io.parquet._read_footer", lambda url: 1 / 0)  # no footer read again
    again = Dataset.from_path("web", str(folder))
    assert len(listings) == 1
    assert again.shards == first.shards and again.schema == first.schema and again.format.name == "parquet"
    assert rows(again) == rows(first) == list(range(200))


def test_a_changed_local_folder_is_discovered_again(folder, listings, monkeypatch):
    monkeypatch.setenv("ZEPHON_COLUMNAR_JOB_ID", "job-1")
    assert len(Dataset.from_path("web", str(folder)).shards) == 2
    pq.write_table(pa.table({"id": np.arange(200, 250)}), folder / "part-2.parquet")
    os.utime(folder, ns=(1, 1))  # a folder time that differs even on a coarse clock
    assert rows(Dataset.from_path("web", str(folder))) == list(range(250)) and len(listings) == 2


def test_without_a_local_time_a_new_job_rediscovers_and_the_job_keeps_what_it_found(folder, monkeypatch):
    monkeypatch.setattr(manifest, "_local_version", lambda path: None)  # as object storage has none
    monkeypatch.setenv("ZEPHON_COLUMNAR_JOB_ID", "job-1")
    assert len(Dataset.from_path("web", str(folder)).shards) == 2
    pq.write_table(pa.table({"id": np.arange(200, 250)}), folder / "part-2.parquet")
    assert len(Dataset.from_path("web", str(folder)).shards) == 2  # the same job: what it first found
    monkeypatch.setenv("ZEPHON_COLUMNAR_JOB_ID", "job-2")
    assert rows(Dataset.from_path("web", str(folder))) == list(range(250))


@pytest.mark.parametrize("env", [{"SLURM_JOB_ID": "5"}, {"TORCHELASTIC_RUN_ID": "none", "ZEPHON_COLUMNAR_MANIFESTS": "m"},
                                 {"TORCHELASTIC_RUN_ID": "r1"}])
def test_no_manifest_unless_asked_for(folder, listings, monkeypatch, env, tmp_path):
    """A scheduler's id alone (an interactive SLURM allocation), or torchrun's default run id
    "none" (shared by every job), keys nothing."""
    for k, v in env.items():
        monkeypatch.setenv(k, v if k != "ZEPHON_COLUMNAR_MANIFESTS" else str(tmp_path / v))
    assert manifest.job_id() is None
    Dataset.from_path("web", str(folder))
    Dataset.from_path("web", str(folder))
    assert len(listings) == 2


def test_another_rank_waits_for_the_writers_manifest_instead_of_listing(folder, listings, monkeypatch):
    monkeypatch.setenv("ZEPHON_COLUMNAR_JOB_ID", "job-1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    made = manifest.PARQUET.discover("web", sorted(str(p) for p in folder.iterdir()))
    url = manifest.manifest_url("job-1", str(folder), None, "raise")

    def local_rank_0() -> None:  # what LOCAL_RANK 0 of the node writes once it has discovered
        time.sleep(0.5)
        manifest._write(url, manifest._body(made))

    writer = threading.Thread(target=local_rank_0)
    writer.start()
    ds = Dataset.from_path("web", str(folder))
    writer.join()
    assert listings == [] and ds.shards == made.shards


def test_a_rank_whose_writer_never_comes_discovers_itself_after_the_wait_with_a_warning(folder, listings, monkeypatch):
    monkeypatch.setenv("ZEPHON_COLUMNAR_JOB_ID", "job-1")
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("ZEPHON_COLUMNAR_MANIFEST_WAIT_S", "0.5")
    with pytest.warns(ConfigurationWarning, match="did not appear within 0.5 s"):
        ds = Dataset.from_path("web", str(folder))
    assert len(listings) == 1 and rows(ds) == list(range(200))


def test_a_format_not_kept_and_a_failed_discovery_send_the_others_to_discover_at_once(folder, tmp_path, monkeypatch):
    monkeypatch.setenv("ZEPHON_COLUMNAR_JOB_ID", "job-1")
    jsonl = tmp_path / "chat"
    jsonl.mkdir()
    (jsonl / "a.jsonl").write_text('{"x": 1}\n{"x": 2}\n')
    Dataset.from_path("chat", str(jsonl))  # the writer: JSONL is not kept
    missing = f"{tmp_path}/nothing-*.parquet"
    with pytest.raises(DatasetNotFoundError):
        Dataset.from_path("gone", missing)  # the writer: its discovery failed
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("ZEPHON_COLUMNAR_MANIFEST_WAIT_S", "60")
    start = time.monotonic()
    assert Dataset.from_path("chat", str(jsonl)).format.name == "jsonl"
    with pytest.raises(DatasetNotFoundError, match="no file matches"):
        Dataset.from_path("gone", missing)
    assert time.monotonic() - start < 10  # no wait for a manifest that will not come


def test_a_damaged_manifest_is_ignored_and_the_dataset_discovered_again(folder, listings, monkeypatch):
    monkeypatch.setenv("ZEPHON_COLUMNAR_JOB_ID", "job-1")
    Dataset.from_path("web", str(folder))
    url = manifest.manifest_url("job-1", str(folder), None, "raise")
    with open(url, "r+b") as f:
        f.truncate(40)
    assert rows(Dataset.from_path("web", str(folder))) == list(range(200)) and len(listings) == 2
