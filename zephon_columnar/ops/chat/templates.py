"""Which chat template a ``tokenize_chat`` uses (`resolve_template`: text, a file, or the tokenizer's
own) and the special-token strings a template sees (`token_string`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from zephon_columnar.errors import ConfigError
from zephon_columnar.ops.tokenize.handle import TokenizerHandle
from zephon_columnar.ops.tokenize.paths import resolve_tokenizer_path


def resolve_template(chat_template: Any, tokenizer: Any, path: str | None) -> tuple[str, str]:
    """(template text, where it came from) for the chat_template= argument; see `zephon_columnar.ops.chat`."""
    if isinstance(chat_template, os.PathLike) or (
        isinstance(chat_template, str)
        and chat_template
        and "\n" not in chat_template
        and os.path.isfile(os.path.expanduser(chat_template))
    ):
        p = Path(os.fspath(chat_template)).expanduser()
        try:
            return p.read_text(encoding="utf-8"), f"file {str(p)!r}"
        except OSError as err:
            raise ConfigError(
                f"tokenize_chat: chat_template={os.fspath(chat_template)!r} cannot be read ({err}); "
                "pass an existing .jinja file or the template text."
            ) from err
    if isinstance(chat_template, str):
        if "{{" in chat_template or "{%" in chat_template:
            return chat_template, "chat_template text"
        raise ConfigError(
            f"tokenize_chat: chat_template={chat_template!r} is neither an existing file nor Jinja "
            "template text (it has no '{{' or '{%'); pass the path of a .jinja file or the template."
        )
    if chat_template is not None:
        raise ConfigError(
            f"tokenize_chat: chat_template= must be Jinja text or a file path, got {type(chat_template).__name__}."
        )
    if path is not None:
        folder = resolve_tokenizer_path(path).parent  # a folder, or the folder of a tokenizer.json
        if folder.is_dir():
            jinja_file = folder / "chat_template.jinja"
            if jinja_file.is_file():
                return jinja_file.read_text(encoding="utf-8"), f"file {str(jinja_file)!r}"
            cfg_file = folder / "tokenizer_config.json"
            if cfg_file.is_file():
                try:
                    cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
                except (OSError, ValueError) as err:
                    raise ConfigError(f"{cfg_file}: not readable JSON ({err}); fix or remove the file.") from err
                found = _named_template(cfg.get("chat_template") if isinstance(cfg, dict) else None, str(cfg_file))
                if found is not None:
                    return found, f"{cfg_file}"
        source = f"the tokenizer at {path!r}"
    else:
        found = _named_template(getattr(tokenizer, "chat_template", None), f"{type(tokenizer).__name__}.chat_template")
        if found is not None:
            return found, f"{type(tokenizer).__name__}.chat_template"
        source = f"the {type(tokenizer).__name__} tokenizer"
    raise ConfigError(
        f"tokenize_chat: no chat template: {source} has none (no chat_template.jinja or "
        "tokenizer_config.json 'chat_template'). Pass chat_template=<Jinja text or a .jinja file>, or "
        "apply_chat_template=False to concatenate the messages' contents."
    )


def _named_template(value: Any, where: str) -> str | None:
    """A template stored as text, a list of {name, template} or a {name: template} dict: the
    "default" one."""
    if value is None or isinstance(value, str):
        return value
    named = (
        {d.get("name"): d.get("template") for d in value if isinstance(d, dict)}
        if isinstance(value, list)
        else dict(value)
        if isinstance(value, dict)
        else {}
    )
    if isinstance(named.get("default"), str):
        return named["default"]
    raise ConfigError(
        f"tokenize_chat: {where} holds chat templates named {sorted(map(str, named))} and none is "
        "'default'; pass the one you want as chat_template=."
    )


def token_string(handle: TokenizerHandle, key: str, tid: int | None) -> str | None:
    """The text of special token ``tid`` (for the template's bos_token/eos_token variables)."""
    if tid is None:
        return None
    if handle.kind == "tokenizers":
        text = handle.tokenizer.id_to_token(int(tid))
        return None if text is None else str(text)
    fn = handle.wrapped
    value = getattr(fn, f"{key}_token", None)
    if isinstance(value, str):
        return value
    conv = getattr(fn, "convert_ids_to_tokens", None)
    return conv(int(tid)) if callable(conv) else None
