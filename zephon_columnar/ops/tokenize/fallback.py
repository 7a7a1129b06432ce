"""The built-in stub tokenizer (``tokenizer_id="__fallback__"``, Zephon's name), for tests and
dry runs: `FallbackTokenizer`."""

from __future__ import annotations

import hashlib
from typing import Any

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
