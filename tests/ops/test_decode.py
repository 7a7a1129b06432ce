"""DecodeTextOp: bytes to text with Python's semantics, vectorized; newline and case
normalization on bytes and string columns alike; strict errors name the field and sample."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.ops._tokenizers import make_tokenizer, reference_ids, text_frame
from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar import frame as F
from zephon_columnar.errors import ConfigError
from zephon_columnar.ops.decode import DecodeTextOp


def frame(values, typ=None, name="text", **extra) -> pa.Table:
    typ = typ or pa.binary()
    book = F.bookkeeping_of(text_frame([""] * len(values)))
    return F.with_payload(book, pa.table({name: pa.array(values, typ), **extra}))


def texts(out: pa.Table, name: str = "text") -> list:
    return out.column(name).to_pylist()


def test_binary_utf8_to_string_with_normalization():
    raw = ["héllo\r\nwörld", "a\rb\r\r\nc", None, "", "plain"]
    out = DecodeTextOp().process_frame(frame([None if s is None else s.encode() for s in raw], id=list(range(5))))
    assert out.schema.field("text").type == pa.string()
    assert texts(out) == ["héllo\nwörld", "a\nb\n\nc", None, "", "plain"]
    assert texts(out, "id") == list(range(5)) and out.column(F.ROW).to_pylist() == list(range(5))
    kept = DecodeTextOp(normalize_newlines=False).process_frame(frame([b"a\r\nb"]))
    assert texts(kept) == ["a\r\nb"]


def test_large_binary_becomes_large_string():
    out = DecodeTextOp().process_frame(frame([b"x"], pa.large_binary()))
    assert out.schema.field("text").type == pa.large_string() and texts(out) == ["x"]


def test_bad_utf8_strict_names_field_and_sample():
    with pytest.raises(ValueError, match=r"field 'text' of sample \(dataset 0, shard 1, row 1\).*byte 2.*errors='replace'"):
        DecodeTextOp().process_frame(frame([b"ok", b"ab\xff\xfecd"]))


@pytest.mark.parametrize("errors", ["replace", "ignore", "backslashreplace"])
def test_bad_utf8_replace_and_ignore_are_pythons(errors):
    raw = [b"ok", b"ab\xff\xfecd", None, b"\xc3\xa9\xc3"]
    out = DecodeTextOp(errors=errors).process_frame(frame(raw))
    assert texts(out) == [None if v is None else v.decode("utf-8", errors) for v in raw]


def test_other_encodings():
    raw = ["café\r\n", "naïve"]
    out = DecodeTextOp(encoding="latin-1").process_frame(frame([s.encode("latin-1") for s in raw]))
    assert texts(out) == ["café\n", "naïve"]
    with pytest.raises(ValueError, match="not valid ascii"):
        DecodeTextOp(encoding="ascii").process_frame(frame([b"caf\xe9"]))


def test_lowercase_and_string_columns_pass_through_the_same_normalization():
    op = DecodeTextOp(fields=("text", "title"), lowercase=True)
    f = frame(["ÀB\r\nC", None], pa.string(), title=pa.array([b"T\rI", b"X"]), n=[1, 2])
    out = op.process_frame(f)
    assert texts(out) == ["àb\nc", None] and texts(out, "title") == ["t\ni", "x"] and texts(out, "n") == [1, 2]


def test_absent_and_non_text_fields_are_left_alone():
    f = frame([b"x"], name="body", n=[7])
    out = DecodeTextOp(fields=("text", "n")).process_frame(f)
    assert out.equals(f)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.one_of(st.none(), st.binary(max_size=30), st.text(max_size=30).map(str.encode)), max_size=10))
def test_matches_python_decode_replace(values):
    out = DecodeTextOp(errors="replace", normalize_newlines=True).process_frame(frame(values))
    want = [None if v is None else v.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
            for v in values]
    assert texts(out) == want


def test_bad_options():
    with pytest.raises(ConfigError, match="encoding"):
        DecodeTextOp(encoding="utf-99")
    with pytest.raises(ConfigError, match="errors"):
        DecodeTextOp(errors="skip")
    with pytest.raises(ConfigError, match="fields"):
        DecodeTextOp(fields=())
    assert DecodeTextOp(fields="body").fields == ("body",)
    assert DecodeTextOp(encoding="UTF8").fingerprint()["encoding"] == "utf-8"


def test_decode_then_tokenize_in_a_pipeline():
    docs = ["Hello\r\nWorld", "second doc", "THIRD"]
    ds = Dataset.from_tables("raw", [pa.table({"text": pa.array([d.encode() for d in docs], pa.binary())})])
    ws = StaticMixtureWorkSource([ds], {"raw": 1.0}, chunk_size=2, seed=0, shuffle_shards=False)
    tok = make_tokenizer()
    pipe = (Pipeline(ws).decode_text(lowercase=True).tokenize(tok, field="text", special_tokens="none")
            .batch(3, drop_last=False))
    rows = [r for b in pipe for r in b.to_pydict()["input_ids"]]
    expected = reference_ids(tok, [d.replace("\r\n", "\n").lower() for d in docs])
    assert sorted(rows) == sorted(expected)
