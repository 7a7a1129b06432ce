"""Loading tokenizers offline: `load_tokenizer` -> `TokenizerHandle`.

Accepted forms (nothing is ever downloaded, ``transformers`` is never imported):

- a ``tokenizers.Tokenizer``;
- ``tokenizer_id=`` (or ``tokenizer=``) a path to a ``tokenizer.json`` file;
- ``tokenizer_id=`` a folder holding ``tokenizer.json`` and optionally ``tokenizer_config.json`` /
  ``special_tokens_map.json`` (what ``save_pretrained`` writes);
- a ``transformers`` fast tokenizer object, recognised by duck typing: it has a
  ``backend_tokenizer`` attribute (a ``tokenizers.Tokenizer``) and ``bos_token_id`` /
  ``eos_token_id`` / ``pad_token_id`` attributes;
- any HF-like callable: ``tok(texts, add_special_tokens=...)`` returning a mapping with
  ``"input_ids"`` (one list of ids per text).

The handle is cheap to pickle (a Rust tokenizer travels as its JSON string and is rebuilt on
first use after unpickling; a callable is pickled as it is), which is how each worker copy of an
operator gets its own tokenizer, built once.

Special tokens. BOS/EOS/PAD ids come, in this order of precedence, from

1. the operator's explicit overrides (``bos_token_id=`` / ``eos_token_id=``, applied by the op);
2. a transformers-like object's ``bos_token_id`` / ``eos_token_id`` / ``pad_token_id``;
3. a folder's ``special_tokens_map.json``, then ``tokenizer_config.json`` (as in transformers:
   the map wins); keys ``bos_token`` / ``eos_token`` / ``pad_token`` given as strings or
   ``{"content": ...}`` dicts, resolved with ``token_to_id``. A key present with value null means
   "this tokenizer has none" and stops the search;
4. only for a bare ``tokenizer.json`` (or a key absent from the folder's files): the tokens the
   post-processor puts around a sequence (a template ``<s> $A </s>``: BOS ``<s>``, EOS
   ``</s>``), else the tokenizer's added tokens, first match in ``BOS_CANDIDATES`` /
   ``EOS_CANDIDATES`` / ``PAD_CANDIDATES``, else a special token named for its role (``[EOS]``,
   ``<|eos|>``, ``[BOS]``, ``[PAD]``...); for PAD, first the padding configured in
   ``tokenizer.json``.

Example:
    >>> h = load_tokenizer(tokenizer_id="tok/")  # a folder: tokenizer.json + tokenizer_config.json
    >>> ids, offsets = h.encode_ids(["hello world", "bye"])  # flat ids; row i is ids[offsets[i]:offsets[i + 1]]
    >>> h.tokenizer.decode(ids[offsets[0] : offsets[1]].tolist())
    'hello world'
    >>> h.bos_token_id, h.eos_token_id, h.pad_token_id
    (0, 1, 2)
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

from zephon_columnar.errors import ConfigError
from zephon_columnar.keywords import choice
from zephon_columnar.ops.config import TokenizerBackend
from zephon_columnar.ops.tokenizer_backend import (
    FastokensProof,
    existing_proof,
    flat_encodings,
    forget_proofs,
    shared_proof,
    truncate_rows,
)
from zephon_columnar.recipes import callable_identity

#: Added-token contents searched, in this order, for a bare tokenizer's BOS.
BOS_CANDIDATES: tuple[str, ...] = ("<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>", "[CLS]", "<|endoftext|>")
#: Added-token contents searched, in this order, for a bare tokenizer's EOS.
EOS_CANDIDATES: tuple[str, ...] = ("</s>", "<|end_of_text|>", "<eos>", "<|endoftext|>", "[SEP]")
#: Added-token contents searched, in this order, for a bare tokenizer's PAD.
PAD_CANDIDATES: tuple[str, ...] = ("<pad>", "[PAD]", "<|pad|>", "<|padding|>")

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILES = ("special_tokens_map.json", "tokenizer_config.json")  # precedence order

Kind = Literal["tokenizers", "callable"]
_SPECIALS = ("bos", "eos", "pad")


def _build_tokenizer(json_str: str) -> Any:
    """Every Rust tokenizer this module builds goes through here (tests count the loads)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_str(json_str)


def _is_rust_tokenizer(obj: Any) -> bool:
    try:
        from tokenizers import Tokenizer
    except ImportError:  # pragma: no cover - tokenizers is a dependency
        return False
    return isinstance(obj, Tokenizer)


def _is_hf_fast(obj: Any) -> bool:
    return _is_rust_tokenizer(getattr(obj, "backend_tokenizer", None))


def _hub_id_error(name: str, arg: str) -> ConfigError:
    return ConfigError(
        f"{arg}={name!r} is not an existing tokenizer.json file or tokenizer folder. zephon_columnar loads "
        "tokenizers offline only: it never downloads from the Hugging Face Hub or a bucket (no network "
        "access, no retries). Download the files once (e.g. `huggingface-cli download "
        f"{name} tokenizer.json tokenizer_config.json special_tokens_map.json --local-dir ./tok`) and "
        "pass tokenizer_id='./tok' (the folder) or the path of its tokenizer.json; or pass a loaded "
        "tokenizers.Tokenizer / transformers tokenizer object as tokenizer=."
    )


def resolve_tokenizer_path(path: str | os.PathLike[str], *, arg: str = "tokenizer_id") -> Path:
    """The ``tokenizer.json`` behind a file or folder path; a ConfigError at once for anything else
    (a hub id, a bucket URI, a missing path, a folder without ``tokenizer.json``)."""
    name = os.fspath(path)
    p = Path(name).expanduser()
    if p.is_file():
        return p
    if p.is_dir():
        f = p / TOKENIZER_FILE
        if not f.is_file():
            present = sorted(x.name for x in p.iterdir())[:12]
            raise ConfigError(
                f"{arg}={name!r}: the folder has no {TOKENIZER_FILE} (it holds {present}). Only fast "
                "tokenizers saved as tokenizer.json load without transformers; convert it once with "
                "transformers (AutoTokenizer.from_pretrained(path).save_pretrained(path)) or pass the "
                "transformers tokenizer object as tokenizer=."
            )
        return f
    if _looks_like_path(name):
        raise _missing_path_error(name, p, arg)
    raise _hub_id_error(name, arg)


class TokenizerNotFoundError(ConfigError, FileNotFoundError):
    """A tokenizer path (``tokenizer_id="./tok/"``, ``".../tokenizer.json"``) that does not exist:
    a ``FileNotFoundError``, and a `ConfigError` as every other unusable ``tokenizer_id`` is."""


def _looks_like_path(name: str) -> bool:
    """Whether ``name`` is meant as a local path rather than a hub id (``org/name``) or a URL: it
    starts with ``.``, ``/`` or ``~``, ends in ``.json``, or holds a separator that a hub id
    would not (two ``/``, a ``\\`` on Windows, or one ``/`` after an existing folder).

    Example:
        >>> names = ("./tok", "~/tok", "/abs/tokenizer.jsn", "tok.json", "a/b/c", "gpt2", "meta-llama/Llama-3.2-1B")
        >>> [_looks_like_path(n) for n in names]
        [True, True, True, True, True, False, False]
    """
    if "://" in name:
        return False
    if name.startswith((".", "/", "~")) or name.endswith(".json"):
        return True
    if os.sep not in name:
        return False
    return os.sep != "/" or name.count("/") >= 2 or os.path.isdir(os.path.dirname(name))


def _missing_path_error(name: str, p: Path, arg: str) -> TokenizerNotFoundError:
    """The error for a tokenizer path that does not exist: the path resolved, the names beside it
    that come close (a typo), and what the nearest existing folder above it holds."""
    resolved = p.absolute()
    parent = resolved.parent
    while not parent.is_dir() and parent != parent.parent:
        parent = parent.parent
    try:
        present = sorted(x.name + ("/" if x.is_dir() else "") for x in parent.iterdir())
    except OSError:
        present = []
    shown = [x for x in present if not x.startswith(".")]
    shown = shown[:12] + ([f"... ({len(shown)} in all)"] if len(shown) > 12 else [])
    if parent == resolved.parent:
        close = difflib.get_close_matches(resolved.name, [x.rstrip("/") for x in present], n=3, cutoff=0.6)
        near = f" Did you mean {' or '.join(str(parent / c) for c in close)}?" if close else ""
        where = f"{near} {parent} holds {shown}."
    else:
        where = f" {resolved.parent} does not exist; the nearest folder above it, {parent}, holds {shown}."
    return TokenizerNotFoundError(
        f"{arg}={name!r}: no such file or folder ({resolved}).{where} Pass the path of a "
        f"{TOKENIZER_FILE} file or of the folder that holds one (save_pretrained output)."
    )


#: ``tokenizer_id`` of the built-in stub tokenizer (Zephon's name): for tests and dry runs.
FALLBACK_ID = "__fallback__"


class FallbackTokenizer:
    """A dependency-free stand-in tokenizer for tests and dry runs (``tokenizer_id="__fallback__"``).

    Splits on whitespace and maps each word to a content id from a stable hash (10 ... 10009), so
    the same text gives the same ids in every process and run; ``pad=0``, ``bos=1``, ``eos=2``.
    Not a language-model tokenizer: never train on it.

    Example:
        >>> tok = FallbackTokenizer()
        >>> ids = tok(["hello world", "hello"])["input_ids"]
        >>> ids[0][0] == ids[1][0] and all(i >= 10 for i in ids[0]), tok.eos_token_id
        (True, 2)
    """

    name_or_path = FALLBACK_ID
    pad_token, pad_token_id = 0, 0
    bos_token, bos_token_id = 1, 1
    eos_token, eos_token_id = 2, 2

    @staticmethod
    def word_id(word: str) -> int:
        return int.from_bytes(hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest(), "little") % 10000 + 10

    def __call__(
        self,
        texts: list[str] | str,
        *,
        add_special_tokens: bool = False,
        truncation: bool = False,
        max_length: int | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        single = isinstance(texts, str)
        rows = []
        for text in [texts] if single else texts:
            # Like Zephon's stub, it has no post-processor: add_special_tokens adds nothing
            # (the pipeline's special_tokens="bos_eos" brackets documents itself).
            ids = [self.word_id(w) for w in str(text).split()]
            rows.append(ids[:max_length] if truncation and max_length is not None else ids)
        masks = [[1] * len(r) for r in rows]
        return (
            {"input_ids": rows[0], "attention_mask": masks[0]}
            if single
            else {"input_ids": rows, "attention_mask": masks}
        )


def _is_fallback(value: Any) -> bool:
    return isinstance(value, str) and value == FALLBACK_ID


def check_tokenizer_args(tokenizer: Any = None, tokenizer_id: Any = None) -> None:
    """Cheap up-front check of the arguments ``load_tokenizer`` takes (no loading): raises the
    same ConfigError ``load_tokenizer`` would for a missing/unsupported argument or a hub id."""
    if tokenizer is None and tokenizer_id is None:
        raise ConfigError(
            "tokenize: no tokenizer given. Pass tokenizer= (a tokenizers.Tokenizer, a transformers "
            "tokenizer object or an HF-like callable) or tokenizer_id= (a path to a tokenizer.json or "
            "to a folder saved by save_pretrained)."
        )
    if tokenizer is not None and tokenizer_id is not None:
        raise ConfigError("tokenize: pass either tokenizer= or tokenizer_id=, not both.")
    if _is_fallback(tokenizer_id) or _is_fallback(tokenizer):
        return
    if tokenizer_id is not None:
        if not isinstance(tokenizer_id, (str, os.PathLike)):
            raise ConfigError(
                f"tokenizer_id= must be a path (str), got {type(tokenizer_id).__name__}; "
                "pass tokenizer objects as tokenizer=."
            )
        resolve_tokenizer_path(tokenizer_id)
        return
    if isinstance(tokenizer, (str, os.PathLike)):
        resolve_tokenizer_path(tokenizer, arg="tokenizer")
        return
    if not (_is_rust_tokenizer(tokenizer) or _is_hf_fast(tokenizer) or callable(tokenizer)):
        raise ConfigError(
            f"tokenizer= got a {type(tokenizer).__name__}; pass a tokenizers.Tokenizer, a transformers fast "
            "tokenizer, a callable tok(texts, add_special_tokens=False) -> {'input_ids': [[...]]}, or a "
            "tokenizer.json / folder path."
        )


# ---------------------------------------------------------------------------- special tokens
def _token_content(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _added_tokens(tok: Any) -> dict[str, int]:
    try:
        decoder = tok.get_added_tokens_decoder()
    except AttributeError:  # very old tokenizers
        return {}
    return {t.content: int(i) for i, t in sorted(decoder.items())}


def _heuristic_specials(tok: Any) -> dict[str, int | None]:
    """BOS/EOS/PAD of a tokenizer with no config files: the tokens its post-processor puts
    around a sequence (a template ``<s> $A </s>``, Roberta's or Bert's cls/sep), else its
    added tokens (the first of the ``*_CANDIDATES``, else a special token named like one:
    ``[EOS]``, ``<|eos|>``, ...); PAD also from the padding configured in the file."""
    added = _added_tokens(tok)
    around = _template_specials(tok)
    special = _special_added_tokens(tok)
    out: dict[str, int | None] = {}
    for key, cands in (("bos", BOS_CANDIDATES), ("eos", EOS_CANDIDATES), ("pad", PAD_CANDIDATES)):
        found = around.get(key)
        if found is None:
            found = next((added[c] for c in cands if c in added), None)
        if found is None:
            found = next((i for content, i in special.items() if _SPECIAL_NAMES[key].search(content)), None)
        out[key] = found
    padding = tok.padding
    if padding and padding.get("pad_id") is not None:
        out["pad"] = int(padding["pad_id"])
    return out


# A special token named for its role, whatever the brackets: [EOS], <eos>, <|eos|>, </bos>, [PAD]...
_SPECIAL_NAMES = {key: re.compile(rf"(^|[^a-z]){key}([^a-z]|$)", re.IGNORECASE) for key in ("bos", "eos", "pad")}


def _special_added_tokens(tok: Any) -> dict[str, int]:
    try:
        decoder = tok.get_added_tokens_decoder()
    except AttributeError:
        return {}
    return {t.content: int(i) for i, t in sorted(decoder.items()) if t.special}


def _template_specials(tok: Any) -> dict[str, int]:
    """The ids a tokenizer's post-processor adds before ("bos") and after ("eos") a single
    sequence; {} when it adds none (a ByteLevel one) or cannot be read."""
    try:
        processor = json.loads(tok.to_str()).get("post_processor") or {}
    except (AttributeError, ValueError, TypeError):
        return {}
    steps = processor.get("processors", [processor]) if processor.get("type") == "Sequence" else [processor]
    out: dict[str, int] = {}
    for step in steps:
        kind = step.get("type")
        if kind in ("RobertaProcessing", "BertProcessing"):
            out.update(bos=int(step["cls"][1]), eos=int(step["sep"][1]))
        elif kind == "TemplateProcessing":
            pieces = step.get("single", [])
            where = next((i for i, p in enumerate(pieces) if "Sequence" in p), None)
            ids = {name: info["ids"] for name, info in step.get("special_tokens", {}).items()}
            for key, side in (
                ("bos", pieces[:where] if where is not None else []),
                ("eos", pieces[where + 1 :] if where is not None else []),
            ):
                names = [p["SpecialToken"]["id"] for p in side if "SpecialToken" in p]
                token = names[0] if key == "bos" and names else names[-1] if names else None
                if token is not None and len(ids.get(token, [])) == 1:
                    out[key] = int(ids[token][0])
    return out


def _folder_specials(folder: Path, tok: Any) -> tuple[dict[str, int | None], dict[str, str]]:
    """Ids named by the folder's config files (a key set to null counts as "none"), and notes
    explaining ids that could not be resolved."""
    ids: dict[str, int | None] = {}
    notes: dict[str, str] = {}
    for fname in CONFIG_FILES:
        f = folder / fname
        if not f.is_file():
            continue
        try:
            cfg = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ConfigError(f"{f}: not readable JSON ({err}); fix or remove the file.") from err
        if not isinstance(cfg, dict):
            continue
        for key in _SPECIALS:
            name = f"{key}_token"
            if key in ids or name not in cfg:
                continue
            content = _token_content(cfg[name])
            if content is None:
                ids[key] = None
                notes[key] = f"{fname} sets {name} to {json.dumps(cfg[name])}"
                continue
            tid = tok.token_to_id(content)
            ids[key] = None if tid is None else int(tid)
            if tid is None:
                notes[key] = f"{fname} names {name} {content!r}, which is not in the vocabulary"
    return ids, notes


# ---------------------------------------------------------------------------- the handle
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
        #: Which encoder gives the ids (`zephon_columnar.ops.tokenizer_backend`).
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


def path_identity(path: str | os.PathLike[str]) -> str:
    """sha256 of the tokenizer.json and the config files beside it (for a folder)."""
    f = resolve_tokenizer_path(path)
    h = hashlib.sha256(f.read_bytes())
    if Path(os.fspath(path)).expanduser().is_dir():
        for name in CONFIG_FILES:
            c = f.parent / name
            if c.is_file():
                h.update(name.encode() + b"\0" + c.read_bytes())
    return "sha256:" + h.hexdigest()


def tokenizer_identity(tokenizer: Any = None, tokenizer_id: Any = None) -> str:
    """Content identity of a tokenizer argument without loading a path (hashes its files)."""
    path = tokenizer_id if tokenizer_id is not None else tokenizer
    if isinstance(path, (str, os.PathLike)) and not _is_fallback(path):
        return path_identity(path)
    return load_tokenizer(tokenizer, tokenizer_id).identity()


# ---------------------------------------------------------------------------- loading
def load_tokenizer(tokenizer: Any = None, tokenizer_id: Any = None) -> TokenizerHandle:
    """Wrap or load a tokenizer, offline. See the module docstring for the accepted forms and how
    BOS/EOS/PAD are found.

    Raises:
        ConfigError: neither argument, both, an unsupported object, or a string that is not an
            existing ``tokenizer.json`` file or folder (e.g. a hub id: raised at once, nothing is
            downloaded).

    Example:
        >>> from tokenizers import Tokenizer
        >>> load_tokenizer(Tokenizer.from_file("tok/tokenizer.json")).eos_token_id  # "</s>", among its added tokens
        1
    """
    check_tokenizer_args(tokenizer, tokenizer_id)
    path = tokenizer_id if tokenizer_id is not None else tokenizer
    if _is_fallback(path):
        tokenizer = FallbackTokenizer()
    elif isinstance(path, (str, os.PathLike)):
        return _load_path(path, arg="tokenizer_id" if tokenizer_id is not None else "tokenizer")
    if _is_rust_tokenizer(tokenizer):
        sp = _heuristic_specials(tokenizer)
        return TokenizerHandle(
            kind="tokenizers",
            source="tokenizers.Tokenizer object",
            tokenizer=tokenizer,
            bos_token_id=sp["bos"],
            eos_token_id=sp["eos"],
            pad_token_id=sp["pad"],
        )
    if _is_hf_fast(tokenizer):
        # A transformers fast tokenizer: its Rust backend plus its own idea of the specials.
        ids = {k: _int_or_none(getattr(tokenizer, f"{k}_token_id", None)) for k in _SPECIALS}
        name = getattr(tokenizer, "name_or_path", "") or ""
        return TokenizerHandle(
            kind="tokenizers",
            source=f"{type(tokenizer).__name__}({name!r})",
            tokenizer=tokenizer.backend_tokenizer,
            bos_token_id=ids["bos"],
            eos_token_id=ids["eos"],
            pad_token_id=ids["pad"],
        )
    ids = {k: _int_or_none(getattr(tokenizer, f"{k}_token_id", None)) for k in _SPECIALS}
    if ids["pad"] is None and isinstance(getattr(tokenizer, "pad_token", None), str):
        conv = getattr(tokenizer, "convert_tokens_to_ids", None)
        if callable(conv):
            ids["pad"] = _int_or_none(conv(tokenizer.pad_token))
    return TokenizerHandle(
        kind="callable",
        source=f"callable {type(tokenizer).__name__}",
        fn=tokenizer,
        bos_token_id=ids["bos"],
        eos_token_id=ids["eos"],
        pad_token_id=ids["pad"],
    )


def _int_or_none(v: Any) -> int | None:
    return None if v is None else int(v)


def _load_path(path: str | os.PathLike[str], *, arg: str) -> TokenizerHandle:
    """A handle on the tokenizer at ``path``; loaded once per process and file contents (the
    operator copies of one pipeline, on their threads, share the built tokenizer: a 32k-vocabulary
    ``tokenizer.json`` takes 50-100 ms to build, holding the GIL)."""
    f = resolve_tokenizer_path(path, arg=arg)
    is_folder = Path(os.fspath(path)).expanduser().is_dir()
    files = [f, *(f.parent / name for name in CONFIG_FILES)] if is_folder else [f]
    key = (arg, os.fspath(path), *(_file_stamp(x) for x in files))
    with _loaded_lock:
        loaded = _loaded.get(key)
        if loaded is None:
            loaded = _loaded[key] = _build_path_handle(path, f, arg=arg, is_folder=is_folder)
    return loaded.shared_copy()


_loaded: dict[tuple[Any, ...], TokenizerHandle] = {}
_loaded_lock = threading.Lock()


def forget_tokenizers() -> None:
    """Drop this process's loaded tokenizers and fastokens proofs, so the next use loads and
    proves again (tests that count loads or change an encoder do this)."""
    with _loaded_lock:
        _loaded.clear()
    forget_proofs()


def _after_fork_in_child() -> None:
    """A forked child keeps the loaded tokenizers but not a lock a lost thread may hold."""
    global _loaded_lock
    _loaded_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _file_stamp(f: Path) -> tuple[str, int, int] | None:
    try:
        st = f.stat()
    except FileNotFoundError:
        return None
    return (str(f), st.st_mtime_ns, st.st_size)


def _build_path_handle(path: str | os.PathLike[str], f: Path, *, arg: str, is_folder: bool) -> TokenizerHandle:
    try:
        json_str = f.read_text(encoding="utf-8")
        tok = _build_tokenizer(json_str)
    except Exception as err:
        raise ConfigError(
            f"{arg}={os.fspath(path)!r}: {f} is not a tokenizers JSON file ({type(err).__name__}: {err})."
        ) from err
    sp = _heuristic_specials(tok)  # before no_padding(): the file's padding names its PAD
    tok.no_padding()
    tok.no_truncation()
    notes: dict[str, str] = {}
    if is_folder:
        cfg, notes = _folder_specials(f.parent, tok)
        sp.update(cfg)
    handle = TokenizerHandle(
        kind="tokenizers",
        source=f"{arg}={os.fspath(path)!r}",
        tokenizer=tok,
        json_str=json_str,
        bos_token_id=sp["bos"],
        eos_token_id=sp["eos"],
        pad_token_id=sp["pad"],
        notes=notes,
        identity=path_identity(path),
    )
    handle._tok_is = "shared"  # noqa: SLF001 - built here, configured by no handle
    return handle


def tokenizer_source(tokenizer: Any, tokenizer_id: Any) -> tuple[str | None, TokenizerHandle | None]:
    """``(absolute path, None)`` for a tokenizer given by path (loaded later, in each worker's
    setup or at preflight, never in the driver), or ``(None, handle)`` for a tokenizer object
    (wrapped at once: there is nothing to load). Validates the pair of arguments first."""
    check_tokenizer_args(tokenizer, tokenizer_id)
    path = tokenizer_id if tokenizer_id is not None else tokenizer
    if _is_fallback(path):
        return None, load_tokenizer(FallbackTokenizer())
    if isinstance(path, (str, os.PathLike)):
        return os.path.abspath(os.path.expanduser(os.fspath(path))), None
    return None, load_tokenizer(tokenizer)


class TokenizerOwner:
    """Mixin of the tokenizing operators: ``self._path`` (a tokenizer to load per worker) or
    ``self._handle`` (a wrapped object), as `tokenizer_source` returns them."""

    # The tokenizer runs on a worker while the lane's ordered stages run in the caller: frames
    # of 512 rows keep both busy (the knob sweep in benchmarks/RESULTS.md: 512 beat 256 and 1024).
    frame_rows: int | None = 512

    _path: str | None
    _handle: TokenizerHandle | None

    _identity: str | None
    _backend: TokenizerBackend = "auto"
    name: str  # the operator's (`BaseOp.name`)

    def _choose_backend(self, backend: TokenizerBackend) -> None:
        self._backend = check_backend(backend, self.name)

    def _ensure_handle(self) -> TokenizerHandle:
        if self._handle is None:
            assert self._path is not None
            self._handle = load_tokenizer(tokenizer_id=self._path)
        if self._handle.backend != self._backend:
            self._handle.use_backend(self._backend)
        return self._handle

    def preflight(self) -> None:
        """Load the tokenizer and encode a probe now; raise what the first frame would."""
        raise NotImplementedError(f"{type(self).__name__} must implement preflight().")

    def explain_note(self) -> str | None:
        """Which backend encodes (``explain()``): known once this process loaded the tokenizer."""
        if self._handle is None:
            return f"backend={self._backend}"
        return f"backend={self._backend}: {self._handle.backend_note}"

    def _tokenizer_fingerprint(self) -> str:
        """What the operator's fingerprint records of the tokenizer (computed once): the
        path's identity, or the wrapped object's identity and special ids."""
        if self._identity is None:
            if self._path is not None:
                self._identity = tokenizer_identity(tokenizer_id=self._path)
            else:
                assert self._handle is not None
                h = self._handle
                self._identity = f"{h.identity()}|bos={h.bos_token_id}|eos={h.eos_token_id}|pad={h.pad_token_id}"
        return self._identity
