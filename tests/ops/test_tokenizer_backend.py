"""Issue 27: the tokenizer backend. "auto" encodes with fastokens only where it is proven to give
the ids of `tokenizers` (static check of the tokenizer.json, a probe of hard texts, the first
frame of real data); everywhere else, and after any mismatch, the ids are tokenizers' own."""

from __future__ import annotations

import json
import pickle
import warnings

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from tests.ops._tokenizers import make_texts, make_tokenizer
from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.errors import ConfigError, ConfigurationWarning
from zephon_columnar.ops import tokenizer as tokenizer_module
from zephon_columnar.ops.tokenizer import load_tokenizer
from zephon_columnar.ops.tokenizer_backend import PROBE_TEXTS, probe_mismatch, unsupported_parts

fastokens = pytest.importorskip("fastokens")

TEXTS = make_texts(200, seed=11) + list(PROBE_TEXTS)


def _sentencepiece_like() -> Tokenizer:
    """A Llama-2/Mistral-style BPE: Metaspace-like normalizer (prepend, space -> ▁), byte fallback."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    bytes_ = [f"<0x{i:02X}>" for i in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<unk>", "<s>", "</s>", *bytes_],
                                  show_progress=False)
    tok.train_from_iterator(make_texts(400, seed=5), trainer=trainer)
    return tok


def _wordpiece() -> Tokenizer:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(make_texts(200, seed=2), trainers.WordPieceTrainer(
        vocab_size=300, special_tokens=["[UNK]", "[CLS]", "[SEP]"], show_progress=False))
    return tok


def _ids(handle, texts, **kw) -> list[list[int]]:
    flat, offsets = handle.encode_ids(list(texts), **kw)
    return [flat[offsets[i]:offsets[i + 1]].tolist() for i in range(len(texts))]


@pytest.mark.parametrize("make", [make_tokenizer, lambda: make_tokenizer(template=True), _sentencepiece_like],
                         ids=["byte-level", "byte-level+template", "sentencepiece-like"])
@pytest.mark.parametrize("special", [False, True])
def test_auto_uses_fastokens_and_gives_tokenizers_ids(make, special):
    tok = make()
    fast = load_tokenizer(tok).use_backend("auto")
    ref = load_tokenizer(tok).use_backend("tokenizers")
    got = _ids(fast, TEXTS, add_special_tokens=special)
    assert fast.backend_note.startswith("fastokens"), fast.backend_note
    assert got == _ids(ref, TEXTS, add_special_tokens=special)
    for limit in (1, 7):  # truncation without the tokenizer's specials: cut on the offsets
        if not special:
            assert _ids(fast, TEXTS, truncate_to=limit) == _ids(ref, TEXTS, truncate_to=limit)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(st.characters(codec="utf-8"), max_size=80), min_size=1, max_size=8))
def test_random_unicode_text_gets_the_same_ids(texts):
    tok = make_tokenizer()
    fast = load_tokenizer(tok).use_backend("fastokens")
    ref = load_tokenizer(tok).use_backend("tokenizers")
    assert _ids(fast, texts) == _ids(ref, texts)


def test_a_tokenizer_fastokens_is_not_checked_for_falls_back_quietly():
    tok = _wordpiece()
    handle = load_tokenizer(tok)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: a WordPiece tokenizer is simply not fastokens' kind
        ids = _ids(handle, TEXTS[:20])
    assert handle.backend_note == "tokenizers: fastokens is not checked for this tokenizer's model WordPiece, " \
                                  "pre_tokenizer Whitespace"
    assert ids == _ids(load_tokenizer(tok).use_backend("tokenizers"), TEXTS[:20])
    with pytest.raises(ConfigError, match="backend='fastokens'.*model WordPiece.*backend='auto'"):
        load_tokenizer(tok).use_backend("fastokens").encode_ids(["x"])


def test_a_first_frame_mismatch_falls_back_warns_and_delivers_tokenizers_ids(monkeypatch):
    handle = load_tokenizer(make_tokenizer())
    ref = _ids(load_tokenizer(make_tokenizer()).use_backend("tokenizers"), TEXTS)
    real = tokenizer_module.encode_flat

    def off_by_one_on_real_data(fast, texts, *, add_special_tokens):
        flat, offsets = real(fast, texts, add_special_tokens=add_special_tokens)
        return (flat + 1 if list(texts) == TEXTS else flat), offsets  # the probe passes, real data differs

    monkeypatch.setattr(tokenizer_module, "encode_flat", off_by_one_on_real_data)
    with pytest.warns(ConfigurationWarning, match="fastokens gave other ids on the first frame, text 1"):
        assert _ids(handle, TEXTS) == ref
    assert handle.backend_note.startswith("tokenizers: fastokens gave other ids")
    assert _ids(handle, TEXTS) == ref  # tokenizers from here on


def test_the_probe_names_the_text_where_encoders_differ():
    reference = make_tokenizer()
    other = fastokens.Tokenizer.from_json_str(make_tokenizer(vocab_size=400).to_str())
    diff = probe_mismatch(reference, other)
    assert diff is not None and diff.startswith("text ") and "add_special_tokens=False" in diff
    assert probe_mismatch(reference, fastokens.Tokenizer.from_json_str(reference.to_str())) is None


def test_static_check_names_every_part_outside_the_checked_kinds():
    config = json.loads(_wordpiece().to_str())
    assert unsupported_parts(config) == ["model WordPiece", "pre_tokenizer Whitespace"]
    bpe = json.loads(make_tokenizer().to_str())
    assert unsupported_parts(bpe) == []
    bpe["model"]["dropout"] = 0.1
    bpe["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "BertNormalizer"}]}
    assert unsupported_parts(bpe) == ["BPE dropout 0.1", "normalizer BertNormalizer"]


def test_the_decision_travels_with_a_pickled_handle():
    handle = load_tokenizer(make_tokenizer())
    want = _ids(handle, TEXTS)
    copy = pickle.loads(pickle.dumps(handle))
    assert copy.backend_note == handle.backend_note and copy._fast is None
    assert _ids(copy, TEXTS) == want


def test_pipeline_tokenize_delivers_the_same_rows_on_every_backend():
    ds = Dataset.from_tables("d", [pa.table({"text": make_texts(300, seed=4)})])

    def rows(backend):
        ws = StaticMixtureWorkSource([ds], {"d": 1.0}, chunk_size=64, seed=1)
        pipe = Pipeline(ws).tokenize(make_tokenizer(), field="text", special_tokens="eos", max_length=24,
                                     split_long_samples=True, backend=backend).batch(8, drop_last=False)
        return [item.table.select(["input_ids"]).to_pylist() for item in pipe]

    assert rows("auto") == rows("tokenizers") == rows("fastokens")
    with pytest.raises(ConfigError, match="backend='fast'"):
        Pipeline(StaticMixtureWorkSource([ds], {"d": 1.0})).tokenize(make_tokenizer(), field="text", backend="fast")
