"""Helpers for the tokenize_chat tests: a tiny tokenizer with ChatML specials, ChatML-like
templates with and without generation tags, generated conversations, and an independent per-row
reference (the ChatML text and its assistant spans built by hand, the mask by a per-token loop)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pyarrow as pa
from tokenizers import Tokenizer

from tests.ops._tokenizers import WORDS, make_tokenizer
from zephon_columnar import frame as F

CHAT_SPECIALS = ("<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>")  # ids 0..4
BOS, EOS = 0, 1

#: ChatML with the assistant content and its <|im_end|> in a generation block.
CHATML_TAGGED = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' %}"
    "{% generation %}{{ m['content'] }}<|im_end|>{% endgeneration %}{{ '\n' }}"  # trim_blocks eats a bare \n
    "{% else %}"
    "{{ m['content'] }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: The same rendering without generation tags (prefix diff finds the spans).
CHATML_PLAIN = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: The same rendering, the generation block inside a macro (the tag must work there too).
CHATML_MACRO = (
    "{% macro assistant(text) %}{% generation %}{{ text }}<|im_end|>{% endgeneration %}{% endmacro %}"
    "{{ bos_token }}"
    "{% for m in messages %}"
    "<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' %}{{ assistant(m['content']) }}\n"
    "{% else %}{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: Renders earlier assistant turns as "[earlier]": prefix diffing cannot work, tags can.
HIDING_PLAIN = (
    "{% for m in messages %}"
    "<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' and not loop.last %}[earlier]{% else %}{{ m['content'] }}{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
HIDING_TAGGED = HIDING_PLAIN.replace(
    "{% if m['role'] == 'assistant' and not loop.last %}[earlier]{% else %}{{ m['content'] }}{% endif %}"
    "<|im_end|>\n",
    "{% if m['role'] == 'assistant' %}{% generation %}{% if not loop.last %}[earlier]{% else %}"
    "{{ m['content'] }}{% endif %}<|im_end|>{% endgeneration %}{{ '\n' }}"
    "{% else %}{{ m['content'] }}<|im_end|>\n{% endif %}",
)

ROLES = ("system", "user", "assistant", "tool", "narrator")


def chat_tokenizer() -> Tokenizer:
    return make_tokenizer(CHAT_SPECIALS)


def _content(rng: random.Random) -> str:
    k = rng.choice([0, 1, 1, 2, 3, 5, 8, 13])
    text = " ".join(rng.choice(WORDS) for _ in range(k))
    if rng.random() < 0.2:
        text = rng.choice([" ", "\n", "  "]) + text + rng.choice(["", " ", "\n"])
    return text


def make_conversations(n: int, seed: int = 0) -> list[list[dict[str, str]]]:
    """Deterministic conversations of 0..7 messages: mostly user/assistant turns, sometimes a
    system prompt, tool and unknown roles, empty or whitespace-padded contents, unicode,
    conversations without an assistant message, assistant-first ones."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.choice([0, 1, 2, 2, 3, 4, 4, 5, 6, 7])
        msgs = []
        if rng.random() < 0.3:
            msgs.append({"role": "system", "content": _content(rng)})
        for j in range(k):
            role = "user" if j % 2 == 0 else "assistant"
            if rng.random() < 0.15:
                role = rng.choice(ROLES)
            msgs.append({"role": role, "content": _content(rng)})
        out.append(msgs)
    return out


def selected_messages(msgs: list[dict[str, str]], scope: str) -> list[int]:
    """Indices of the supervised messages, by plain loops."""
    asst = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    if scope == "all_assistant":
        return asst
    if scope == "last_span":
        return asst[-1:]
    users = [i for i, m in enumerate(msgs) if m["role"] == "user"]
    last_user = users[-1] if users else -1
    return [i for i in asst if i > last_user]


def chatml_reference(msgs: list[dict[str, str]], scope: str = "all_assistant",
                     bos: str = "<s>") -> tuple[str, list[tuple[int, int]]]:
    """The text CHATML_* render and the character spans that get loss (content + <|im_end|>)."""
    keep = set(selected_messages(msgs, scope))
    text = bos
    spans = []
    for i, m in enumerate(msgs):
        text += f"<|im_start|>{m['role']}\n"
        start = len(text)
        text += m["content"] + "<|im_end|>"
        if i in keep:
            spans.append((start, len(text)))
        text += "\n"
    return text, spans


def token_mask(tok: Tokenizer, text: str, spans: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Ids of ``text`` and, token by token, 1 where a character of the token is in a span."""
    enc = tok.encode(text, add_special_tokens=False)
    mask = []
    for a, b in enc.offsets:
        b = max(b, a + 1)
        mask.append(int(any(a < e and b > s for s, e in spans if e > s)))
    return enc.ids, mask


def keeps(ids: list[int], mask: list[int], max_length: int | None = None) -> tuple[list[int], list[int]] | None:
    """Zephon's drop rule after truncation: None when dropped."""
    if max_length is not None:
        ids, mask = ids[:max_length], mask[:max_length]
    return (ids, mask) if len(ids) >= 2 and sum(mask) > 0 else None


def template_reference(tok: Tokenizer, convs: list[list[dict[str, str]]], scope: str = "all_assistant",
                       max_length: int | None = None) -> list[tuple[int, list[int], list[int]]]:
    """(row, ids, mask) of every conversation kept, for the CHATML_* templates."""
    out = []
    for r, msgs in enumerate(convs):
        kept = keeps(*token_mask(tok, *chatml_reference(msgs, scope)), max_length)
        if kept is not None:
            out.append((r, *kept))
    return out


def concat_reference(tok: Tokenizer, convs: list[list[dict[str, str]]], scope: str = "all_assistant",
                     eos_id: int | None = None,
                     max_length: int | None = None) -> list[tuple[int, list[int], list[int]]]:
    """(row, ids, mask) for apply_chat_template=False: contents tokenized one by one."""
    out = []
    for r, msgs in enumerate(convs):
        keep = set(selected_messages(msgs, scope))
        ids: list[int] = []
        mask: list[int] = []
        for i, m in enumerate(msgs):
            piece = tok.encode(m["content"], add_special_tokens=False).ids
            if m["role"] == "assistant" and eos_id is not None:
                piece = piece + [eos_id]
            ids += piece
            mask += [int(i in keep)] * len(piece)
        kept = keeps(ids, mask, max_length)
        if kept is not None:
            out.append((r, *kept))
    return out


def chat_frame(convs: list[Any], *, field: str = "messages", extra: dict[str, Any] | None = None,
               type_: pa.DataType | None = None) -> pa.Table:
    """A frame as fetch hands it on: bookkeeping (dataset 0, shard 1, rows 0..n-1) + payload."""
    n = len(convs)
    book = F.pointer_frame(lane=0, chunk_id=0, offsets=np.arange(n),
                           pointers=np.array([[0, 1, i] for i in range(n)], dtype=np.int64).reshape(n, 3),
                           components=np.zeros(n, np.int32))
    cols: dict[str, Any] = {field: pa.array(convs, type_) if type_ is not None else pa.array(convs)}
    cols.update(extra or {})
    return F.with_payload(book, pa.table(cols))


MESSAGES_TYPE = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))


def rows_of(out: pa.Table, mask_field: str = "loss_mask") -> list[tuple[int, list[int], list[int]]]:
    return list(zip(out.column(F.ROW).to_pylist(), out.column("input_ids").to_pylist(),
                    out.column(mask_field).to_pylist()))
