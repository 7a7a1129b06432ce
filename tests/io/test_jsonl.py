"""JSON Lines: cached line index, batch parsing, compression, and errors that name the line."""

from __future__ import annotations

import gzip
import json
import os
import re
import time

import numpy as np
import pytest
import zstandard

from zephon_columnar import Pipeline, StaticMixtureWorkSource
from zephon_columnar.errors import DatasetFormatError
from zephon_columnar.io import Dataset, jsonl
from zephon_columnar.io.jsonl import JsonlReader


def rows_of(n: int, start: int = 0) -> list[dict]:
    return [{"id": i, "text": f"line {i} " + "é" * (i % 5), "tags": ["a"] * (i % 3), "meta": {"k": i % 4}}
            for i in range(start, start + n)]


def lines_of(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


@pytest.fixture()
def jl_dir(tmp_path):
    """Two shards: 1500 rows (plain) and 400 rows (plain)."""
    d = tmp_path / "jl"
    d.mkdir()
    (d / "a.jsonl").write_text(lines_of(rows_of(1500)))
    (d / "b.jsonl").write_text(lines_of(rows_of(400, 1500)))
    return d


def test_counts_come_from_the_line_index(jl_dir):
    ds = Dataset.from_path("chat", str(jl_dir))
    assert ds.format.name == "jsonl" and ds.counts().tolist() == [1500, 400]
    assert ds.schema.names == ["id", "text", "tags", "meta"]


@pytest.mark.parametrize("seed", [0, 1])
def test_take_returns_exactly_the_rows_asked_in_order(jl_dir, seed):
    ds = Dataset.from_path("chat", str(jl_dir))
    expected = [rows_of(1500), rows_of(400, 1500)]
    rng = np.random.default_rng(seed)
    reader = ds.open_reader()
    for shard in (0, 1):
        n = len(expected[shard])
        for rows in (rng.integers(0, n, 200), np.arange(10, 300), np.array([n - 1, 0, n - 1]),
                     np.concatenate([np.arange(5, 9), np.arange(100, 104), [2]])):
            assert reader.take(shard, rows).to_pylist() == [expected[shard][i] for i in rows]
    assert reader.take(0, np.array([], dtype=np.int64)).schema == ds.schema
    reader.close()


def test_second_discovery_reads_the_index_from_disk(jl_dir, private_cache):
    start = jsonl.INDEX_CACHE.scans
    Dataset.from_path("chat", str(jl_dir))
    assert jsonl.INDEX_CACHE.scans == start + 2
    assert len(os.listdir(private_cache / "jsonl_index")) == 2
    jsonl.INDEX_CACHE.clear_memory()  # as a fresh process would start
    before = jsonl.INDEX_CACHE.scans
    ds = Dataset.from_path("chat", str(jl_dir))
    assert jsonl.INDEX_CACHE.scans == before and ds.counts().tolist() == [1500, 400]
    # Rewriting a file (new size and mtime) invalidates its index.
    time.sleep(0.01)
    with open(jl_dir / "b.jsonl", "a") as f:
        f.write(json.dumps(rows_of(1, 9000)[0]) + "\n")
    ds = Dataset.from_path("chat", str(jl_dir))
    assert jsonl.INDEX_CACHE.scans == before + 1 and ds.counts().tolist() == [1500, 401]


def test_unwritable_index_cache_falls_back_to_memory(jl_dir, tmp_path, monkeypatch):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("x")  # a file where the cache folder should be: makedirs fails
    monkeypatch.setenv("ZEPHON_COLUMNAR_CACHE", str(blocker))
    ds = Dataset.from_path("chat", str(jl_dir))
    assert ds.counts().tolist() == [1500, 400]
    assert ds.open_reader().take(1, np.array([3])).to_pylist() == [rows_of(1, 1503)[0]]


def test_gzip_and_zstd_files_give_the_same_rows(tmp_path):
    rows = rows_of(1200)
    data = lines_of(rows).encode()
    for name, blob in [("a.jsonl", data), ("b.jsonl.gz", gzip.compress(data)),
                       ("c.jsonl.zst", zstandard.ZstdCompressor().compress(data))]:
        d = tmp_path / name.split(".")[0]
        d.mkdir()
        (d / name).write_bytes(blob)
        ds = Dataset.from_path("x", str(d))
        assert ds.counts().tolist() == [1200]
        reader = JsonlReader(ds, decoded_cache_bytes=1)
        order = np.random.default_rng(1).permutation(1200)[:300]
        assert reader.take(0, order).to_pylist() == [rows[i] for i in order], name
        assert reader.take(0, np.arange(1190, 1200)).to_pylist() == rows[1190:]


def test_zstd_multi_frame_and_missing_final_newline(tmp_path):
    rows = rows_of(30)
    cctx = zstandard.ZstdCompressor()
    text = lines_of(rows).rstrip("\n").encode()
    half = text.index(b"\n", len(text) // 2) + 1
    (tmp_path / "a.jsonl.zst").write_bytes(cctx.compress(text[:half]) + cctx.compress(text[half:]))
    ds = Dataset.from_path("x", str(tmp_path / "a.jsonl.zst"))
    assert ds.total() == 30
    assert ds.open_reader().take(0, np.array([29, 0])).to_pylist() == [rows[29], rows[0]]


def test_missing_fields_are_null_and_a_projection_ignores_the_other_fields(tmp_path):
    (tmp_path / "a.jsonl").write_text(
        '{"id": 1, "text": "a", "when": "2020-01-01"}\n{"id": 2}\n' + '{"id": 3, "text": "c"}\n' * 1000
        + '{"id": 3, "text": "c", "new": 5}\n' * 200)
    ds = Dataset.from_path("x", str(tmp_path))
    assert ds.schema.names == ["id", "text", "when", "new"]
    got = ds.open_reader().take(0, np.array([0, 1, 1201])).to_pylist()
    # Date-like strings stay strings (pyarrow would infer a timestamp).
    assert got == [{"id": 1, "text": "a", "when": "2020-01-01", "new": None},
                   {"id": 2, "text": None, "when": None, "new": None},
                   {"id": 3, "text": "c", "when": None, "new": 5}]
    assert JsonlReader(ds, columns=["id"]).take(0, np.array([1201, 0])).to_pylist() == [{"id": 3}, {"id": 1}]


def test_blank_lines_are_skipped_and_errors_keep_physical_line_numbers(tmp_path):
    path = tmp_path / "a.jsonl"
    text = '{"id": 0}\n\n  \t\n{"id": 1}\r\n\n{"id": 2}\n{"id": 3}\n\n\n'
    path.write_text(text)
    ds = Dataset.from_path("x", str(path))
    assert ds.total() == 4
    assert ds.open_reader().take(0, np.array([2, 1, 3, 0])).column("id").to_pylist() == [2, 1, 3, 0]
    path.write_text(text.replace('{"id": 3}', '{"id": 3,}'))
    with pytest.raises(DatasetFormatError, match=rf"^{path}:7: not valid JSON \(.*: column 10\)\. Fix or remove the line, or pass on_bad_record='skip'"):
        Dataset.from_path("x", str(path))


def test_a_malformed_line_names_file_and_line(tmp_path):
    lines = lines_of(rows_of(1050)).splitlines(keepends=True)
    lines[1036] = '{"id": 1036, "text": "unterminated\n'  # after the schema sample: found on read
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(lines))
    reader = Dataset.from_path("x", str(path)).open_reader()
    assert len(reader.take(0, np.arange(1000, 1036))) == 36  # rows before the bad line are fine
    with pytest.raises(DatasetFormatError, match=rf"{path}:1037: not valid JSON .*Fix or remove the line") as e:
        reader.take(0, np.arange(1030, 1040))
    assert isinstance(e.value.__cause__, json.JSONDecodeError)


@pytest.mark.parametrize("bad, kind", [("null", "null"), ("[1, 2]", "array"), ('"text"', "string"), ("7", "number")])
def test_a_line_that_is_not_an_object_names_the_line(tmp_path, bad, kind):
    lines = lines_of(rows_of(1020)).splitlines(keepends=True)
    lines[1004] = bad + "\n"
    path = tmp_path / "a.jsonl"
    path.write_text("".join(lines))
    reader = Dataset.from_path("x", str(path)).open_reader()
    # First row of the batch: pyarrow would crash the process on a leading `null`.
    for rows in (np.arange(1004, 1008), np.arange(1000, 1008), np.array([1006, 1004])):
        with pytest.raises(DatasetFormatError, match=rf"{path}:1005: is a JSON {kind}, not an object"):
            reader.take(0, rows)
    # In the schema sample, discovery itself fails the same way.
    path.write_text("".join(lines[1000:]))
    with pytest.raises(DatasetFormatError, match=rf"{path}:5: is a JSON {kind}, not an object"):
        Dataset.from_path("x", str(path))


def test_a_bad_line_in_the_schema_sample_fails_discovery(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"id": 1}\n{"id": 2\n')
    with pytest.raises(DatasetFormatError, match=rf"{path}:2: not valid JSON"):
        Dataset.from_path("x", str(path))


def test_two_values_on_one_line_name_the_line(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"id": 1}\n{"id": 2} {"id": 3}\n{"id": 4}\n')
    with pytest.raises(DatasetFormatError, match=rf"{path}:2: not valid JSON \(Extra data"):
        Dataset.from_path("x", str(path))  # in the schema sample
    path.write_text(lines_of(rows_of(1001)) + '{"id": 2} {"id": 3}\n')
    reader = Dataset.from_path("x", str(path)).open_reader()
    with pytest.raises(DatasetFormatError, match=rf"{path}:1002: not valid JSON \(Extra data"):
        reader.take(0, np.arange(995, 1002))


def test_a_type_change_after_the_schema_sample_fails_discovery_naming_the_line(tmp_path):
    rows = rows_of(1100)
    rows[1050]["id"] = "not a number"
    path = tmp_path / "a.jsonl"
    path.write_text(lines_of(rows))
    with pytest.raises(DatasetFormatError, match=rf"^{path}:1051: field 'id' is a string here but a number on line 1\. "
                                                 "A field must have one JSON type on every line"):
        Dataset.from_path("x", str(path))


def test_a_file_changed_after_discovery_is_detected(jl_dir):
    ds = Dataset.from_path("chat", str(jl_dir))
    time.sleep(0.01)
    (jl_dir / "a.jsonl").write_text(lines_of(rows_of(10)))
    with pytest.raises(DatasetFormatError, match=r"a\.jsonl: changed since the dataset was discovered"):
        ds.open_reader().take(0, np.array([0]))


def test_a_truncated_gzip_file_is_named(tmp_path):
    blob = gzip.compress(lines_of(rows_of(500)).encode())
    (tmp_path / "a.jsonl.gz").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(DatasetFormatError, match=r"a\.jsonl\.gz: cannot read as gzip JSON Lines.*truncated or corrupt"):
        Dataset.from_path("x", str(tmp_path))


def test_line_index_handles_lines_across_scan_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr("zephon_columnar.io.jsonl.index._SCAN_BLOCK", 64)  # many lines straddle block boundaries
    rows = rows_of(300)
    text = lines_of(rows).replace('{"id": 7,', '\n \n{"id": 7,')
    (tmp_path / "a.jsonl").write_text(text)
    ds = Dataset.from_path("x", str(tmp_path))
    assert ds.total() == 300
    assert ds.open_reader().take(0, np.arange(300)).to_pylist() == rows
    index = jsonl.INDEX_CACHE.get(next(iter(jsonl.INDEX_CACHE._mem)), None)
    assert index.line_no(6) == 7 and index.line_no(7) == 10


def test_column_projection_parses_only_those_fields(jl_dir):
    ds = Dataset.from_path("chat", str(jl_dir))
    got = JsonlReader(ds, columns=["meta", "id"]).take(1, np.array([2, 0]))
    assert got.column_names == ["meta", "id"]
    assert got.to_pylist() == [{"meta": {"k": 1502 % 4}, "id": 1502}, {"meta": {"k": 0}, "id": 1500}]


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_invalid_utf8_names_file_and_line(tmp_path, suffix):
    bad = b'{"text": "ok\xff"}\n'
    head = lines_of(rows_of(1002)).encode()
    path = tmp_path / f"a{suffix}"

    def write(data: bytes) -> None:
        path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)

    # After the schema sample: the reader names the line; the rows before it read fine.
    write(head + bad + lines_of(rows_of(5, 1002)).encode())
    reader = Dataset.from_path("x", str(path)).open_reader()
    assert reader.take(0, np.arange(990, 1002)).column("id").to_pylist() == list(range(990, 1002))
    for rows in (np.arange(995, 1006), np.array([1004, 1002, 3])):
        with pytest.raises(DatasetFormatError, match=rf"^{path}:1003: not UTF-8 "
                                                     r"\(byte 0xff at byte 13 of the line.*re-encode") as e:
            reader.take(0, rows)
        assert isinstance(e.value.__cause__, UnicodeDecodeError)
    # In the schema sample: discovery itself fails the same way.
    write(b'{"text": "fine"}\n' + bad)
    with pytest.raises(DatasetFormatError, match=rf"^{path}:2: field 'text' is not valid UTF-8"):
        Dataset.from_path("x", str(path))


def test_invalid_utf8_inside_a_list_is_found_whatever_the_projection(tmp_path):
    lines = lines_of(rows_of(1010)).encode().splitlines(keepends=True)
    lines[1003] = b'{"id": 1003, "other": "\xfe not projected"}\n'
    lines[1006] = b'{"id": 1006, "tags": ["a", "b\xc3"]}\n'  # a truncated 2-byte sequence
    path = tmp_path / "a.jsonl"
    path.write_bytes(b"".join(lines))
    ds = Dataset.from_path("x", str(path))
    reader = JsonlReader(ds, columns=["id", "tags"])
    assert reader.take(0, np.arange(1004, 1006)).column("id").to_pylist() == [1004, 1005]
    with pytest.raises(DatasetFormatError, match=rf"^{path}:1007: not UTF-8 \(byte 0xc3"):
        reader.take(0, np.arange(1004, 1010))
    # A line is a row or not whatever the columns read (as under on_bad_record="skip", where it
    # is left out): the bad bytes of 'other' fail a projection without it too.
    for columns in (["id", "tags"], None):
        with pytest.raises(DatasetFormatError, match=rf"^{path}:1004: not UTF-8 \(byte 0xfe"):
            JsonlReader(ds, columns=columns).take(0, np.arange(1000, 1006))
    assert "other" not in ds.schema.names  # a field seen only on a bad line is no column


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_an_unreadable_file_is_a_permission_error_naming_it_not_a_corrupt_one(tmp_path, deny_read, suffix):
    data = lines_of(rows_of(20)).encode()
    paths = {}
    for name in ("seen", "unseen"):
        (tmp_path / name).mkdir()
        paths[name] = tmp_path / name / f"a{suffix}"
        paths[name].write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    ds = Dataset.from_path("x", str(tmp_path / "seen"))  # indexed while readable
    for path in paths.values():
        deny_read(path)
    jsonl.INDEX_CACHE.clear_memory()  # rediscovery below finds the index on disk, then samples the file
    actions = [
        (paths["seen"], lambda: ds.open_reader().take(0, np.array([1]))),
        (paths["seen"], lambda: Dataset.from_path("x", str(tmp_path / "seen"))),
        (paths["unseen"], lambda: Dataset.from_path("x", str(tmp_path / "unseen"))),  # no index yet
    ]
    for path, action in actions:
        with pytest.raises(PermissionError, match=rf"^{re.escape(str(path))}: cannot be read \(Permission denied\)\. "
                                                  "Give this process read permission") as e:
            action()
        assert not isinstance(e.value, ValueError)  # not "truncated or corrupt"
        assert isinstance(e.value.__cause__, PermissionError)


# ---------------------------------------------------------------- issue 25: the schema of every line
SUFFIXES = [".jsonl", ".jsonl.gz", ".jsonl.zst"]


def write_shard(path, rows: list[dict]) -> None:
    """``rows`` as JSON Lines (json.dumps), compressed as the suffix of ``path`` says."""
    data = lines_of(rows).encode()
    if path.name.endswith(".gz"):
        data = gzip.compress(data)
    elif path.name.endswith(".zst"):
        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)


def payloads_through_a_pipeline(path) -> list[dict]:
    """Every row of the dataset at ``path``, read by a Pipeline (one pass), in id order."""
    ds = Dataset.from_path("late", str(path))
    ws = StaticMixtureWorkSource([ds], {"late": 1.0}, chunk_size=64)
    return sorted((as_python(record.payload) for record in Pipeline(ws)), key=lambda payload: payload["id"])


def as_python(payload: dict) -> dict:
    """A payload with its numpy arrays (lists of numbers) as lists, to compare with plain rows."""
    return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in payload.items()}


def late_field_rows(n: int, first_late: int) -> list[dict]:
    """Rows whose fields 'late', 'late_list' and 'meta.late_k' appear from row ``first_late`` on."""
    rows = []
    for i in range(n):
        row = {"id": i, "text": f"row {i}", "meta": {"k": i % 7}}
        if i >= first_late:
            row["late"] = f"late {i}"
            row["late_list"] = [i, i + 1]
            row["meta"]["late_k"] = 2 * i
        rows.append(row)
    return rows


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_a_field_that_first_appears_after_line_1000_arrives_in_every_row(tmp_path, suffix):
    path = tmp_path / f"a{suffix}"
    write_shard(path, late_field_rows(1500, first_late=1200))
    got = payloads_through_a_pipeline(path)
    expected = [{"id": i, "text": f"row {i}",
                 "meta": {"k": i % 7, "late_k": 2 * i if i >= 1200 else None},
                 "late": f"late {i}" if i >= 1200 else None,
                 "late_list": [i, i + 1] if i >= 1200 else None} for i in range(1500)]
    assert got == expected


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_a_field_whose_type_changes_mid_shard_from_int_to_float_is_a_float_in_every_row(tmp_path, suffix):
    path = tmp_path / f"a{suffix}"
    write_shard(path, [{"id": i, "score": i if i < 1100 else i + 0.5} for i in range(1400)])
    got = payloads_through_a_pipeline(path)
    assert [row["score"] for row in got] == [float(i) if i < 1100 else i + 0.5 for i in range(1400)]
    assert all(type(row["score"]) is float for row in got)


@pytest.mark.parametrize("suffix", SUFFIXES)
@pytest.mark.parametrize("field, late_value, named, kind, earlier", [
    ("label", "one", "label", "a string", "a number"),
    ("meta", {"k": {"deep": 1}}, "meta.k", "an object", "a number"),
    ("tags", ["a", 5], "tags[]", "a number", "a string"),
])
def test_a_field_whose_type_changes_mid_shard_to_a_conflicting_type_fails_discovery_naming_file_line_and_field(
        tmp_path, suffix, field, late_value, named, kind, earlier):
    rows = [{"id": i, "label": i, "meta": {"k": i}, "tags": ["a"]} for i in range(1400)]
    rows[1300][field] = late_value
    path = tmp_path / f"a{suffix}"
    write_shard(path, rows)
    with pytest.raises(DatasetFormatError, match=rf"^{re.escape(str(path))}:1301: field {re.escape(repr(named))} is "
                                                 rf"{kind} here but {earlier} on line 1\. A field must have one JSON "
                                                 r"type on every line .*fix or remove the line\.$"):
        Dataset.from_path("x", str(path))


def test_a_type_conflict_between_scan_blocks_names_the_line(tmp_path, monkeypatch):
    monkeypatch.setattr("zephon_columnar.io.jsonl.index._SCAN_BLOCK", 4096)  # the file is parsed in many blocks
    rows = [{"id": i, "label": i} for i in range(3000)]
    rows[2500]["label"] = {"an": "object"}
    path = tmp_path / "a.jsonl"
    write_shard(path, rows)
    with pytest.raises(DatasetFormatError, match=rf"^{re.escape(str(path))}:2501: field 'label' is an object here "
                                                 r"but a number on an earlier line\."):
        Dataset.from_path("x", str(path))


def test_a_field_that_appears_only_in_a_later_shard_arrives_and_a_conflicting_one_names_that_shard(tmp_path):
    write_shard(tmp_path / "a.jsonl", [{"id": i, "text": f"a{i}"} for i in range(50)])
    write_shard(tmp_path / "b.jsonl.zst", [{"id": i, "text": f"b{i}", "extra": [i]} for i in range(50, 80)])
    got = payloads_through_a_pipeline(tmp_path)
    assert got == ([{"id": i, "text": f"a{i}", "extra": None} for i in range(50)]
                   + [{"id": i, "text": f"b{i}", "extra": [i]} for i in range(50, 80)])
    write_shard(tmp_path / "c.jsonl.gz", [{"id": 80, "text": "c"}, {"id": 81, "text": "c", "extra": "text"}])
    with pytest.raises(DatasetFormatError, match=rf"^{re.escape(str(tmp_path / 'c.jsonl.gz'))}:2: field 'extra' is a "
                                                 r"string here but an array in the dataset's files before this one\."):
        Dataset.from_path("x", str(tmp_path))


def test_the_schema_of_every_line_is_cached_with_the_line_index(tmp_path):
    path = tmp_path / "a.jsonl.gz"
    write_shard(path, late_field_rows(1300, first_late=1250))
    schema = Dataset.from_path("x", str(path)).schema
    assert schema.names == ["id", "text", "meta", "late", "late_list"]
    jsonl.INDEX_CACHE.clear_memory()  # as a fresh process would start
    before = jsonl.INDEX_CACHE.scans
    ds = Dataset.from_path("x", str(path))
    assert jsonl.INDEX_CACHE.scans == before and ds.schema == schema
    assert ds.open_reader().take(0, np.array([1299, 0])).column("late").to_pylist() == ["late 1299", None]


def test_a_field_that_first_appears_after_a_malformed_line_still_arrives_and_the_line_is_named_on_read(tmp_path):
    rows = late_field_rows(1500, first_late=1400)
    lines = lines_of(rows).splitlines(keepends=True)
    lines[1300] = '{"id": 1300, "text": "unterminated\n'  # past the strict sample: reported on read
    path = tmp_path / "a.jsonl"
    path.write_text("".join(lines))
    ds = Dataset.from_path("x", str(path))
    assert ds.schema.names == ["id", "text", "meta", "late", "late_list"]
    reader = ds.open_reader()
    assert reader.take(0, np.array([1499, 1299])).to_pylist() == [
        {"id": 1499, "text": "row 1499", "meta": {"k": 1499 % 7, "late_k": 2998}, "late": "late 1499",
         "late_list": [1499, 1500]},
        {"id": 1299, "text": "row 1299", "meta": {"k": 1299 % 7, "late_k": None}, "late": None, "late_list": None}]
    with pytest.raises(DatasetFormatError, match=rf"^{re.escape(str(path))}:1301: not valid JSON"):
        reader.take(0, np.arange(1295, 1305))
