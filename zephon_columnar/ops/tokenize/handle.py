"""`TokenizerHandle`: a loaded tokenizer, its ``encode_ids`` and its BOS/EOS/PAD ids.

The handle is cheap to pickle (a Rust tokenizer travels as its JSON string and is rebuilt on
first use after unpickling; a callable is pickled as it is), which is how each worker copy of an
operator gets its own tokenizer, built once. Which encoder gives its ids is the backend's
(`zephon_columnar.ops.tokenize.backend`).
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable
from typing import Any, Literal, get_args

import numpy as np

from zephon_columnar.errors import ConfigError
from zephon_columnar.keywords import choice
from zephon_columnar.ops.config import TokenizerBackend
from zephon_columnar.ops.tokenize.backend import (
    FastokensProof,
    existing_proof,
    flat_encodings,
    shared_proof,
    truncate_rows,
)
from zephon_columnar.recipes import callable_identity

Kind = Literal["tokenizers", "callable"]


def _build_tokenizer(json_str: str) -> Any:
    """Every Rust tokenizer this package builds goes through here (tests count the loads, where
    this module and `zephon_columnar.ops.tokenize.load` call it)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_str(json_str)


class TokenizerHandle:
    """A loaded tokenizer: ``encode_ids`` plus its BOS/EOS/PAD ids (None when unknown).

    Pickles cheaply: a Rust tokenizer as its JSON string (rebuilt on first use), a callable as it
    is. The handle never mutates a tokenizer it was given; it encodes with its own copy whenever
    it needs to set truncation or clear padding.
    """

    def __init__(
        self,
        *,
        kind: Kind,
        source: str,
        tokenizer: Any = None,
        json_str: str | None = None,
        fn: Callable[..., Any] | None = None,
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        pad_token_id: int | None = None,
        identity: str | None = None,
        notes: dict[str, str] | None = None,
    ) -> None:
        self.kind = kind
        self.source = source
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        #: Why a special id is None, when a config file said something about it.
        self.notes = dict(notes or {})
        self._tok = tokenizer
        #: Whose ``self._tok`` is: the caller's (or none yet: "borrowed", never configured: a copy is
        #: built before use), this process's handles' of one file ("shared": `_load_path` built it,
        #: cleared its padding and truncation, and nobody configures it), or this handle's own.
        self._tok_is: Literal["borrowed", "shared", "own"] = "borrowed"
        self._json = json_str
        self._fn = fn
        self._identity = identity
        self._trunc: int | None = None
        #: Which encoder gives the ids (`zephon_columnar.ops.tokenize.backend`).
        self.backend: TokenizerBackend = "auto"

    # pickling: the JSON string, never the Rust object
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if self.kind == "tokenizers":
            state["_json"] = self.json_str()
            state["_tok"] = None
            state["_tok_is"] = "borrowed"
            state["_trunc"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return (
            f"TokenizerHandle({self.kind}, {self.source}, bos={self.bos_token_id}, eos={self.eos_token_id}, "
            f"pad={self.pad_token_id})"
        )

    def json_str(self) -> str:
        if self.kind != "tokenizers":
            raise TypeError("json_str(): this handle wraps a callable, not a tokenizers.Tokenizer")
        if self._json is None:
            self._json = self._tok.to_str()
        return self._json

    @property
    def built(self) -> bool:
        """Whether the tokenizer object exists in this copy (False right after unpickling)."""
        return self.kind == "callable" or self._tok is not None

    def materialize(self) -> TokenizerHandle:
        """Build the tokenizer now (workers call this once in ``setup``)."""
        if self.kind == "tokenizers" and self._tok_is == "borrowed":
            self._own()
        return self

    def _own(self) -> Any:
        if self._tok_is != "own":
            tok = _build_tokenizer(self.json_str())
            tok.no_padding()  # padding to the longest of a call would depend on the frame
            tok.no_truncation()
            self._tok, self._tok_is, self._trunc = tok, "own", None
        return self._tok

    def shared_copy(self) -> TokenizerHandle:
        """Another handle on the same built tokenizer, which neither configures (one that needs
        truncation builds its own)."""
        other = TokenizerHandle.__new__(TokenizerHandle)
        other.__dict__.update(self.__dict__)
        other.notes = dict(self.notes)
        return other

    @property
    def tokenizer(self) -> Any:
        """The ``tokenizers.Tokenizer`` (None for a callable)."""
        if self.kind != "tokenizers":
            return None
        return self._tok if self._tok is not None else self._own()

    def identity(self) -> str:
        """A content hash naming this tokenizer (for fingerprints)."""
        if self._identity is None:
            if self.kind == "tokenizers":
                self._identity = "sha256:" + hashlib.sha256(self.json_str().encode()).hexdigest()
            else:
                self._identity = callable_identity(self._fn)
        return self._identity

    def token_to_id(self, token: str) -> int | None:
        if self.kind == "tokenizers":
            tid = self.tokenizer.token_to_id(token)
            return None if tid is None else int(tid)
        conv = getattr(self._fn, "convert_tokens_to_ids", None)
        return None if conv is None else conv(token)

    # ------------------------------------------------------------------ encoding
    def encode_ids(
        self, texts: list[str], *, add_special_tokens: bool = False, truncate_to: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Token ids of ``texts`` as one flat int32 array and int64 row offsets (len n+1).

        ``truncate_to`` cuts every row to at most that many ids (for a Rust tokenizer its own
        truncation, which keeps the post-processor's specials when ``add_special_tokens``).
        """
        if self.kind == "tokenizers":
            return self._encode_rust(texts, add_special_tokens, truncate_to)
        return self._encode_callable(texts, add_special_tokens, truncate_to)

    def use_backend(self, backend: TokenizerBackend) -> TokenizerHandle:
        """Encode with ``backend`` ("auto": fastokens where proven identical, else tokenizers;
        "fastokens": the same, but a tokenizer it cannot prove is a `ConfigError`)."""
        check_backend(backend, "tokenize")
        if backend == "fastokens" and self.kind != "tokenizers":
            raise ConfigError(
                f"tokenize(backend='fastokens'): {self.source} is not a tokenizers.Tokenizer "
                "(tokenizer.json); fastokens encodes those only. Use backend='auto'."
            )
        self.backend = backend
        return self

    @property
    def backend_note(self) -> str:
        """Which backend encodes and, when fastokens was passed over, why (in this process)."""
        if self.kind != "tokenizers":
            return "the tokenizer callable"
        if self.backend == "tokenizers":
            return "tokenizers (backend='tokenizers')"
        proof = existing_proof(self.identity())
        if proof is None:
            return "decided on the first frame"
        verdict = proof.verdict
        return verdict.note if verdict is not None else "tokenizers until fastokens is proven (on the first frames)"

    def preflight(self, *, add_special_tokens: bool = False) -> None:
        """Encode a probe text, raising what the first frame would (without taking it for the
        first frame of real data the proof checks); with ``backend="fastokens"``, also wait for
        steps 1 and 2 of the proof, so a tokenizer it cannot prove is refused here."""
        if self.kind != "tokenizers":
            self._encode_callable(["preflight probe"], add_special_tokens, None)
            return
        self._encode_reference(["preflight probe"], add_special_tokens, None)
        if self.backend == "fastokens":
            probed = self._proof().probed(self._encode_reference)
            if probed.encoder is None:
                raise _fastokens_refused(probed.note)

    def _proof(self) -> FastokensProof:
        # Looked up first: starting one reads the reference tokenizer's parts (built if need be).
        key = self.identity()
        return existing_proof(key) or shared_proof(key, self.json_str(), self.tokenizer)

    def _encode_rust(
        self, texts: list[str], add_special_tokens: bool, truncate_to: int | None
    ) -> tuple[np.ndarray, np.ndarray]:
        # tokenizers' own truncation keeps the post-processor's specials: that case stays there.
        if self.backend == "tokenizers" or (add_special_tokens and truncate_to is not None):
            return self._encode_reference(texts, add_special_tokens, truncate_to)
        strict = self.backend == "fastokens"
        proof = self._proof()
        encoded = proof.encode(
            texts,
            add_special_tokens=add_special_tokens,
            truncate_to=truncate_to,
            reference=self._encode_reference,
            strict=strict,
        )
        if strict and proof.verdict is not None and proof.verdict.encoder is None:
            raise _fastokens_refused(proof.verdict.note)
        return encoded

    def _encode_reference(
        self, texts: list[str], add_special_tokens: bool, truncate_to: int | None
    ) -> tuple[np.ndarray, np.ndarray]:
        tok = self._tok
        if self._tok_is != "own" and (truncate_to is not None or tok is None or tok.padding or tok.truncation):
            tok = self._own()
        if truncate_to != self._trunc:
            if truncate_to is None:
                tok.no_truncation()
            else:
                tok.enable_truncation(max_length=truncate_to)
            self._trunc = truncate_to
        encode = getattr(tok, "encode_batch_fast", None) or tok.encode_batch
        return flat_encodings(encode(texts, add_special_tokens=add_special_tokens))

    @property
    def wrapped(self) -> Callable[..., Any] | None:
        """The HF-like callable this handle wraps (kind "callable"); None for a `tokenizers` one."""
        return self._fn

    def call(self, texts: list[str], **kwargs: Any) -> Any:
        """The wrapped HF-like callable's own output for ``texts`` (a handle of kind "callable")."""
        if self._fn is None:
            raise RuntimeError(f"{self.source}: this tokenizer handle wraps no callable (kind {self.kind!r}).")
        return self._fn(texts, **kwargs)

    def _encode_callable(
        self, texts: list[str], add_special_tokens: bool, truncate_to: int | None
    ) -> tuple[np.ndarray, np.ndarray]:
        out = self.call(texts, add_special_tokens=add_special_tokens)
        try:
            rows = out["input_ids"]
        except (KeyError, TypeError, IndexError) as err:
            raise TypeError(
                f"tokenizer {self.source} returned {type(out).__name__} without 'input_ids'; an HF-like "
                "callable must return a mapping with 'input_ids' (one list of ids per text)"
            ) from err
        if hasattr(rows, "tolist"):
            rows = rows.tolist()
        rows = list(rows)
        if len(rows) != len(texts):
            raise TypeError(f"tokenizer {self.source} returned {len(rows)} rows of input_ids for {len(texts)} texts")
        rows = [r.tolist() if hasattr(r, "tolist") else r for r in rows]
        flat, offsets = _flatten(rows)
        if truncate_to is not None:
            flat, offsets = truncate_rows(flat, offsets, truncate_to)
        return flat, offsets


def _flatten(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """One int32 buffer and int64 offsets from lists of ids, no per-token Python bytecode
    (measured faster than pyarrow's list conversion or per-row numpy arrays)."""
    n = len(rows)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, rows), dtype=np.int64, count=n), out=offsets[1:])
    flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int32, count=int(offsets[-1]))
    return flat, offsets


def check_backend(backend: Any, where: str) -> TokenizerBackend:
    """``backend`` when it is one of `TokenizerBackend`'s values, else a ConfigError naming ``where``."""
    checked: TokenizerBackend = choice(where, "backend", backend, get_args(TokenizerBackend))
    return checked


def _fastokens_refused(note: str) -> ConfigError:
    return ConfigError(
        f"tokenize(backend='fastokens'): {note}. Use backend='auto' (it falls back to tokenizers) "
        "or backend='tokenizers'."
    )
