"""Where a ``tokenizer_id`` points: the ``tokenizer.json`` behind a file or folder path, and the
errors for anything else (a hub id or bucket URI, a missing path, a folder without
``tokenizer.json``). Nothing is ever downloaded.

Example:
    >>> resolve_tokenizer_path("tok/").name  # a folder: its tokenizer.json
    'tokenizer.json'
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from zephon_columnar.errors import ConfigError

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILES = ("special_tokens_map.json", "tokenizer_config.json")  # precedence order


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
