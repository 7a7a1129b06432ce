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
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from tests.ops._tokenizers import make_texts, make_tokenizer
from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.errors import ConfigError, ConfigurationWarning
from tests.ops._chat_helpers import (chat_frame, chat_tokenizer, concat_reference, make_conversations,
                                     rows_of)
from zephon_columnar.ops import tokenizer_backend
from zephon_columnar.ops.chat import TokenizeChatOp
from zephon_columnar.ops.tokenizer import load_tokenizer
from zephon_columnar.ops.tokenizer_backend import PROBE_TEXTS, existing_proof, probe_mismatch, unsupported_parts

fastokens = pytest.importorskip("fastokens")

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


@pytest.fixture(scope="module")
def shared_tokenizer():
    return make_tokenizer()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(st.characters(codec="utf-8"), max_size=80), min_size=1, max_size=8))
def test_random_unicode_text_gets_the_same_ids(shared_tokenizer, texts):
    fast = load_tokenizer(shared_tokenizer).use_backend("fastokens")
    ref = load_tokenizer(shared_tokenizer).use_backend("tokenizers")
    assert _ids(fast, texts) == _ids(ref, texts)
    assert existing_proof(fast.identity()) is None or fast.backend_note.startswith(("fastokens", "tokenizers until"))


def test_a_tokenizer_fastokens_is_not_checked_for_falls_back_quietly():
    tok = _wordpiece()
    handle = load_tokenizer(tok)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: a WordPiece tokenizer is simply not fastokens' kind
        ids = _ids(handle, TEXTS[:20]) + _ids(handle, TEXTS[20:40])
    assert handle.backend_note == "tokenizers: fastokens is not checked for this tokenizer's model WordPiece, " \
                                  "pre_tokenizer Whitespace"
    assert ids == _ids(load_tokenizer(tok).use_backend("tokenizers"), TEXTS[:40])
    with pytest.raises(ConfigError, match="backend='fastokens'.*model WordPiece.*backend='auto'"):
        load_tokenizer(tok).use_backend("fastokens").encode_ids(["x"])
    with pytest.raises(ConfigError, match="backend='fastokens'.*model WordPiece"):
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


def test_one_proof_per_process_and_tokenizer_shared_across_handles_and_threads(monkeypatch, fast_calls):
    proofs = []
    real = tokenizer_backend.probe_verdict
    monkeypatch.setattr(tokenizer_backend, "probe_verdict", lambda js: proofs.append(1) or real(js))
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
    from zephon_columnar.ops.tokenizer import load_tokenizer as load

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
    real = tokenizer_backend.probe_verdict
    if not settled:  # the parent's proof is still on its thread when the child forks
        monkeypatch.setattr(tokenizer_backend, "probe_verdict",
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
    assert "tokenize@p1[backend=auto: backend='auto', decided on the first frame]" in pipe.explain()
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
    with pytest.raises(ConfigError, match="tokenize_chat: backend='rust'"):
        TokenizeChatOp(tok, apply_chat_template=False, backend="rust")


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
