"""Finding a tokenizer's BOS/EOS/PAD ids.

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

Step 2 is `zephon_columnar.ops.tokenize.load`'s (it reads the object's attributes); steps 3 and 4
are here (`_folder_specials`, `_heuristic_specials`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from zephon_columnar.errors import ConfigError
from zephon_columnar.ops.tokenize.paths import CONFIG_FILES

#: Added-token contents searched, in this order, for a bare tokenizer's BOS.
BOS_CANDIDATES: tuple[str, ...] = ("<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>", "[CLS]", "<|endoftext|>")
#: Added-token contents searched, in this order, for a bare tokenizer's EOS.
EOS_CANDIDATES: tuple[str, ...] = ("</s>", "<|end_of_text|>", "<eos>", "<|endoftext|>", "[SEP]")
#: Added-token contents searched, in this order, for a bare tokenizer's PAD.
PAD_CANDIDATES: tuple[str, ...] = ("<pad>", "[PAD]", "<|pad|>", "<|padding|>")

_SPECIALS = ("bos", "eos", "pad")


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
