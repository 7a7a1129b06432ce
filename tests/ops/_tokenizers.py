"""Tiny offline tokenizers for the tokenize tests: byte-level BPE trained in well under a second
on generated text, plus stand-ins for a transformers fast tokenizer and an HF-like callable
(transformers is not installed and must not be needed)."""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from zephon_columnar import frame as F

SPECIALS = ("<s>", "</s>", "<pad>")  # ids 0, 1, 2
WORDS = ("the data loader packs tokens into rows while every lane keeps its order and a checkpoint "
         "resumes exactly where it stopped; naïve café résumé 数据 ünïcode émoji 🙂 tabs\tand\nnewlines").split(" ")


SYLLABLES = ("ka", "to", "ri", "men", "sol", "ve", "dra", "qu", "ix", "on", "el", "ph", "str", "ae", "ing")


def make_texts(n: int, seed: int = 0, *, max_words: int = 60) -> list[str]:
    """Deterministic documents of 0..max_words words (the first one empty): real words, unicode,
    tabs/newlines and pseudo-words made of syllables."""
    rng = random.Random(seed)
    out = [""]
    for _ in range(n - 1):
        k = rng.randint(1, max_words)
        words = [rng.choice(WORDS) if rng.random() < 0.6 else
                 "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(k)]
        out.append(" ".join(words))
    return out[:n]


@functools.lru_cache(maxsize=None)
def _trained_json(specials: tuple[str, ...], vocab_size: int, template: bool) -> str:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(specials), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(make_texts(400, seed=1234), trainer=trainer)
    if template:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", special_tokens=[("<s>", tok.token_to_id("<s>")), ("</s>", tok.token_to_id("</s>"))])
    return tok.to_str()


def make_tokenizer(specials: Sequence[str] = SPECIALS, *, vocab_size: int = 600, template: bool = False) -> Tokenizer:
    """A fresh byte-level BPE tokenizer (~340 merges). ``template`` adds a ``<s> $A </s>``
    post-processor (what ``special_tokens='tokenizer_default'`` uses)."""
    return Tokenizer.from_str(_trained_json(tuple(specials), vocab_size, template))


def save_folder(path: Path, tok: Tokenizer, *, config: dict[str, Any] | None = None,
                special_map: dict[str, Any] | None = None) -> Path:
    """A folder as ``save_pretrained`` writes it."""
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    if config is not None:
        (path / "tokenizer_config.json").write_text(json.dumps(config))
    if special_map is not None:
        (path / "special_tokens_map.json").write_text(json.dumps(special_map))
    return path


def reference_ids(tok: Tokenizer, texts: list[str], *, add_special_tokens: bool = False) -> list[list[int]]:
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=add_special_tokens)]


class FakeFastTokenizer:
    """Duck-typed transformers ``PreTrainedTokenizerFast``: a Rust backend plus special ids."""

    def __init__(self, backend: Tokenizer, *, bos: str | None = "<s>", eos: str | None = "</s>",
                 pad: str | None = "<pad>") -> None:
        self.backend_tokenizer = backend
        self.name_or_path = "fake-fast"
        self.bos_token_id = None if bos is None else backend.token_to_id(bos)
        self.eos_token_id = None if eos is None else backend.token_to_id(eos)
        self.pad_token_id = None if pad is None else backend.token_to_id(pad)

    def __call__(self, texts, add_special_tokens=True, **kw):  # never used: the backend is
        raise AssertionError("the backend tokenizer should be used directly")


class CallableTokenizer:
    """Any HF-like callable: ``tok(texts, add_special_tokens=...) -> {"input_ids": [[...]]}``."""

    def __init__(self, tok: Tokenizer, *, bos: int | None = 0, eos: int | None = 1, pad: int | None = 2) -> None:
        self.tok = tok
        self.bos_token_id, self.eos_token_id, self.pad_token_id = bos, eos, pad
        self.calls = 0

    def __call__(self, texts, add_special_tokens=True):
        self.calls += 1
        encs = self.tok.encode_batch(list(texts), add_special_tokens=add_special_tokens)
        return {"input_ids": [e.ids for e in encs], "attention_mask": [e.attention_mask for e in encs]}


def text_frame(texts: list[str | None], *, lane: int = 0, chunk: int = 0, extra: dict[str, list] | None = None,
               field: str = "text") -> pa.Table:
    """A frame as fetch hands it on: bookkeeping (dataset 0, shard 1, rows 0..n-1) + payload."""
    n = len(texts)
    book = F.pointer_frame(lane=lane, chunk_id=chunk, offsets=np.arange(n),
                           pointers=np.array([[0, 1, i] for i in range(n)], dtype=np.int64).reshape(n, 3),
                           components=np.zeros(n, np.int32))
    cols = {field: pa.array(texts, pa.string())}
    cols.update(extra or {})
    return F.with_payload(book, pa.table(cols))


def count_builds(monkeypatch: Any) -> list[int]:
    """A list that grows by one for every Rust tokenizer the package builds. ``_build_tokenizer``
    is called from two modules (a handle building its own copy, `load` building a file's shared
    one): each is patched where its code reads the name."""
    from zephon_columnar.ops.tokenize import handle, load

    builds: list[int] = []
    for module in (handle, load):
        real = module._build_tokenizer
        monkeypatch.setattr(module, "_build_tokenizer", lambda s, real=real: builds.append(1) or real(s))
    return builds
