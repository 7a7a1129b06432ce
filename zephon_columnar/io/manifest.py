"""Discovery once per job: a Parquet dataset's shards, listed and read from their footers by one
process, written as a manifest that the job's other processes read instead.

Without it every rank lists the folder and reads every footer (footers are remembered per node
by the shard cache; the listing is not): 1,024 ranks listing 100,000 objects make ~100,000 list
requests to one bucket prefix at the job's start. With a job id (`job_id`: ``ZEPHON_COLUMNAR_JOB_ID``,
or with ``ZEPHON_COLUMNAR_MANIFESTS`` set, torchrun's run id or SLURM's job and step):

- the manifest of ``(job id, path, format, on_bad_record)`` is written to the manifest folder:
  ``ZEPHON_COLUMNAR_MANIFESTS`` (an fsspec URL or a path every node sees: the job's ranks share
  one), else the node's cache folder (``<cache root>/manifests``: one per node);
- one process discovers and writes it: ``RANK`` 0 for a shared folder, ``LOCAL_RANK`` 0 for the
  node's; the others wait for it (polling, at most ``ZEPHON_COLUMNAR_MANIFEST_WAIT_S``, 300 s by
  default), then discover themselves with a `ConfigurationWarning` if it never came;
- a new job (a new id) discovers again, and so does a local folder whose modification time
  changed (a file added, removed or renamed): a changed folder is rediscovered. Within a job an
  object-storage dataset is what the first discovery found, on every rank and every restart (a
  file changed since is refused when read, as without a manifest).

Without a job id nothing is written or read. Only Parquet datasets are kept (their discovery is
the footers; other formats keep state of their own in their readers). A manifest that cannot be
read (damaged, from another version) is ignored and the dataset discovered again.

Example:
    >>> import os
    >>> from zephon_columnar.io.parquet import PARQUET
    >>> os.environ["ZEPHON_COLUMNAR_JOB_ID"] = f"doc-job-{os.getpid()}"
    >>> files = ["data/web/part-000.parquet"]
    >>> first = discover_once("data/web/part-000.parquet", None, "raise", lambda: PARQUET.discover("web", files))
    >>> again = discover_once("data/web/part-000.parquet", None, "raise", lambda: 1 / 0)  # read, not discovered
    >>> [s.num_rows for s in again.shards] == [s.num_rows for s in first.shards]
    True
    >>> del os.environ["ZEPHON_COLUMNAR_JOB_ID"]
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from zephon_columnar.errors import ConfigurationWarning, warn
from zephon_columnar.io import fs
from zephon_columnar.io.base import ShardInfo
from zephon_columnar.io.format import Discovered
from zephon_columnar.io.parquet import PARQUET

MANIFEST_VERSION = 1
DEFAULT_WAIT_S = 300.0
_POLL_S = 0.2


def job_id() -> str | None:
    """The job this process belongs to (None: no manifests): ``ZEPHON_COLUMNAR_JOB_ID``; or, when
    ``ZEPHON_COLUMNAR_MANIFESTS`` names a folder, torchrun's ``TORCHELASTIC_RUN_ID`` (not its
    default ``"none"``, which every job shares) or SLURM's job and step. Nothing is kept unless
    asked for: an interactive SLURM allocation or a torchrun without ``--rdzv-id`` is no job to
    key a dataset by."""
    explicit = os.environ.get("ZEPHON_COLUMNAR_JOB_ID")
    if explicit:
        return explicit
    if not os.environ.get("ZEPHON_COLUMNAR_MANIFESTS"):
        return None
    run = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if run and run != "none":
        return run
    slurm = os.environ.get("SLURM_JOB_ID")
    if slurm:
        return f"{slurm}.{os.environ.get('SLURM_STEP_ID', '')}"
    return None


def manifest_folder() -> tuple[str, bool]:
    """``(folder, shared)``: ``ZEPHON_COLUMNAR_MANIFESTS`` (shared by the job's nodes), else the
    node's cache folder."""
    shared = os.environ.get("ZEPHON_COLUMNAR_MANIFESTS")
    if shared:
        return shared, True
    return os.path.join(fs.cache_root(), "manifests"), False


def manifest_url(job: str, path: str, fmt: str | None, on_bad_record: str) -> str:
    """Where the manifest of this job's dataset at ``path`` (``fmt`` as given: None to detect)
    is."""
    folder, _ = manifest_folder()
    key = json.dumps([MANIFEST_VERSION, job, fs.canonical(path), fmt, on_bad_record, _local_version(path)])
    return fs.join(folder, hashlib.sha256(key.encode()).hexdigest()[:32] + ".json")


def _local_version(path: str) -> int | None:
    """A local folder's modification time (files added, removed or renamed in it change it), or
    of a glob's folder: a local dataset changed within a job is discovered again. None for object
    storage, which has no such time (a new job rediscovers it)."""
    if not fs.is_local(path):
        return None
    local = fs.to_local(path)
    while fs.is_glob(local):
        local = os.path.dirname(local)
    try:
        return os.stat(local or ".").st_mtime_ns
    except OSError:
        return None


def discover_once(path: str, fmt: str | None, on_bad_record: str, discover: Callable[[], Discovered]) -> Discovered:
    """``discover()``'s result, made once per job (see the module docstring): read from the
    manifest when this process is not the one that writes it, written after ``discover()`` when
    it is. The writer also says when there is nothing to share (another format than Parquet,
    or a discovery that failed): the others then discover at once, as without a manifest."""
    job = job_id()
    if job is None:
        return discover()
    url = manifest_url(job, path, fmt, on_bad_record)
    found = _read(url)
    if isinstance(found, Discovered):
        return found
    if found is _DISCOVER_YOURSELF:
        return discover()
    _, shared = manifest_folder()
    if int(os.environ.get("RANK" if shared else "LOCAL_RANK", "0")) != 0:
        return _wait_for(url, job, path, discover)
    try:
        made = discover()
    except BaseException:
        _write(url, {"version": MANIFEST_VERSION, "format": None})  # the others fail as this one did
        raise
    _write(url, _body(made))
    return made


def _wait_for(url: str, job: str, path: str, discover: Callable[[], Discovered]) -> Discovered:
    wait_s = float(os.environ.get("ZEPHON_COLUMNAR_MANIFEST_WAIT_S", DEFAULT_WAIT_S))
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        time.sleep(_POLL_S)
        found = _read(url)
        if isinstance(found, Discovered):
            return found
        if found is _DISCOVER_YOURSELF:
            return discover()
    warn(
        f"{path}: the discovery manifest of job {job!r} ({url}) did not appear within {wait_s:g} s; this process "
        "discovers the dataset itself. The process that writes it (RANK 0, or LOCAL_RANK 0 without "
        "ZEPHON_COLUMNAR_MANIFESTS) may not build this dataset: build it there too, or raise "
        "ZEPHON_COLUMNAR_MANIFEST_WAIT_S.",
        ConfigurationWarning,
    )
    return discover()


def _body(found: Discovered) -> dict[str, Any]:
    if found.format.name != PARQUET.name:
        return {"version": MANIFEST_VERSION, "format": None}
    return {
        "version": MANIFEST_VERSION,
        "format": found.format.name,
        "schema": base64.b64encode(found.schema.serialize().to_pybytes()).decode(),
        "shards": [[s.path, s.num_rows, s.num_bytes, list(s.extra.get("row_groups", ()))] for s in found.shards],
    }


def _write(url: str, body: dict[str, Any]) -> None:
    try:
        if fs.is_local(url):
            os.makedirs(os.path.dirname(fs.to_local(url)), exist_ok=True)
        fs.write_bytes(url, json.dumps(body).encode())  # whole or absent, locally and in a bucket
    except OSError as err:  # a read-only or full folder: the others discover after their wait
        warn(
            f"the discovery manifest {url} could not be written ({err}); each process discovers the dataset itself.",
            ConfigurationWarning,
        )


#: What a manifest says when there is nothing to share: discover as without one.
_DISCOVER_YOURSELF = object()


def _read(url: str) -> Discovered | object | None:
    """The manifest at ``url``: a `Discovered`, `_DISCOVER_YOURSELF`, or None (absent, or not one
    this version can trust)."""
    try:
        body: dict[str, Any] = json.loads(fs.read_bytes(url))
        if body.get("version") != MANIFEST_VERSION:
            return None
        if body.get("format") != PARQUET.name:
            return _DISCOVER_YOURSELF
        schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(body["schema"])))
        shards = tuple(
            ShardInfo(
                shard_id=i,
                path=path,
                num_rows=int(rows),
                num_bytes=int(size),
                extra={"row_groups": tuple(int(g) for g in groups)},
            )
            for i, (path, rows, size, groups) in enumerate(body["shards"])
        )
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return None
    return Discovered(format=PARQUET, shards=shards, schema=schema)
