"""TokenizeOp: ids equal the tokenizer's plus the chosen specials; truncation, padding and
splitting keep their length rules; errors name what to set; one tokenizer build per worker;
determinism and exact resume through the pipeline."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.ops._tokenizers import (
    CallableTokenizer,
    FakeFastTokenizer,
    count_builds,
    make_texts,
    make_tokenizer,
    reference_ids,
    save_folder,
    text_frame,
)
from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar import frame as F
from zephon_columnar.errors import ConfigError
from zephon_columnar.ops.tokenize.load import forget_tokenizers
from zephon_columnar.ops.base import OpContext
from zephon_columnar.ops.tokenize.op import TokenizeOp
from zephon_columnar.testing import assert_resumes_exactly, collect
from zephon_columnar.validation import ValidationError

TEXTS = make_texts(30, seed=11)
BOS, EOS, PAD = 0, 1, 2
SPLICE = {"bos_eos": ([BOS], [EOS]), "bos": ([BOS], []), "eos": ([], [EOS]), "none": ([], [])}


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


@pytest.fixture(scope="module")
def folder(tmp_path_factory, tok):
    return save_folder(tmp_path_factory.mktemp("tokdir"), tok,
                       config={"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"})


def ids(out: pa.Table, name: str = "input_ids") -> list[list[int]]:
    return out.column(name).to_pylist()


def run(op: TokenizeOp, texts=TEXTS, **kw) -> pa.Table:
    return op.process_frame(text_frame(texts, **kw))


@pytest.mark.parametrize("mode", ["bos_eos", "bos", "eos", "none"])
@pytest.mark.parametrize("form", ["object", "folder", "file", "hf-fast", "callable"])
def test_ids_are_the_tokenizers_plus_the_chosen_specials(tok, folder, mode, form):
    arg = {"object": dict(tokenizer=tok), "folder": dict(tokenizer_id=str(folder)),
           "file": dict(tokenizer_id=str(folder / "tokenizer.json")),
           "hf-fast": dict(tokenizer=FakeFastTokenizer(make_tokenizer())),
           "callable": dict(tokenizer=CallableTokenizer(make_tokenizer()))}[form]
    out = run(TokenizeOp(**arg, field="text", special_tokens=mode))
    pre, post = SPLICE[mode]
    assert ids(out) == [pre + r + post for r in reference_ids(tok, TEXTS)]
    assert ids(out, "attention_mask") == [[1] * len(r) for r in ids(out)]
    assert out.schema.field("input_ids").type == pa.list_(pa.int32())
    assert out.schema.field("attention_mask").type == pa.list_(pa.int8())
    assert F.payload_names(out) == ["input_ids", "attention_mask"]  # upstream payload dropped
    assert out.column(F.ROW).to_pylist() == list(range(len(TEXTS)))


def test_tokenizer_default_uses_the_post_processor():
    templ = make_tokenizer(template=True)
    for arg in (templ, CallableTokenizer(make_tokenizer(template=True))):
        out = run(TokenizeOp(arg, field="text", special_tokens="tokenizer_default"))
        expected = reference_ids(templ, TEXTS, add_special_tokens=True)
        assert ids(out) == expected and expected[1][0] == BOS and expected[1][-1] == EOS


def test_explicit_ids_override_the_tokenizer(tok):
    out = run(TokenizeOp(tok, field="text", bos_token_id=5, eos_token_id=6))
    assert ids(out) == [[5] + r + [6] for r in reference_ids(tok, TEXTS)]


def test_missing_bos_names_the_option(tmp_path):
    bare = make_tokenizer(("<unk>",))  # no special token a heuristic recognises
    with pytest.raises(ConfigError, match=r"BOS.*bos_token_id=.*'none'"):
        TokenizeOp(bare, field="text")  # an object: at construction
    with pytest.raises(ConfigError, match=r"EOS.*eos_token_id="):
        TokenizeOp(bare, field="text", special_tokens="eos")
    assert ids(run(TokenizeOp(bare, field="text", special_tokens="none"))) == reference_ids(bare, TEXTS)
    assert ids(run(TokenizeOp(bare, field="text", bos_token_id=3, eos_token_id=4)))[0] == [3, 4]
    # a path: at preflight, in worker setup, or on the first frame
    path = save_folder(tmp_path / "bare", bare, config={"bos_token": None, "eos_token": "<unk>"})
    op = TokenizeOp(tokenizer_id=str(path), field="text")
    with pytest.raises(ConfigError, match=r"tokenizer_config.json sets bos_token to null.*bos_token_id="):
        op.clone().preflight()
    with pytest.raises(ConfigError, match="bos_token_id="):
        op.clone().process_frame(text_frame(TEXTS))
    report = Pipeline(_source(["a"])).tokenize(tokenizer_id=str(path), field="text").preflight_tokenizers(strict=False)
    assert [i.code for i in report.errors] == ["TOKENIZER_PREFLIGHT_FAILED"] and "bos_token_id=" in report.format()
    with pytest.raises(ValidationError):
        Pipeline(_source(["a"])).tokenize(tokenizer_id=str(path), field="text").preflight_tokenizers()
    assert Pipeline(_source(["a"])).tokenize(tokenizer_id=str(path), field="text",
                                             special_tokens="eos").preflight_tokenizers().ok


@pytest.mark.parametrize("mode", ["bos_eos", "eos", "none"])
def test_truncation_cuts_content_then_adds_specials(tok, mode):
    out = run(TokenizeOp(tok, field="text", special_tokens=mode, max_length=9, truncation=True))
    pre, post = SPLICE[mode]
    room = 9 - len(pre) - len(post)
    assert ids(out) == [pre + r[:room] + post for r in reference_ids(tok, TEXTS)]
    assert max(map(len, ids(out))) == 9


def test_truncation_in_tokenizer_default_keeps_the_tokenizers_specials():
    templ = make_tokenizer(template=True)
    out = run(TokenizeOp(templ, field="text", special_tokens="tokenizer_default", max_length=6, truncation=True))
    assert all(len(r) <= 6 and r[0] == BOS and r[-1] == EOS for r in ids(out))
    assert ids(out)[5] == [BOS] + reference_ids(templ, TEXTS)[5][:4] + [EOS]


@pytest.mark.parametrize("padding", [True, "longest", "max_length"])
def test_padding_to_max_length(tok, padding):
    out = run(TokenizeOp(tok, field="text", max_length=12, truncation=True, padding=padding))
    ref = [[BOS] + r[:10] + [EOS] for r in reference_ids(tok, TEXTS)]
    assert all(len(r) == 12 for r in ids(out))
    assert ids(out) == [r + [PAD] * (12 - len(r)) for r in ref]
    assert ids(out, "attention_mask") == [[1] * len(r) + [0] * (12 - len(r)) for r in ref]


def test_padding_without_truncation_leaves_long_rows_long(tok):
    out = run(TokenizeOp(tok, field="text", max_length=12, padding="max_length"))
    ref = [[BOS] + r + [EOS] for r in reference_ids(tok, TEXTS)]
    assert [len(r) for r in ids(out)] == [max(12, len(r)) for r in ref]
    assert [sum(m) for m in ids(out, "attention_mask")] == [len(r) for r in ref]


def test_pad_id_falls_back_to_eos_and_else_fails():
    no_pad = make_tokenizer(("<s>", "</s>"))
    out = run(TokenizeOp(no_pad, field="text", max_length=40, padding="max_length"), texts=["", "x"])
    assert ids(out)[0] == [0, 1] + [1] * 38
    bare = make_tokenizer(("<unk>",))
    with pytest.raises(ConfigError, match="pad.*eos_token_id="):
        TokenizeOp(bare, field="text", special_tokens="none", max_length=8, padding="max_length")


@pytest.mark.parametrize("padding", [True, "longest"])
def test_padding_to_the_longest_leaves_rows_for_the_batch_to_pad(tok, padding):
    # Zephon pads to the longest row of a tokenizer call, which depends on how rows are grouped;
    # here the rows stay as they are and to_training pads each batch to its longest row.
    texts = ["a b c d e f", "a", "b c"]
    padded = run(TokenizeOp(tok, field="text", padding=padding), texts=texts)
    plain = run(TokenizeOp(tok, field="text"), texts=texts)
    assert ids(padded) == ids(plain) and len({len(r) for r in ids(padded)}) == 3


def test_option_errors(tok):
    with pytest.raises(ConfigError, match="needs max_length"):
        TokenizeOp(tok, field="text", padding="max_length")
    with pytest.raises(ConfigError, match="truncation=True needs max_length"):
        TokenizeOp(tok, field="text", truncation=True)
    with pytest.raises(ConfigError, match="pick one"):
        TokenizeOp(tok, field="text", max_length=8, truncation=True, split_long_samples=True)
    with pytest.raises(ConfigError, match="split_long_samples=True needs max_length"):
        TokenizeOp(tok, field="text", split_long_samples=True)
    with pytest.raises(ConfigError, match="no room"):
        TokenizeOp(tok, field="text", max_length=2, truncation=True)
    with pytest.raises(ConfigError, match="special_tokens="):
        TokenizeOp(tok, field="text", special_tokens="both")
    with pytest.raises(ConfigError, match="never downloads"):
        TokenizeOp(tokenizer_id="gpt2", field="text")
    TokenizeOp(tok, field="text", return_tensors="pt", use_fast=False)  # accepted, no-op


@settings(max_examples=40, deadline=None)
@given(texts=st.lists(st.text(max_size=80), min_size=0, max_size=8), max_length=st.integers(1, 12),
       mode=st.sampled_from(["bos_eos", "bos", "eos", "none"]), pad=st.booleans())
@example(texts=["00", ""], max_length=1, mode="none", pad=True)  # an empty piece right after a cut
def test_split_pieces_reassemble_and_obey_the_rules(tok, texts, max_length, mode, pad):
    op = TokenizeOp(tok, field="text", special_tokens=mode, max_length=max_length, split_long_samples=True,
                    padding="max_length" if pad else False, preserve_upstream_payload=True)
    frame = text_frame(texts, extra={"doc": pa.array(range(len(texts)), pa.int64())})
    out = op.process_frame(frame)
    pieces, masks = ids(out), ids(out, "attention_mask")
    if pad:
        assert all(len(p) == max_length for p in pieces)
        real = [sum(m) for m in masks]
        assert masks == [[1] * r + [0] * (max_length - r) for r in real]
        assert all(set(p[r:]) <= {PAD} for p, r in zip(pieces, real))
        pieces = [p[:r] for p, r in zip(pieces, real)]
    parents = out.column(F.ROW).to_pylist()
    assert parents == sorted(parents) and out.column("doc").to_pylist() == parents
    assert out.column("text").to_pylist() == [texts[i] for i in parents]
    pre, post = SPLICE[mode]
    for i, doc in enumerate(reference_ids(tok, texts)):
        mine = [p for p, parent in zip(pieces, parents) if parent == i]
        full = pre + doc + post
        # consecutive cuts of BOS + content + EOS: BOS only in the first, EOS only in the last
        assert mine == ([full[k:k + max_length] for k in range(0, len(full), max_length)] or [[]])
        assert sum(mine, []) == full and all(len(p) <= max_length for p in mine)
        assert mine[0][:len(pre)] == pre and (not post or mine[-1][-1:] == post)
    # Each piece of a cut document is its own child: distinct, ordered lineage; uncut ones keep ().
    lineage = F.lineage_paths(out)
    for i in set(parents):
        mine = [lin for lin, parent in zip(lineage, parents) if parent == i]
        assert mine == ([()] if len(mine) == 1 else [(k,) for k in range(len(mine))])


def test_split_lineage_does_not_depend_on_the_frame(tok):
    texts = ["a " * 30, "b", "c " * 12]
    op = TokenizeOp(tok, field="text", max_length=8, split_long_samples=True)
    whole = op.process_frame(text_frame(texts))
    alone = [op.process_frame(text_frame([t])) for t in texts]
    assert [p for f in alone for p in F.lineage_paths(f)] == F.lineage_paths(whole)
    assert F.lineage_paths(whole)[-1] != ()


def test_split_is_marked_as_fanning_out(tok):
    assert TokenizeOp(tok, field="text", max_length=4, split_long_samples=True).traits().emits == "any"
    assert TokenizeOp(tok, field="text").traits().emits == "at_most_one"


def test_missing_field_error_names_field_and_sample(tok):
    frame = text_frame(["a", "b"], field="body")
    with pytest.raises(KeyError, match=r"field 'text' is missing.*dataset 0, shard 1, row 0.*'body'"):
        TokenizeOp(tok, field="text").process_frame(frame)
    out = TokenizeOp(tok, field="text", missing_field="empty").process_frame(frame)
    assert ids(out) == [[BOS, EOS], [BOS, EOS]]


def test_null_value_error_names_the_row(tok):
    frame = text_frame(["a", "b", None, "d"])
    with pytest.raises(ValueError, match=r"field 'text' is null in sample \(dataset 0, shard 1, row 2\)"):
        TokenizeOp(tok, field="text").process_frame(frame)
    out = TokenizeOp(tok, field="text", missing_field="empty", special_tokens="none").process_frame(frame)
    assert ids(out)[2] == [] and ids(out)[3] == reference_ids(tok, ["d"])[0]


def test_bytes_field_points_to_decode_text(tok):
    frame = F.with_payload(F.bookkeeping_of(text_frame(["a"])), pa.table({"text": pa.array([b"a"], pa.binary())}))
    with pytest.raises(TypeError, match=r"decode_text\(fields=\('text',\)\)"):
        TokenizeOp(tok, field="text").process_frame(frame)


def test_preserve_upstream_payload(tok):
    extra = {"id": pa.array(range(len(TEXTS))), "input_ids": pa.array([[9]] * len(TEXTS))}
    out = run(TokenizeOp(tok, field="text", preserve_upstream_payload=True), extra=extra)
    assert F.payload_names(out) == ["text", "id", "input_ids", "attention_mask"]
    assert out.column("id").to_pylist() == list(range(len(TEXTS))) and out.column("text").to_pylist() == TEXTS
    assert ids(out)[0] == [BOS, EOS]  # ours replace an upstream input_ids
    out = run(TokenizeOp(tok, field="text", add_attention_mask=False), extra=extra)
    assert F.payload_names(out) == ["input_ids"]


def test_empty_frame_keeps_the_schema(tok):
    out = run(TokenizeOp(tok, field="text", max_length=4, split_long_samples=True), texts=[])
    assert out.num_rows == 0 and out.schema.field("input_ids").type == pa.list_(pa.int32())


def test_one_tokenizer_build_per_process_and_file(folder, monkeypatch):
    builds = count_builds(monkeypatch)
    op = TokenizeOp(tokenizer_id=str(folder), field="text")
    fingerprint = op.fingerprint()
    assert builds == []  # the driver hashes the files; it does not build the tokenizer
    worker = op.clone()
    worker.setup(OpContext())
    for i in range(5):
        worker.process_frame(text_frame(TEXTS[i:i + 4]))
    assert len(builds) == 1
    lazy = op.clone()  # without setup: on the first frame, sharing the copy already built
    for i in range(3):
        lazy.process_frame(text_frame(TEXTS[i:i + 4]))
    assert len(builds) == 1 and op.fingerprint() == fingerprint
    # through the engine: one build, however many worker copies and frames
    for runner, workers in (("inline", 1), ("threads", 2)):
        forget_tokenizers()
        builds.clear()
        pipe = (Pipeline(_source(TEXTS * 4, chunk_size=8)).fetch(max_batch=2)
                .tokenize(tokenizer_id=str(folder), field="text", parallelism=2)
                .batch(4, drop_last=False).options(runner=runner, max_workers=workers))
        assert len(collect(pipe)) == 30
        assert len(builds) == 1, runner
    # an object: workers rebuild from its JSON, once each
    builds.clear()
    obj = TokenizeOp(make_tokenizer(), field="text")
    w = obj.clone()
    w.setup(OpContext())
    w.process_frame(text_frame(TEXTS))
    w.process_frame(text_frame(TEXTS))
    assert len(builds) == 1


def test_fingerprint_describes_what_changes_the_data(tok, folder, tmp_path):
    base = TokenizeOp(tok, field="text").fingerprint()
    assert TokenizeOp(make_tokenizer(), field="text").fingerprint() == base  # same content, new object
    for kw in (dict(special_tokens="eos"), dict(max_length=8, truncation=True), dict(eos_token_id=7),
               dict(max_length=8, split_long_samples=True), dict(max_length=8, padding="max_length"),
               dict(add_attention_mask=False), dict(preserve_upstream_payload=True), dict(missing_field="empty")):
        assert TokenizeOp(tok, field="text", **kw).fingerprint() != base, kw
    assert TokenizeOp(make_tokenizer(("<s>", "</s>")), field="text").fingerprint() != base
    a = TokenizeOp(tokenizer_id=str(folder), field="text").fingerprint()
    other = save_folder(tmp_path / "other", tok, config={"eos_token": "<pad>"})
    assert TokenizeOp(tokenizer_id=str(other), field="text").fingerprint() != a


# ---------------------------------------------------------------------- through the pipeline
def _source(texts, *, chunk_size=6, seed=3, shards=3):
    per = -(-len(texts) // shards)
    tables = [pa.table({"id": list(range(s * per, min(len(texts), (s + 1) * per))),
                        "text": texts[s * per:(s + 1) * per]}) for s in range(shards)]
    ds = Dataset.from_tables("docs", [t for t in tables if t.num_rows])
    return StaticMixtureWorkSource([ds], {"docs": 1.0}, chunk_size=chunk_size, seed=seed, shuffle_within_shard=True)


DOCS = make_texts(48, seed=5)


def _build(*, split=False, runner="inline", tok_arg=None, **tok_kw):
    kw = dict(max_length=16, split_long_samples=True) if split else dict(max_length=24, truncation=True)
    kw.update(tok_kw)
    return (Pipeline(_source(DOCS)).fetch(max_batch=4)
            .tokenize(tok_arg if tok_arg is not None else make_tokenizer(), field="text",
                      preserve_upstream_payload=True, **kw)
            .batch(3, drop_last=False).options(runner=runner, max_workers=2))


@pytest.mark.parametrize("split", [False, True])
def test_resumes_exactly(split):
    full = assert_resumes_exactly(lambda: _build(split=split), ks=[0, 1, 4, 9, 15])
    rows = sum(len(b[2]) for b in full)
    assert (rows > len(DOCS)) == split


def test_split_children_are_distinguishable_records():
    pipe = (Pipeline(_source(DOCS)).fetch(max_batch=4)
            .tokenize(make_tokenizer(), field="text", max_length=16, split_long_samples=True))
    records = list(pipe)
    keys = [(r.meta.sample_id, r.meta.lineage) for r in records]
    assert len(set(keys)) == len(keys) > len(DOCS)
    by_doc: dict = {}
    for r in records:
        by_doc.setdefault(r.meta.sample_id, []).append(r.meta.lineage)
    assert all(lins == [()] or lins == [(k,) for k in range(len(lins))] for lins in by_doc.values())


def test_same_output_whatever_the_runner(folder):
    reference = collect(_build(split=True))
    assert collect(_build(split=True, runner="threads")) == reference
    assert collect(_build(split=True, runner="process", tok_arg=str(folder))) == reference
    assert collect(_build(split=True, tok_arg=CallableTokenizer(make_tokenizer()))) == reference


def test_batches_carry_the_documents_tokens():
    tok = make_tokenizer()
    got = {}
    for b in _build(split=True):
        d = b.to_pydict()
        for doc_id, row in zip(d["id"], d["input_ids"]):
            got.setdefault(doc_id, []).extend(row)
    assert got == {i: [BOS] + r + [EOS] for i, r in enumerate(reference_ids(tok, DOCS))}
