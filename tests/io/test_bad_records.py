"""``on_bad_record``: JSON Lines lines that cannot be read raise (naming the line) or are left
out of the dataset's rows, counted, warned once per pass, and the same rows on every pass,
runner and resume."""

from __future__ import annotations

import gzip
import json
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon_columnar import Pipeline, StaticMixtureWorkSource
from zephon_columnar.errors import ConfigError, DatasetFormatError, SkippedRecordWarning
from zephon_columnar.io import Dataset, jsonl
from zephon_columnar.testing import assert_resumes_exactly, collect

# Bad lines by kind: (row number in the file, bytes of the line, the reason's words).
BAD = {
    3: (b'{"id": 3, "text": "unterminated\n', "not valid JSON"),
    7: (b"[7, 8]\n", "a JSON array, not an object"),
    9: (b'{"id": 9, "text": "caf\xe9"}\n', "not UTF-8 (byte 0xe9"),
    11: (b'{"id": 11, "text": NaN}\n', "not valid JSON (NaN is not JSON)"),
    13: (b'{"id": 13} {"id": 14}\n', "not valid JSON (Extra data"),
    1500: (b"null\n", "a JSON null, not an object"),  # past the first 1,000 rows discovery checks
}


def write_messy(path, rows: int, bad=BAD, opener=open, first_id: int = 0) -> list[int]:
    """A JSON Lines file of ``rows`` lines (ids from ``first_id``), those whose line number is in
    ``bad`` damaged; the ids of the good ones."""
    good = []
    with opener(path, "wb") as f:
        for i in range(rows):
            if i in bad:
                f.write(bad[i][0])
            else:
                f.write((json.dumps({"id": first_id + i, "text": f"row {i}"}) + "\n").encode())
                good.append(first_id + i)
    return good


@pytest.fixture()
def messy(tmp_path):
    d = tmp_path / "messy"
    d.mkdir()
    good = write_messy(d / "part-000.jsonl", 1600)
    good += write_messy(d / "part-001.jsonl.gz", 40, bad={5: (b"{oops}\n", "")}, opener=gzip.open, first_id=2000)
    return d, good


def ids(rows: list) -> list[int]:
    return [int(r.payload["id"]) for r in rows]


def test_skip_leaves_every_bad_line_out_and_keeps_the_others_in_order(messy):
    d, good = messy
    ds = Dataset.from_path("messy", str(d), on_bad_record="skip")
    assert ds.total() == len(good) == 1600 - len(BAD) + 39
    read = [ds.open_reader().take(s, np.arange(ds.shard(s).num_rows)).column("id").to_pylist() for s in (0, 1)]
    assert read[0] == [i for i in good if i < 2000]
    assert read[1] == [2000 + i for i in range(40) if i != 5]
    skipped = ds.skipped_records()
    assert skipped.count == len(BAD) + 1
    # The first locations, each naming the file, the physical line and why.
    first = d / "part-000.jsonl"
    assert len(skipped.first) == 5
    for where, (row, (_, why)) in zip(skipped.first, sorted(BAD.items())):
        assert where.startswith(f"{first}:{row + 1}: {why}"), where


def test_raise_names_the_line_and_says_skip_is_there(tmp_path):
    path = tmp_path / "late.jsonl"
    write_messy(path, 1600, bad={1500: BAD[1500]})
    ds = Dataset.from_path("late", str(path))  # past the sample discovery checks: read time
    with pytest.raises(DatasetFormatError, match=rf"{path}:1501: is a JSON null.*on_bad_record='skip'"):
        ds.open_reader().take(0, np.arange(1490, 1510))
    early = tmp_path / "early.jsonl"
    write_messy(early, 20, bad={3: BAD[3]})
    with pytest.raises(DatasetFormatError, match=rf"{early}:4: not valid JSON.*on_bad_record='skip'"):
        Dataset.from_path("early", str(early))


def test_invalid_utf8_in_a_block_pyarrow_parses_is_found_at_indexing(tmp_path):
    # pyarrow copies string bytes as they are, so this block parses; the index must still see it.
    path = tmp_path / "latin1.jsonl"
    write_messy(path, 50, bad={40: BAD[9]})
    ds = Dataset.from_path("latin1", str(path), on_bad_record="skip")
    assert ds.total() == 49
    (where,) = ds.skipped_records().first
    assert where.startswith(f"{path}:41: not UTF-8 (byte 0xe9 at byte 23 of the line")


def test_the_cached_index_keeps_the_bad_lines(messy):
    d, _ = messy
    first = Dataset.from_path("messy", str(d), on_bad_record="skip")
    jsonl.INDEX_CACHE.clear_memory()
    scans = jsonl.INDEX_CACHE.scans
    again = Dataset.from_path("messy", str(d), on_bad_record="skip")  # from the disk cache
    assert jsonl.INDEX_CACHE.scans == scans
    assert again.total() == first.total() and again.skipped_records() == first.skipped_records()
    # The same cached index serves "raise": the bad lines are rows there, and fail.
    with pytest.raises(DatasetFormatError, match=r"part-001.jsonl.gz:6: not valid JSON"):
        Dataset.from_path("strict", str(d / "part-001.jsonl.gz"))


def test_skip_is_refused_where_records_are_not_read_one_by_one(tmp_path):
    pq.write_table(pa.table({"id": [1, 2]}), tmp_path / "a.parquet")
    with pytest.raises(ConfigError, match=r"Dataset 'pq': on_bad_record='skip' is for JSON Lines.*parquet"):
        Dataset.from_path("pq", str(tmp_path), on_bad_record="skip")
    with pytest.raises(ConfigError, match=r"did you mean 'skip'"):
        Dataset.from_path("pq", str(tmp_path), on_bad_record="skipped")


def make_pipeline(d, *, lanes: int = 1) -> Pipeline:
    ds = Dataset.from_path("messy", str(d), on_bad_record="skip")
    clean = Dataset.from_tables("clean", [pa.table({"id": list(range(5000, 5100)), "text": ["c"] * 100})])
    ws = StaticMixtureWorkSource([ds, clean], {"messy": 0.8, "clean": 0.2}, chunk_size=64, seed=5)
    return Pipeline(ws).shuffle(buffer_size=50, seed=1).options(canonical_replicas=lanes)


def test_a_pass_warns_once_with_the_first_lines_and_reads_every_good_row(messy):
    d, good = messy
    p = make_pipeline(d)
    for _ in range(2):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            got = ids(list(p))
        said = [w for w in seen if issubclass(w.category, SkippedRecordWarning)]
        assert len(said) == 1, [str(w.message) for w in seen]
        assert said[0].filename == __file__  # pointing at the loop
        assert "left out 7 bad records" in str(said[0].message) and "part-000.jsonl:4: not valid JSON" in str(
            said[0].message
        )
        assert sorted(i for i in got if i < 5000) == sorted(good)
    assert "(7 bad records left out, on_bad_record='skip')" in p.explain()


def test_skipping_resumes_exactly(messy):
    d, _ = messy
    assert_resumes_exactly(lambda: make_pipeline(d, lanes=2), ks=[0, 5, 700], again=(1,))


def test_a_loader_with_workers_warns_once_in_the_trainer(messy):
    torch = pytest.importorskip("torch")
    d, good = messy
    loader = make_pipeline(d, lanes=2).to_torch_loader(num_workers=2, raw_batches=True)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = [int(r.payload["id"]) for item in loader for r in (item if isinstance(item, list) else [item])]
    said = [w for w in seen if issubclass(w.category, SkippedRecordWarning)]
    assert len(said) == 1, [str(w.message) for w in seen]
    assert sorted(i for i in got if i < 5000) == sorted(good)
    del torch


def test_the_rows_do_not_depend_on_the_policy_when_nothing_is_bad(tmp_path):
    path = tmp_path / "clean.jsonl"
    write_messy(path, 30, bad={})
    a, b = (
        collect(Pipeline(StaticMixtureWorkSource([Dataset.from_path("c", str(path), on_bad_record=p)], {"c": 1.0})))
        for p in ("raise", "skip")
    )
    assert a == b and len(a) == 30
