"""Issue 27: the tokenizer backend. "auto" encodes with fastokens only where it is proven to give
the ids of `tokenizers` (static check of the tokenizer.json, a probe of hard texts, the first
frame of real data), once per process and tokenizer; everywhere else, before the proof settles
and after any mismatch, the ids are tokenizers' own."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import threading
import warnings

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from tests.extras import require
from tests.ops._tokenizers import make_texts, make_tokenizer
from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.errors import ConfigError, ConfigurationWarning
from tests.ops._chat_helpers import (chat_frame, chat_tokenizer, concat_reference, make_conversations,
                                     rows_of)
from zephon_columnar.ops.tokenize import backend as tokenizer_backend
from zephon_columnar.ops.chat import TokenizeChatOp
from zephon_columnar.ops.tokenize.load import load_tokenizer
from zephon_columnar.ops.tokenize.backend import (PROBE_TEXTS, existing_proof, flat_encodings,
                                                  probe_difference, unsupported_parts)

fastokens = require("fastokens", "fast")

TEXTS = make_texts(200, seed=11) + list(PROBE_TEXTS)
MORE_TEXTS = make_texts(120, seed=12)


@pytest.fixture
def fast_calls(monkeypatch):
    """The texts of every fastokens encode call."""
    calls: list[list[str]] = []
    real = tokenizer_backend.encode_flat

    def spy(fast, texts, *, add_special_tokens):
        calls.append(list(texts))
        return real(fast, texts, add_special_tokens=add_special_tokens)

    monkeypatch.setattr(tokenizer_backend, "encode_flat", spy)
    return calls


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


LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")


def _llama3_like() -> Tokenizer:
    """A Llama-3-style byte-level BPE: a Split regex pre-tokenizer before ByteLevel (no regex of
    its own), a BOS template, special tokens and a plain added token."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    tok.train_from_iterator(make_texts(400, seed=9), trainer=trainers.BpeTrainer(
        vocab_size=800, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B",
        special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])
    tok.add_tokens(["[plain-added]"])
    return tok


def _unigram() -> Tokenizer:
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.train_from_iterator(make_texts(300, seed=6), trainers.UnigramTrainer(
        vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], unk_token="<unk>", show_progress=False))
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


@pytest.mark.parametrize("make", [make_tokenizer, lambda: make_tokenizer(template=True), _llama3_like,
                                  _sentencepiece_like],
                         ids=["byte-level", "byte-level+template", "llama3-like", "sentencepiece-like"])
@pytest.mark.parametrize("special", [False, True])
def test_auto_proves_fastokens_on_the_first_frame_then_encodes_with_it(make, special, fast_calls):
    tok = make()
    fast = load_tokenizer(tok).use_backend("auto")
    ref = load_tokenizer(tok).use_backend("tokenizers")
    assert _ids(fast, TEXTS, add_special_tokens=special) == _ids(ref, TEXTS, add_special_tokens=special)
    assert fast.backend_note.startswith("tokenizers until fastokens is proven"), fast.backend_note
    assert _ids(fast, MORE_TEXTS, add_special_tokens=special) == _ids(ref, MORE_TEXTS, add_special_tokens=special)
    assert fast.backend_note.startswith("fastokens"), fast.backend_note
    # the first frame was checked with fastokens (step 3), the second encoded by it
    assert fast_calls[-2:] == [TEXTS, MORE_TEXTS]
    for limit in (1, 7):  # truncation without the tokenizer's specials: cut on the offsets
        if not special:
            assert _ids(fast, TEXTS, truncate_to=limit) == _ids(ref, TEXTS, truncate_to=limit)
            assert fast_calls[-1] == TEXTS


def test_truncation_that_keeps_the_tokenizers_specials_stays_on_tokenizers(fast_calls):
    tok = make_tokenizer(template=True)
    fast, ref = load_tokenizer(tok), load_tokenizer(tok).use_backend("tokenizers")
    for texts in (TEXTS, MORE_TEXTS, TEXTS):
        assert _ids(fast, texts, add_special_tokens=True, truncate_to=5) == \
            _ids(ref, texts, add_special_tokens=True, truncate_to=5)
    assert fast_calls == []


@pytest.fixture(scope="module", params=["byte-level", "llama3-like", "sentencepiece-like"])
def family(request) -> Tokenizer:
    return {"byte-level": make_tokenizer, "llama3-like": _llama3_like,
            "sentencepiece-like": _sentencepiece_like}[request.param]()


@settings(max_examples=60, deadline=None)
@given(texts=st.lists(st.text(st.characters(codec="utf-8"), max_size=80), min_size=1, max_size=8),
       special=st.booleans())
def test_random_unicode_text_gets_the_same_ids(family, texts, special):
    fast = load_tokenizer(family).use_backend("fastokens")
    ref = load_tokenizer(family).use_backend("tokenizers")
    assert _ids(fast, texts, add_special_tokens=special) == _ids(ref, texts, add_special_tokens=special)
    if any(texts):  # strict proves on its first non-empty frame; the examples after it are fastokens'
        assert fast.backend_note.startswith("fastokens"), fast.backend_note


@pytest.mark.parametrize("make, parts", [(_unigram, "model Unigram"),
                                         (_wordpiece, "model WordPiece, pre_tokenizer Whitespace")],
                         ids=["unigram", "wordpiece"])
def test_a_tokenizer_fastokens_is_not_checked_for_falls_back_quietly(make, parts):
    tok = make()
    handle = load_tokenizer(tok)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: a WordPiece tokenizer is simply not fastokens' kind
        ids = _ids(handle, TEXTS[:20]) + _ids(handle, TEXTS[20:40])
    assert handle.backend_note == f"tokenizers: fastokens is not checked for this tokenizer's {parts}"
    assert ids == _ids(load_tokenizer(tok).use_backend("tokenizers"), TEXTS[:40])
    with pytest.raises(ConfigError, match=f"backend='fastokens'.*{parts}.*backend='auto'"):
        load_tokenizer(tok).use_backend("fastokens").encode_ids(["x"])
    with pytest.raises(ConfigError, match=f"backend='fastokens'.*{parts}"):
        load_tokenizer(tok).use_backend("fastokens").preflight()
    load_tokenizer(tok).preflight()  # "auto" has nothing to refuse


def _break_fastokens_on(monkeypatch, broken: list[str]) -> None:
    """fastokens gives every id + 1 on exactly the texts ``broken`` (the probe still passes)."""
    real = tokenizer_backend.encode_flat

    def off_by_one(fast, texts, *, add_special_tokens):
        flat, offsets = real(fast, texts, add_special_tokens=add_special_tokens)
        return (flat + 1 if list(texts) == broken else flat), offsets

    monkeypatch.setattr(tokenizer_backend, "encode_flat", off_by_one)


def test_a_first_frame_mismatch_falls_back_warns_once_and_delivers_tokenizers_ids(monkeypatch):
    handle = load_tokenizer(make_tokenizer())
    ref = load_tokenizer(make_tokenizer()).use_backend("tokenizers")
    _break_fastokens_on(monkeypatch, TEXTS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _ids(handle, TEXTS) == _ids(ref, TEXTS)  # kept for step 3, tokenizers' ids delivered
    with pytest.warns(ConfigurationWarning, match="fastokens gave other ids on the first frame, text 1"):
        assert _ids(handle, MORE_TEXTS) == _ids(ref, MORE_TEXTS)
    assert handle.backend_note.startswith("tokenizers: fastokens gave other ids")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        assert _ids(load_tokenizer(make_tokenizer()), TEXTS) == _ids(ref, TEXTS)  # tokenizers from here on


def test_strict_fastokens_checks_its_first_frame_itself_and_refuses_a_mismatch(monkeypatch):
    _break_fastokens_on(monkeypatch, TEXTS)
    handle = load_tokenizer(make_tokenizer()).use_backend("fastokens")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the error says it
        with pytest.raises(ConfigError, match="backend='fastokens'.*other ids on the first frame"):
            handle.encode_ids(TEXTS)


def test_the_probe_names_the_text_where_encoders_differ():
    reference = make_tokenizer()

    def probe(encode):
        return {special: encode(special) for special in (False, True)}

    want = probe(lambda special: flat_encodings(reference.encode_batch(list(PROBE_TEXTS), add_special_tokens=special)))
    for json_str, differs in ((make_tokenizer(vocab_size=400).to_str(), True), (reference.to_str(), False)):
        fast = fastokens.Tokenizer.from_json_str(json_str)
        diff = probe_difference(probe(lambda special: tokenizer_backend.encode_flat(
            fast, PROBE_TEXTS, add_special_tokens=special)), want)
        assert (diff is not None) is differs
        if differs:
            assert diff.startswith("text ") and "add_special_tokens=False" in diff


def test_static_check_names_every_part_outside_the_checked_kinds():
    config = json.loads(_wordpiece().to_str())
    assert unsupported_parts(config) == ["model WordPiece", "pre_tokenizer Whitespace"]
    bpe = json.loads(make_tokenizer().to_str())
    assert unsupported_parts(bpe) == []
    bpe["model"]["dropout"] = 0.1
    bpe["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "BertNormalizer"}]}
    assert unsupported_parts(bpe) == ["BPE dropout 0.1", "normalizer BertNormalizer"]


def test_one_proof_per_process_and_tokenizer_shared_across_handles_and_threads(monkeypatch, fast_calls):
    proofs = []
    real = tokenizer_backend.build_fastokens
    monkeypatch.setattr(tokenizer_backend, "build_fastokens", lambda js: proofs.append(1) or real(js))
    tok = make_tokenizer()
    ref = load_tokenizer(tok).use_backend("tokenizers")
    frames = [make_texts(40, seed=s) for s in range(8)]
    want = [_ids(ref, f) for f in frames]
    got: dict[int, list] = {}

    def worker(k: int) -> None:  # each thread its own handle, as operator copies have
        handle = pickle.loads(pickle.dumps(load_tokenizer(tok)))
        got[k] = [_ids(handle, f) for f in frames]

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == {k: want for k in range(3)}
    assert len(proofs) == 1
    assert existing_proof(ref.identity()).verdict.note.startswith("fastokens")
    assert len(fast_calls) >= 3 * len(frames) - 3  # all but the frames before the proof settled


def _encode_in_child(conn, tok_json, texts):
    from zephon_columnar.ops.tokenize.load import load_tokenizer as load

    from tokenizers import Tokenizer as T
    handle = load(T.from_str(tok_json))
    settled_before = existing_proof(handle.identity()) is not None
    ids = [_ids(handle, texts), _ids(handle, MORE_TEXTS)]
    conn.send((settled_before, ids, handle.backend_note))
    conn.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork start method")
@pytest.mark.parametrize("settled", [True, False])
def test_a_forked_child_keeps_a_settled_proof_and_proves_an_unsettled_one_again(monkeypatch, settled):
    tok = make_tokenizer()
    ref = load_tokenizer(tok).use_backend("tokenizers")
    handle = load_tokenizer(tok)
    parent, release = os.getpid(), threading.Event()
    real = tokenizer_backend.build_fastokens
    if not settled:  # the parent's proof is still on its thread when the child forks
        monkeypatch.setattr(tokenizer_backend, "build_fastokens",
                            lambda js: (release.wait(30) if os.getpid() == parent else None) or real(js))
    _ids(handle, TEXTS)
    if settled:
        _ids(handle, MORE_TEXTS)
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_encode_in_child, args=(send, tok.to_str(), TEXTS))
    child.start()
    settled_before, ids, note = recv.recv()
    child.join(30)
    release.set()
    assert child.exitcode == 0
    assert settled_before is settled
    assert ids == [_ids(ref, TEXTS), _ids(ref, MORE_TEXTS)]
    assert note.startswith("fastokens"), note


def test_explain_names_the_backend():
    ds = Dataset.from_tables("d", [pa.table({"text": make_texts(300, seed=4)})])
    pipe = Pipeline(StaticMixtureWorkSource([ds], {"d": 1.0}, chunk_size=64, seed=1)).tokenize(
        make_tokenizer(), field="text", special_tokens="eos").batch(8, drop_last=False)
    assert "tokenize@p1[backend=auto: decided on the first frame]" in pipe.explain()
    list(pipe)
    assert "tokenize@p1[backend=auto: fastokens (ids checked against tokenizers)]" in pipe.explain()


def test_tokenize_chat_without_a_template_takes_the_backend():
    tok = chat_tokenizer()
    convs = make_conversations(80, seed=3)
    want = concat_reference(tok, convs, eos_id=tok.token_to_id("</s>"))
    for backend in ("auto", "fastokens", "tokenizers"):
        op = TokenizeChatOp(tok, apply_chat_template=False, eos_token="</s>", backend=backend)
        for _ in range(2):  # the first frame, then the proof's choice
            assert rows_of(op.process_frame(chat_frame(convs))) == want
    with pytest.raises(ConfigError, match=r"tokenize_chat\(backend='rust'\)"):
        TokenizeChatOp(tok, apply_chat_template=False, backend="rust")


@pytest.mark.parametrize("special_tokens", ["bos_eos", "bos", "eos", "none", "tokenizer_default"])
@pytest.mark.parametrize("shape", [{}, {"max_length": 24, "split_long_samples": True},
                                   {"max_length": 9, "truncation": True}, {"max_length": 30, "padding": "max_length"}],
                         ids=["plain", "split", "truncate", "pad"])
def test_pipeline_tokenize_delivers_the_same_rows_on_every_backend(special_tokens, shape):
    ds = Dataset.from_tables("d", [pa.table({"text": make_texts(300, seed=4)})])
    tok = _llama3_like()

    def rows(backend):
        ws = StaticMixtureWorkSource([ds], {"d": 1.0}, chunk_size=64, seed=1)
        pipe = Pipeline(ws).tokenize(tok, field="text", special_tokens=special_tokens, bos_token_id=0,
                                     eos_token_id=1, backend=backend, **shape).batch(8, drop_last=False)
        return [item.table.select(["input_ids", "attention_mask"]).to_pylist() for item in pipe]

    want = rows("tokenizers")
    assert rows("auto") == want
    assert rows("fastokens") == want


def test_an_unknown_backend_is_refused():
    ds = Dataset.from_tables("d", [pa.table({"text": ["a"]})])
    with pytest.raises(ConfigError, match="backend='fast'"):
        Pipeline(StaticMixtureWorkSource([ds], {"d": 1.0})).tokenize(make_tokenizer(), field="text", backend="fast")
