"""WebDataset tar shards (`zephon_columnar.io.webdataset`), written by ``webdataset``'s own
``TarWriter``: detection, row counts from the tar headers, values read back as written (text,
JSON, class ids, bytes, keys, samples missing a member), random access, a mixture with Parquet
through tokenize and packing resumed exactly on every runner, fsspec URLs, and corrupt or cut
shards named by file."""

from __future__ import annotations

import io
import json
import tarfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.extras import require
from tests.ops._tokenizers import make_texts, make_tokenizer
from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.errors import DatasetFormatError
from zephon_columnar.io import tar as tar_headers
from zephon_columnar.io import webdataset

wds = require("webdataset", "formats")

TEXTS = make_texts(90, seed=5)


def sample(i: int) -> dict:
    out = {"__key__": f"s{i:05d}", "txt": TEXTS[i], "json": {"i": i, "tags": ["a", "b"][: i % 3]}, "cls": i % 7}
    if i % 4 != 3:  # every fourth sample has no image bytes
        out["jpg"] = bytes([i % 256]) * (1 + i % 5)
    return out


def write_shards(folder, sizes=(30, 25, 35)):
    folder.mkdir(parents=True, exist_ok=True)
    start = 0
    for s, n in enumerate(sizes):
        with wds.TarWriter(str(folder / f"shard-{s:03d}.tar")) as sink:
            for i in range(start, start + n):
                sink.write(sample(i))
        start += n
    return folder


def expected_row(i: int) -> dict:
    s = sample(i)
    return {"key": s["__key__"], "cls": s["cls"], "jpg": s.get("jpg"), "json": json.dumps(s["json"]), "txt": s["txt"]}


def test_a_folder_of_tar_shards_is_detected_and_counted_from_the_headers(tmp_path):
    ds = Dataset.from_path("w", write_shards(tmp_path))
    assert ds.format_name == "webdataset" and ds.counts().tolist() == [30, 25, 35]
    assert ds.schema == pa.schema(
        [("key", pa.string()), ("cls", pa.int64()), ("jpg", pa.binary()), ("json", pa.string()), ("txt", pa.string())]
    )
    assert Dataset.from_path("w", tmp_path / "shard-001.tar", fmt="webdataset").total() == 25


def test_values_read_back_as_written_in_any_order(tmp_path):
    ds = Dataset.from_path("w", write_shards(tmp_path))
    reader = ds.open_reader()
    rows = np.array([24, 0, 3, 3, 17])
    got = reader.take(1, rows).to_pylist()
    assert [{**r, "json": json.dumps(json.loads(r["json"]))} for r in got] == [expected_row(30 + int(r)) for r in rows]
    assert reader.take(2, np.array([3]))[0][0].as_py() == "s00058"
    only = ds.open_reader(columns=["txt", "cls"]).take(0, np.arange(30))
    assert only.column_names == ["txt", "cls"] and only.column("cls").to_pylist() == [i % 7 for i in range(30)]


def test_a_mixture_with_parquet_through_tokenize_and_packing_resumes_exactly_on_every_runner(tmp_path):
    wd = Dataset.from_path("w", write_shards(tmp_path / "w"))
    (tmp_path / "p").mkdir()
    pq.write_table(pa.table({"txt": make_texts(40, seed=9)}), tmp_path / "p" / "part-0.parquet")
    pqds = Dataset.from_path("p", tmp_path / "p")
    tokenizer = tmp_path / "tok.json"
    make_tokenizer().save(str(tokenizer))

    def build(runner: str) -> Pipeline:
        ws = StaticMixtureWorkSource([wd, pqds], {"w": 0.7, "p": 0.3}, chunk_size=8, seed=1, shuffle_within_shard=True)
        return (
            Pipeline(ws)
            .tokenize(tokenizer_id=str(tokenizer), field="txt", special_tokens="eos")
            .pack_flat(33, algorithm="wrap")
            .batch(2)
            .options(runner=runner, canonical_replicas=2)
        )

    def rows(batch) -> list:
        return batch.table.column("input_ids").to_pylist()

    whole = [rows(b) for b in build("inline")]
    assert len(whole) > 10
    for runner in ("inline", "threads", "process"):
        pipe = build(runner)
        it = iter(pipe)
        head = [rows(next(it)) for _ in range(6)]
        ckpt = pipe.checkpoint()
        it.close()
        resumed = build(runner)
        resumed.restore(ckpt)
        assert head + [rows(b) for b in resumed] == whole, runner


def test_a_memory_url_shard(tmp_path, memfs):
    mem, root = memfs
    write_shards(tmp_path, sizes=(12,))
    mem.pipe(f"{root}/wds/shard-000.tar", (tmp_path / "shard-000.tar").read_bytes())
    ds = Dataset.from_path("m", f"{root}/wds")
    assert ds.total() == 12 and ds.open_reader().take(0, np.array([11])).column("txt").to_pylist() == [TEXTS[11]]


def test_a_cut_or_corrupt_shard_is_named(tmp_path):
    folder = write_shards(tmp_path, sizes=(20,))
    data = (folder / "shard-000.tar").read_bytes()
    (folder / "shard-000.tar").write_bytes(data[: len(data) // 2 + 100])
    with pytest.raises(DatasetFormatError, match=r"shard-000\.tar"):
        Dataset.from_path("w", folder)
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        second = archive.getmembers()[1].offset  # where the second member's header starts
    (folder / "shard-000.tar").write_bytes(data[: second + 10] + b"Z" + data[second + 11 :])
    with pytest.raises(
        DatasetFormatError, match=rf"shard-000\.tar is not a readable .* bad header checksum at byte {second}"
    ):
        Dataset.from_path("w", folder)
    (folder / "shard-000.tar").write_bytes(b"not a tar at all" * 100)
    with pytest.raises(DatasetFormatError, match=r"shard-000\.tar is not a tar archive \(no tar header at byte 0"):
        Dataset.from_path("w", folder)


def test_a_member_that_is_not_its_extensions_kind_is_named(tmp_path):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, payload in (("a.cls", b"3"), ("b.cls", b"three")):
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    (tmp_path / "x.tar").write_bytes(buffer.getvalue())
    reader = Dataset.from_path("x", tmp_path / "x.tar").open_reader()
    assert reader.take(0, np.array([0])).column("cls").to_pylist() == [3]
    with pytest.raises(DatasetFormatError, match=r"x\.tar: member b\.cls is not an integer"):
        reader.take(0, np.array([1]))


def test_npy_members_are_read_as_lists_of_their_dtype(tmp_path):
    arrays = [np.arange(i, i + 1 + i % 5, dtype=np.int32) for i in range(12)]
    with wds.TarWriter(str(tmp_path / "ids.tar")) as sink:  # webdataset's own .npy encoder
        for i, a in enumerate(arrays):
            sample = {"__key__": f"d{i:03d}", "input_ids.npy": a}
            if i != 4:
                sample["npy"] = a.astype(np.float32)
            sink.write(sample)
    ds = Dataset.from_path("t", tmp_path / "ids.tar")
    assert ds.schema.field("input_ids.npy").type == pa.list_(pa.int32())
    assert ds.schema.field("npy").type == pa.list_(pa.float32())
    rows = np.array([7, 0, 4, 4, 11])
    got = ds.open_reader().take(0, rows)
    assert got.column("input_ids.npy").to_pylist() == [arrays[i].tolist() for i in rows]
    assert got.column("npy").to_pylist() == [None if i == 4 else arrays[i].astype(np.float32).tolist() for i in rows]


def test_a_npy_member_of_another_dtype_or_shape_is_named(tmp_path):
    with wds.TarWriter(str(tmp_path / "ids.tar")) as sink:
        sink.write({"__key__": "a", "npy": np.arange(3, dtype=np.int32)})
        sink.write({"__key__": "b", "npy": np.arange(3, dtype=np.int64)})
        sink.write({"__key__": "c", "npy": np.zeros((2, 2), dtype=np.int32)})
    reader = Dataset.from_path("t", tmp_path / "ids.tar").open_reader()
    assert reader.take(0, np.array([0])).column("npy").to_pylist() == [[0, 1, 2]]
    with pytest.raises(
        DatasetFormatError,
        match=r"ids\.tar: member b\.npy holds a 1-D int64 array; every npy member must be a 1-D int32",
    ):
        reader.take(0, np.array([1]))
    with pytest.raises(DatasetFormatError, match=r"member c\.npy holds a 2-D int32 array"):
        reader.take(0, np.array([2]))
    with wds.TarWriter(str(tmp_path / "img.tar")) as sink:
        sink.write({"__key__": "a", "npy": np.zeros((2, 2), dtype=np.uint8)})
    with pytest.raises(
        DatasetFormatError, match=r"img\.tar: member a\.npy holds a 2-D uint8 array; \.npy members are read as 1-D"
    ):
        Dataset.from_path("t", tmp_path / "img.tar")


def npy_member(values: np.ndarray, style: str) -> bytes:
    """A .npy member as numpy writes it ("save": version 1.0), as version 2.0 ("v2"), with its dict
    keys in another order ("reordered": not numpy's own layout), or with bytes after the array
    ("trailing": numpy reads the array and ignores them)."""
    out = io.BytesIO()
    if style == "reordered":
        text = "{'shape': (%d,), 'fortran_order': False, 'descr': '%s', }" % (len(values), values.dtype.str)
        text = text.ljust(118) + "\n"
        return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text.encode() + values.tobytes()
    np.lib.format.write_array(out, values, version=(2, 0) if style == "v2" else (1, 0))
    return out.getvalue() + (b"\x07" * 5 if style == "trailing" else b"")


def write_members(path, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w") as tar:
        for name, payload in members:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))


@settings(max_examples=25, deadline=None)
@given(
    docs=st.lists(
        st.tuples(st.integers(0, 300), st.sampled_from(["save", "save", "v2", "reordered", "trailing"])),
        min_size=1,
        max_size=40,
    ),
    dtype=st.sampled_from([np.int32, np.int64, np.uint16, np.float32]),
    seed=st.integers(0, 2**16),
)
def test_npy_members_read_back_as_numpy_loads_them_whatever_their_header(tmp_path_factory, docs, dtype, seed):
    rng = np.random.default_rng(seed)
    arrays = [rng.integers(0, 30_000, n).astype(dtype) for n, _ in docs]
    path = tmp_path_factory.mktemp("npy") / "ids.tar"
    write_members(
        path, [(f"d{i:04d}.npy", npy_member(a, style)) for i, (a, (_, style)) in enumerate(zip(arrays, docs))]
    )
    rows = rng.permutation(len(arrays))
    got = Dataset.from_path("t", path).open_reader().take(0, rows).column("npy")
    assert got.type == pa.list_(pa.from_numpy_dtype(np.dtype(dtype)))
    assert got.to_pylist() == [np.load(io.BytesIO(npy_member(arrays[i], docs[i][1]))).tolist() for i in rows]


def test_npy_members_numpy_wrote_are_read_without_a_header_parse_per_member(tmp_path, monkeypatch):
    arrays = [np.arange(i * 7 % 500, dtype=np.int32) for i in range(200)]
    with wds.TarWriter(str(tmp_path / "ids.tar")) as sink:  # webdataset's own .npy encoder (np.save)
        for i, a in enumerate(arrays):
            sink.write({"__key__": f"d{i:03d}", "input_ids.npy": a} | ({"npy": a} if i % 9 else {}))
    reader = Dataset.from_path("t", tmp_path / "ids.tar").open_reader()

    def one_by_one(*_):
        raise AssertionError("numpy's own headers should be checked as one array operation")

    monkeypatch.setattr(webdataset, "_npy_bodies_one_by_one", one_by_one)
    got = reader.take(0, np.arange(200)[::-1])
    assert got.column("input_ids.npy").to_pylist() == [a.tolist() for a in arrays[::-1]]
    assert got.column("npy").to_pylist() == [
        a.tolist() if i % 9 else None for i, a in reversed(list(enumerate(arrays)))
    ]


def test_a_cut_npy_member_among_whole_ones_is_named(tmp_path):
    whole = npy_member(np.arange(50, dtype=np.int32), "save")
    write_members(tmp_path / "ids.tar", [("a.npy", whole), ("b.npy", whole[:-12]), ("c.npy", whole)])
    reader = Dataset.from_path("t", tmp_path / "ids.tar").open_reader()
    assert reader.take(0, np.array([2, 0])).column("npy").to_pylist() == [list(range(50))] * 2
    with pytest.raises(DatasetFormatError, match=r"ids\.tar: member b\.npy is cut short: 188 of 200 bytes"):
        reader.take(0, np.array([0, 1, 2]))


def index_rows(index) -> list[tuple]:
    """A tar index as comparable rows: (key, {ext: (offset, size)})."""
    return [
        (
            key,
            {
                ext: (int(index.offsets[ext][r]), int(index.sizes[ext][r]))
                for ext in index.offsets
                if index.offsets[ext][r] >= 0
            },
        )
        for r, key in enumerate(index.keys.to_pylist())
    ]


PLAIN_NAMES = [
    f"{key}.{ext}" for key in ("s1", "s2", "dir/s3", "./s4", "naïve") for ext in ("txt", "json", "input_ids.npy")
]
ODD_NAMES = ["dir/.hidden.txt", "_meta.txt", "noext", "s5.", "a.b.c", "x" * 120 + ".txt", "s6.key"]
# Mostly what a WebDataset holds (read at once), now and then a name or member the walk must judge.
MEMBER_NAMES = st.sampled_from(PLAIN_NAMES * 4 + ODD_NAMES)
MEMBER_KINDS = st.sampled_from(["file"] * 6 + ["folder", "link", "magic"])


@settings(max_examples=60, deadline=None)
@given(
    members=st.lists(
        st.tuples(MEMBER_NAMES, MEMBER_KINDS, st.integers(0, 1500)),
        min_size=1,
        max_size=12,
    ),
    tar_format=st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]),
    float_mtime=st.booleans(),
)
def test_the_header_index_read_at_once_is_the_one_read_member_by_member(
    tmp_path_factory, members, tar_format, float_mtime
):
    path = tmp_path_factory.mktemp("tar") / "t.tar"
    with tarfile.open(path, "w", format=tar_format) as tar:
        for i, (name, kind, size) in enumerate(members):
            if (
                tar_format == tarfile.USTAR_FORMAT
                and len(name) > 100
                or not name.isascii()
                and tar_format != tarfile.PAX_FORMAT
            ):
                name = f"m{i}.txt"
            info = tarfile.TarInfo(name)
            info.mtime = 1_700_000_000.25 if float_mtime else 1_700_000_000  # a float mtime: a pax record
            if kind == "folder":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, "s1.txt"
                tar.addfile(info)
            else:  # "magic": data whose 257th byte of a block starts "ustar", as a header's magic does
                payload = (
                    bytes([i % 251]) * size if kind == "file" else (b"\0" * 257 + b"ustar\x0000" + b"\0" * 244) * 3
                )
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    size = path.stat().st_size
    try:
        expected = index_rows(webdataset._walk_members(str(path), size, str(path)))
    except DatasetFormatError:
        expected = None  # an index the member-by-member walk refuses (a "key" extension)
    found = tar_headers.members_at_once(str(path), size)
    at_once = None if found is None else webdataset._samples_at_once(found)
    if found is not None:  # None: the archive goes member by member
        assert list(zip(*(found[0].to_pylist(), found[1].tolist(), found[2].tolist()))) == list(
            tar_headers.members(str(path), size)
        )
    if at_once is not None:  # None: it hands the archive to the member-by-member walk
        assert index_rows(at_once) == expected


@pytest.mark.parametrize("tar_format", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_plain_archives_are_indexed_without_a_walk(tmp_path, monkeypatch, tar_format):
    folder = write_shards(tmp_path / "w", sizes=(40,))  # TarWriter's own shard
    with tarfile.open(folder / "more.tar", "w", format=tar_format) as tar:
        info = tarfile.TarInfo("folder")
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
        for name in ("folder/a.txt", "./b.txt", "folder/.hidden.txt", "b.json"):
            info = tarfile.TarInfo(name)
            info.mtime, info.size = 1_700_000_000.5, 2  # a float mtime: a pax record in pax format
            tar.addfile(info, io.BytesIO(b"hi"))

    def walk(*_):
        raise AssertionError("plain archives should be indexed from their header blocks at once")

    monkeypatch.setattr(webdataset, "_walk_members", walk)
    monkeypatch.setenv("ZEPHON_COLUMNAR_CACHE", str(tmp_path / "cache"))
    webdataset._scan.cache_clear()
    ds = Dataset.from_path("w", folder)
    more = ds.open_reader().take(0, np.array([0, 1])).to_pylist()  # more.tar sorts first
    rows = ds.open_reader().take(1, np.array([39, 0])).to_pylist()
    assert [r["key"] for r in rows] == ["s00039", "s00000"] and rows[0]["txt"] == TEXTS[39]
    assert [(r["key"], r["txt"], r["json"]) for r in more] == [("folder/a", "hi", None), ("b", "hi", "hi")]


def test_the_header_index_is_cached_on_disk_for_other_processes(tmp_path, monkeypatch):
    from zephon_columnar.io import webdataset as module

    monkeypatch.setenv("ZEPHON_COLUMNAR_CACHE", str(tmp_path / "cache"))
    folder = write_shards(tmp_path / "w", sizes=(12, 9))
    first = Dataset.from_path("w", folder)
    module._scan.cache_clear()  # a fresh process: nothing in memory

    def no_walk(*args):
        raise AssertionError("walked the tar again")

    monkeypatch.setattr(module, "_walk", no_walk)
    again = Dataset.from_path("w", folder)
    assert again.counts().tolist() == [12, 9] and again.schema == first.schema
    got = again.open_reader().take(1, np.array([8, 0]))
    assert [r["txt"] for r in got.to_pylist()] == [TEXTS[20], TEXTS[12]]
    monkeypatch.undo()  # a rewritten shard (another size and time) is walked again
    monkeypatch.setenv("ZEPHON_COLUMNAR_CACHE", str(tmp_path / "cache"))
    write_shards(tmp_path / "w", sizes=(5, 9))
    assert Dataset.from_path("w", folder).counts().tolist() == [5, 9]
