"""Loading tokenizers offline: `load_tokenizer` -> `TokenizerHandle`, their identity, and this
process's cache of loaded tokenizer files.

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

How BOS/EOS/PAD are found: `zephon_columnar.ops.tokenize.specials`.

Example:
    >>> h = load_tokenizer(tokenizer_id="tok/")  # a folder: tokenizer.json + tokenizer_config.json
    >>> ids, offsets = h.encode_ids(["hello world", "bye"])  # flat ids; row i is ids[offsets[i]:offsets[i + 1]]
    >>> h.tokenizer.decode(ids[offsets[0] : offsets[1]].tolist())
    'hello world'
    >>> h.bos_token_id, h.eos_token_id, h.pad_token_id
    (0, 1, 2)
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import Any

from zephon_columnar.errors import ConfigError
from zephon_columnar.ops.tokenize.backend import forget_proofs
from zephon_columnar.ops.tokenize.fallback import FallbackTokenizer, _is_fallback
from zephon_columnar.ops.tokenize.handle import TokenizerHandle, _build_tokenizer
from zephon_columnar.ops.tokenize.paths import CONFIG_FILES, resolve_tokenizer_path
from zephon_columnar.ops.tokenize.specials import _SPECIALS, _folder_specials, _heuristic_specials


def _is_rust_tokenizer(obj: Any) -> bool:
    try:
        from tokenizers import Tokenizer
    except ImportError:  # pragma: no cover - tokenizers is a dependency
        return False
    return isinstance(obj, Tokenizer)


def _is_hf_fast(obj: Any) -> bool:
    return _is_rust_tokenizer(getattr(obj, "backend_tokenizer", None))


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
    """Wrap or load a tokenizer, offline. See the module docstring for the accepted forms and
    `zephon_columnar.ops.tokenize.specials` for how BOS/EOS/PAD are found.

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


def after_fork_in_child() -> None:
    """A forked child keeps the loaded tokenizers but not a lock a lost thread may hold
    (`zephon_columnar.ops.tokenize.fork` calls this in the child)."""
    global _loaded_lock
    _loaded_lock = threading.Lock()


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
