"""`TokenizeChatOp` (``Pipeline.tokenize_chat``): conversations in, ``input_ids`` plus a loss mask out.

The input column (``field``, default ``"messages"``) holds one conversation per row: an Arrow
``list<struct<role: string, content: string, ...>>`` (Python: a list of ``{"role", "content"}``
dicts). The output is ``input_ids`` list<int32> and ``mask_field_out`` (default ``"loss_mask"``)
list<int8>, unshifted: 1 on the tokens the model is trained to produce, 0 elsewhere.

Two ways to turn a conversation into tokens:

**With a chat template** (``apply_chat_template=True``, the default). The template is Jinja text,
a path to a ``.jinja`` file, or, when ``chat_template=None``, the tokenizer's own (a folder's
``chat_template.jinja`` or ``tokenizer_config.json["chat_template"]``, or a transformers object's
``chat_template``). It is rendered as transformers renders chat templates: a sandboxed Jinja
environment with ``trim_blocks``/``lstrip_blocks`` (so a newline right after a ``{% ... %}`` tag is
dropped: write ``{{ '\\n' }}`` there), ``loopcontrols``, a ``tojson`` filter that
keeps unicode, ``raise_exception()``; the variables are ``messages``, ``add_generation_prompt=False``,
``bos_token``/``eos_token`` (the tokenizer's, ``eos_token=`` overriding), then
``chat_template_kwargs``, then the row's own ``tools`` (column ``tools_field``) and
``enable_thinking`` (column ``enable_thinking_field``) when those columns exist and the row's value
is not null. ``strftime_now`` is deliberately *not* defined: a template that dates its prompt would
make the data depend on the day it runs (Llama 3 templates then fall back to a fixed date; pass
``chat_template_kwargs={"date_string": ...}`` to choose one). Keys whose value is null are removed
from the message dicts (recursively, inside dicts): Arrow gives every message of a column the union
of all messages' keys, and templates test ``message.tool_calls is defined``.

The rendered text is tokenized as a whole (``add_special_tokens=False``: specials come from the
template text), and the supervised *character* spans are mapped to tokens with the tokenizer's
offsets, one batched ``encode_batch`` per frame: **a token gets loss when any of its characters lies
in a supervised span** (a token straddling a boundary is supervised). The spans come from
``span_source``:

- ``"generation_tags"``: the text the template wraps in ``{% generation %}...{% endgeneration %}``,
  exactly (the template decides whether the end-of-turn token is supervised; put it inside the
  tag, as transformers' templates do). The tag works anywhere, macros included; nested tags are an
  error.
- ``"prefix_diff"``: for each assistant message ``i``, render ``messages[:i]`` with
  ``add_generation_prompt=True`` (the prompt ends with the assistant header) and ``messages[:i+1]``;
  both must be prefixes of the full rendering (the **guard**: a template that renders earlier turns
  differently depending on what follows, e.g. one that drops earlier turns' reasoning, fails with
  an error naming the row and pointing to generation tags). The supervised span starts at the
  message's content inside that segment (searched verbatim, then stripped; if the template changes
  the content, the whole segment after the generation prompt) and **ends at the end of the segment
  minus trailing whitespace**: the content plus the end-of-turn text the template emits right after
  it (``<|im_end|>``, ``<|eot_id|>``, ``</s>``), so the model learns to stop, but not the newline
  the template puts between turns. Only the messages ``loss_scope`` supervises are diffed (and
  guarded). On a ChatML template whose tag wraps
  ``{{ content }}<|im_end|>`` both span sources give the same mask.
- ``"auto"``: generation tags when the template has a ``{% generation %}`` block, else prefix diff.

**Without a template** (``apply_chat_template=False``): the messages' contents are tokenized
separately (one batched encode over every message of the frame, no specials) and concatenated, with
no role markers; the spans are exact: the supervised assistant messages' tokens get loss. With
``eos_token=`` (a token string, resolved with ``token_to_id``; an int id is accepted too) that token
is appended after **every** assistant message and gets loss exactly when its message does; without
it nothing is appended (not even the tokenizer's EOS). ``chat_template``, ``span_source``, tools and
``enable_thinking`` are ignored on this path.

``loss_scope`` picks the supervised assistant messages: ``None``/``"all_assistant"`` every one;
``"last_span"`` only the last one (with generation tags: the last tagged span);
``"after_last_user"`` those after the last ``user`` message (all of them when there is none; with
generation tags: the tagged spans that start after the rendering of the messages up to the last
user message). ``loss_on_last_turn_only=True`` is the deprecated spelling of ``"last_span"``
(DeprecationWarning). Only role ``"assistant"`` is supervised; any other role (``system``,
``user``, ``tool``, unknown ones) is context.

``max_length`` cuts ``input_ids`` and the mask to their first ``max_length`` tokens. Then a
conversation is **dropped** (Zephon's rule; the op is a filter, not a fan-out) when it has fewer
than 2 tokens or no supervised token -- e.g. no assistant message, or every assistant token cut off
by ``max_length``.

Errors name the sample (dataset, shard, row from the bookkeeping columns): a missing or null
``field``, a column that is not a list of messages, a message without ``role`` or ``content`` (or a
non-text one), a template that fails to render, a prefix-diff guard violation. The upstream payload
is dropped unless ``preserve_upstream_payload=True`` (the conversation column included; an upstream
``input_ids``/mask column is replaced).

Example:
    >>> def supervised(row):  # the text of the tokens that get loss
    ...     ids, mask = row.payload["input_ids"], row.payload["loss_mask"]
    ...     return tok.decode(ids[mask == 1].tolist(), skip_special_tokens=False)
    >>> chat = StaticMixtureWorkSource([Dataset.from_path("chat", "data/chat")], {"chat": 1.0}, chunk_size=8)
    >>> rows = list(Pipeline(chat).tokenize_chat(tokenizer_id="tok/", chat_template="chat.jinja", max_length=4096))
    >>> supervised(rows[0])  # user: "What is the capital of France?"
    'The capital of France is Paris.<|im_end|>'
    >>> plain = Pipeline(chat).tokenize_chat(tok, apply_chat_template=False, eos_token="</s>", loss_scope="last_span")
    >>> rows = list(plain)
    >>> supervised(rows[5])  # two answers, "Blue." then "Red.": only the last one gets loss
    'Red.</s>'
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import warnings
from pathlib import Path
from typing import Any, get_args

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from zephon_columnar import frame as F
from zephon_columnar.errors import (
    ConfigError,
    DatasetFormatError,
    MissingFieldError,
    WrongTypeError,
    operator_failure,
)
from zephon_columnar.ops.base import FrameOp, OpContext, OpTraits
from zephon_columnar.ops.config import LossScope, SpanSource, TokenizerBackend
from zephon_columnar.ops.rows import sample_of
from zephon_columnar.ops.tokenizer import (
    TokenizerHandle,
    TokenizerOwner,
    resolve_tokenizer_path,
    tokenizer_source,
)

SPAN_SOURCES: tuple[str, ...] = get_args(SpanSource)
LOSS_SCOPES: tuple[str, ...] = get_args(LossScope)
IDS_FIELD = "input_ids"
_RESERVED_KWARGS = ("messages", "add_generation_prompt")
_INT32_MAX = 2**31 - 1
_GENERATION_TAG = re.compile(r"\{%[-+]?\s*generation\s*[-+]?%\}")
# Markers the generation tag puts around its text while spans are being recorded (stripped before
# tokenizing). NULs and a supplementary private-use code point: not found in real conversations;
# a row whose text holds them anyway gets markers with a nonce it does not hold (`_markers_for`).
_OPEN = "\x00\U000f0000<zc-gen\x00"
_CLOSE = "\x00zc-gen>\U000f0000\x00"
_TRACK_VAR = "__zephon_columnar_track_generation"


class TokenizeChatOp(TokenizerOwner, FrameOp):
    """Tokenize conversations into ``input_ids`` plus a loss mask; see the module docstring.

    Stateless and columnar: one batched tokenizer call per frame; the template renders are the
    only per-row Python (Jinja has no batch mode). The tokenizer and the compiled template are
    built once per worker copy (in ``setup``, or on the first frame), never per frame.
    """

    name = "tokenize_chat"

    def __init__(
        self,
        tokenizer: Any = None,
        tokenizer_id: str | os.PathLike[str] | None = None,
        *,
        eos_token: str | int | None = None,
        field: str = "messages",
        max_length: int | None = None,
        chat_template: str | os.PathLike[str] | None = None,
        apply_chat_template: bool = True,
        span_source: SpanSource = "auto",
        loss_scope: LossScope | None = None,
        loss_on_last_turn_only: bool | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        tools_field: str | None = "tools",
        enable_thinking_field: str | None = "enable_thinking",
        mask_field_out: str = "loss_mask",
        preserve_upstream_payload: bool = False,
        parallelism: int | None = None,
        backend: TokenizerBackend = "auto",
    ) -> None:
        super().__init__()
        self._choose_backend(backend)
        if not isinstance(field, str) or not field:
            raise ConfigError(f"tokenize_chat: field= must be a column name, got {field!r}.")
        if (
            not isinstance(mask_field_out, str)
            or not mask_field_out
            or F.is_bookkeeping(mask_field_out)
            or mask_field_out == IDS_FIELD
        ):
            raise ConfigError(
                f"tokenize_chat: mask_field_out={mask_field_out!r}; pass a column name other than "
                f"{IDS_FIELD!r} that does not start with '__'."
            )
        if max_length is not None and (
            isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2
        ):
            raise ConfigError(
                f"tokenize_chat: max_length={max_length!r}; pass an int >= 2 (conversations of fewer "
                "than 2 tokens are dropped) or None."
            )
        if span_source not in SPAN_SOURCES:
            raise ConfigError(f"tokenize_chat: span_source={span_source!r}; use one of {list(SPAN_SOURCES)}.")
        if loss_scope is not None and loss_scope not in LOSS_SCOPES:
            raise ConfigError(f"tokenize_chat: loss_scope={loss_scope!r}; use None or one of {list(LOSS_SCOPES)}.")
        if loss_on_last_turn_only is not None:
            warnings.warn(
                "tokenize_chat: loss_on_last_turn_only is deprecated; use loss_scope='last_span' "
                "(True) or loss_scope='all_assistant' (False).",
                DeprecationWarning,
                stacklevel=3,
            )
            alias: LossScope = "last_span" if loss_on_last_turn_only else "all_assistant"
            if loss_scope is not None and loss_scope != alias:
                raise ConfigError(
                    f"tokenize_chat: loss_on_last_turn_only={loss_on_last_turn_only!r} contradicts "
                    f"loss_scope={loss_scope!r}; pass loss_scope alone."
                )
            loss_scope = alias
        if (
            eos_token is not None
            and not (isinstance(eos_token, str) and eos_token)
            and (isinstance(eos_token, bool) or not isinstance(eos_token, (int, np.integer)) or eos_token < 0)
        ):
            raise ConfigError(
                f"tokenize_chat: eos_token={eos_token!r}; pass a token string such as '</s>' (or its id) or None."
            )
        if chat_template_kwargs is not None:
            if not isinstance(chat_template_kwargs, dict) or not all(isinstance(k, str) for k in chat_template_kwargs):
                raise ConfigError(
                    "tokenize_chat: chat_template_kwargs= must be a dict of template variables "
                    f"(str keys), got {type(chat_template_kwargs).__name__}."
                )
            bad = [k for k in _RESERVED_KWARGS if k in chat_template_kwargs]
            if bad:
                raise ConfigError(
                    f"tokenize_chat: chat_template_kwargs may not set {bad}: the operator sets them "
                    "(messages come from field=, add_generation_prompt is False)."
                )
        for name, v in (("tools_field", tools_field), ("enable_thinking_field", enable_thinking_field)):
            if v is not None and (not isinstance(v, str) or not v):
                raise ConfigError(f"tokenize_chat: {name}={v!r}; pass a column name or None.")
        self.field = field
        self.max_length = max_length
        self.apply_chat_template = bool(apply_chat_template)
        self.span_source = span_source
        self.loss_scope: str = loss_scope or "all_assistant"
        self.eos_token = eos_token if isinstance(eos_token, str) or eos_token is None else int(eos_token)
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.tools_field = tools_field
        self.enable_thinking_field = enable_thinking_field
        self.mask_field_out = mask_field_out
        self.preserve_upstream_payload = bool(preserve_upstream_payload)
        self.parallelism = parallelism

        self._path, self._handle = tokenizer_source(tokenizer, tokenizer_id)

        # The template is read (and compiled, to fail early) here; the compiled form is rebuilt in
        # each worker copy (it does not pickle).
        self.template_text: str | None = None
        self.template_origin = ""
        self._use_tags = False
        if self.apply_chat_template:
            self.template_text, self.template_origin = _resolve_template(chat_template, tokenizer, self._path)
            has_tags = bool(_GENERATION_TAG.search(self.template_text))
            if span_source == "generation_tags" and not has_tags:
                raise ConfigError(
                    f"tokenize_chat(span_source='generation_tags'): the chat template ({self.template_origin}) has "
                    "no {% generation %}...{% endgeneration %} block. Wrap each assistant message's content (and "
                    "its end-of-turn token) in one, or use span_source='prefix_diff' or 'auto'."
                )
            self._use_tags = has_tags if span_source == "auto" else span_source == "generation_tags"
        self._compiled: Any = None
        self._compile()
        self._specials: tuple[int | None, str | None, str | None] | None = None  # eos id, bos str, eos str
        self._identity: str | None = None
        if self._handle is not None:
            self._resolve()  # an unknown eos_token is an error at pipeline build

    # ------------------------------------------------------------------ contract
    def traits(self) -> OpTraits:
        # A conversation is kept or dropped (too short, too long, nothing to learn), never split.
        return OpTraits(preserves_cursor_order=True, parallelism=self.parallelism or 1, emits="at_most_one")

    def setup(self, ctx: OpContext) -> None:
        super().setup(ctx)
        self._ensure_handle().materialize()
        self._resolve()
        self._compile()

    def preflight(self) -> None:
        """Load the tokenizer, resolve ``eos_token``, compile the template and encode a probe;
        raises what the first frame would."""
        handle = self._ensure_handle().materialize()
        self._resolve()
        self._compile()
        if self.apply_chat_template:
            self._encode_with_offsets(["preflight probe"])
        else:
            handle.preflight()

    def fingerprint(self) -> dict[str, Any]:
        template = None
        if self.template_text is not None:
            template = "sha256:" + hashlib.sha256(self.template_text.encode()).hexdigest()
        return {
            "op": self.name,
            "tokenizer": self._tokenizer_fingerprint(),
            "field": self.field,
            "max_length": self.max_length,
            "apply_chat_template": self.apply_chat_template,
            "chat_template": template,
            "span_source": ("generation_tags" if self._use_tags else "prefix_diff") if template else None,
            "loss_scope": self.loss_scope,
            "eos_token": self.eos_token,
            "chat_template_kwargs": json.dumps(self.chat_template_kwargs, sort_keys=True, default=repr),
            "tools_field": self.tools_field,
            "enable_thinking_field": self.enable_thinking_field,
            "mask_field_out": self.mask_field_out,
            "preserve_upstream_payload": self.preserve_upstream_payload,
        }

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_compiled"] = None  # a compiled Jinja template does not pickle; rebuilt on first use
        return state

    # ------------------------------------------------------------------ tokenizer, specials, template
    def _resolve(self) -> tuple[int | None, str | None, str | None]:
        """(EOS id appended by the no-template path, BOS string, EOS string for the template)."""
        if self._specials is not None:
            return self._specials
        h = self._ensure_handle()
        eos_id: int | None = None
        eos_str = _token_string(h, "eos", h.eos_token_id)
        if isinstance(self.eos_token, str):
            tid = h.token_to_id(self.eos_token)
            if tid is None:
                how = "" if h.kind == "tokenizers" else " (this callable has no convert_tokens_to_ids)"
                raise ConfigError(
                    f"tokenize_chat: eos_token={self.eos_token!r} is not a token of {h.source}{how}; "
                    "pass a token string from its vocabulary (e.g. its end-of-turn token), its id, "
                    "or None."
                )
            eos_id, eos_str = int(tid), self.eos_token
        elif self.eos_token is not None:
            eos_id = self.eos_token
            eos_str = _token_string(h, "eos", eos_id)
        self._specials = (eos_id, _token_string(h, "bos", h.bos_token_id), eos_str)
        return self._specials

    def _compile(self) -> Any:
        if self._compiled is None and self.template_text is not None:
            import jinja2

            try:
                self._compiled = _environment().from_string(self.template_text)
            except jinja2.TemplateSyntaxError as err:
                raise ConfigError(
                    f"tokenize_chat: the chat template ({self.template_origin}) is not valid Jinja: "
                    f"{err.message} (line {err.lineno}). Fix the template."
                ) from err
        return self._compiled

    # ------------------------------------------------------------------ the columnar hook
    def process_frame(self, frame: pa.Table) -> pa.Table:
        h = self._ensure_handle().materialize()
        eos_id, _, _ = self._resolve()
        conv = _Conversations.of(frame, self.field)
        selected = select_messages(conv.is_assistant, conv.is_user, conv.offsets, self.loss_scope)
        if self.apply_chat_template:
            ids, offsets, mask = self._templated(frame, conv, selected)
        else:
            ids, offsets, mask = concat_messages(h, conv.contents, conv.offsets, conv.is_assistant, selected, eos_id)
        return self._assemble(frame, ids, offsets, mask)

    # ------------------------------------------------------------------ with a template
    def _templated(
        self, frame: pa.Table, conv: _Conversations, selected: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        template = self._compile()
        _, bos_str, eos_str = self._resolve()
        base: dict[str, Any] = {}
        if bos_str is not None:
            base["bos_token"] = bos_str
        if eos_str is not None:
            base["eos_token"] = eos_str
        base.update(self.chat_template_kwargs)
        per_row = {
            key: _row_values(frame, col)
            for key, col in (("tools", self.tools_field), ("enable_thinking", self.enable_thinking_field))
        }
        rows = conv.rows()
        n = len(rows)
        starts = conv.offsets[:-1]
        chosen = np.flatnonzero(selected)
        chosen_rows = np.searchsorted(conv.offsets, chosen, side="right") - 1
        bounds = np.searchsorted(chosen_rows, np.arange(n + 1))
        last_user = conv.last_user_local()
        texts: list[str] = []
        span_rows: list[int] = []
        span_starts: list[int] = []
        span_ends: list[int] = []
        for r in range(n):
            msgs = rows[r]
            ctx = dict(base)
            for key, values in per_row.items():
                if values is not None and values[r] is not None:
                    ctx[key] = values[r]
            render = _Renderer(template, msgs, ctx, frame, r, self.template_origin)
            if self._use_tags:
                text, spans = render.tagged()
                if self.loss_scope == "last_span":
                    spans = spans[-1:]
                elif self.loss_scope == "after_last_user" and last_user[r] >= 0:
                    cut = len(
                        render.prefix(
                            msgs[: last_user[r] + 1],
                            text,
                            what="the messages up to the last user message",
                            why="loss_scope='after_last_user'",
                            advice="Use loss_scope='last_span' or 'all_assistant' with this template.",
                        )
                    )
                    spans = [s for s in spans if s[0] >= cut]
            else:
                text = render.full()
                local = chosen[bounds[r] : bounds[r + 1]] - starts[r]
                spans = [render.assistant_span(int(i), text) for i in local]
            texts.append(text)
            for s, e in spans:
                span_rows.append(r)
                span_starts.append(s)
                span_ends.append(e)
        ids, tok_offsets, tok_starts, tok_ends = self._encode_with_offsets(texts)
        mask = spans_to_token_mask(
            tok_offsets,
            tok_starts,
            tok_ends,
            np.fromiter(map(len, texts), np.int64, count=n),
            np.asarray(span_rows, np.int64),
            np.asarray(span_starts, np.int64),
            np.asarray(span_ends, np.int64),
        )
        return ids, tok_offsets, mask

    def _encode_with_offsets(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Ids (flat int32), row offsets and every token's character start/end, one batched call."""
        h = self._ensure_handle()
        n = len(texts)
        if h.kind == "tokenizers":
            encodings = h.tokenizer.encode_batch(texts, add_special_tokens=False)  # _fast has no offsets
            id_rows: Any = (e.ids for e in encodings)
            off_rows: Any = (e.offsets for e in encodings)
            lens = np.fromiter(map(len, encodings), np.int64, count=n)
        else:
            try:
                # the wrapped HF-like callable, asked for offsets as transformers fast tokenizers give them
                out = h.call(texts, add_special_tokens=False, return_offsets_mapping=True)
                id_rows, off_rows = out["input_ids"], out["offset_mapping"]
                id_rows = [r.tolist() if hasattr(r, "tolist") else list(r) for r in id_rows]
                off_rows = [r.tolist() if hasattr(r, "tolist") else list(r) for r in off_rows]
            except Exception as err:  # any failure means: no offsets from this callable
                raise ConfigError(
                    f"tokenize_chat with a chat template needs each token's character offsets, and {h.source} did not "
                    f"return them for return_offsets_mapping=True ({type(err).__name__}: {err}). Pass a "
                    "tokenizers.Tokenizer, a tokenizer.json path or a transformers fast tokenizer, or use "
                    "apply_chat_template=False."
                ) from err
            lens = np.fromiter(map(len, id_rows), np.int64, count=n)
            if [len(r) for r in off_rows] != lens.tolist():
                raise ConfigError(
                    f"tokenize_chat: {h.source} returned offset_mapping rows whose lengths differ from "
                    "its input_ids rows."
                )
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(lens, out=offsets[1:])
        total = int(offsets[-1])
        ids = np.fromiter(itertools.chain.from_iterable(id_rows), np.int32, count=total)
        pairs = np.fromiter(
            itertools.chain.from_iterable(itertools.chain.from_iterable(off_rows)), np.int64, count=2 * total
        ).reshape(total, 2)
        return ids, offsets, pairs[:, 0], pairs[:, 1]

    # ------------------------------------------------------------------ output
    def _assemble(self, frame: pa.Table, ids: np.ndarray, offsets: np.ndarray, mask: np.ndarray) -> pa.Table:
        lens = np.diff(offsets)
        if self.max_length is not None and len(lens) and int(lens.max()) > self.max_length:
            pos = np.arange(len(ids), dtype=np.int64) - np.repeat(offsets[:-1], lens)
            keep_tok = pos < self.max_length
            ids, mask = ids[keep_tok], mask[keep_tok]
            lens = np.minimum(lens, self.max_length)
        supervised = np.zeros(len(lens) + 1, np.int64)
        if len(lens):
            csum = np.concatenate(([0], np.cumsum(mask, dtype=np.int64)))
            ends = np.cumsum(lens)
            supervised = csum[ends] - csum[ends - lens]
        keep = (lens >= 2) & (supervised[: len(lens)] > 0)
        book = F.bookkeeping_of(frame)
        upstream = None
        if self.preserve_upstream_payload:
            upstream = F.payload_of(frame)
            upstream = upstream.drop_columns(
                [c for c in (IDS_FIELD, self.mask_field_out) if c in upstream.column_names]
            )
        if not keep.all():
            keep_tok = np.repeat(keep, lens)
            ids, mask, lens = ids[keep_tok], mask[keep_tok], lens[keep]
            rows = pa.array(np.flatnonzero(keep), pa.int64())
            book = book.take(rows)
            if upstream is not None:
                upstream = upstream.take(rows)
        new_off = np.zeros(len(lens) + 1, np.int64)
        np.cumsum(lens, out=new_off[1:])
        if new_off[-1] > _INT32_MAX:
            raise ConfigError(
                f"tokenize_chat: one frame produced {int(new_off[-1])} tokens, more than a list<int32> "
                "column holds; use smaller fetch batches (fetch(max_batch=...))."
            )
        off = pa.array(new_off.astype(np.int32))
        columns: list[Any] = []
        names: list[str] = []
        if upstream is not None:
            columns.extend(upstream.columns)
            names.extend(upstream.column_names)
        columns.append(pa.ListArray.from_arrays(off, pa.array(ids, pa.int32())))
        names.append(IDS_FIELD)
        columns.append(pa.ListArray.from_arrays(off, pa.array(mask.astype(np.int8, copy=False), pa.int8())))
        names.append(self.mask_field_out)
        return F.with_payload(book, pa.Table.from_arrays(columns, names=names))


# ---------------------------------------------------------------------- conversations
class _Conversations:
    """The conversation column, checked and flattened: per-row message offsets and, per message,
    its role flags and its content (an Arrow string array)."""

    def __init__(
        self, column: pa.Array, offsets: np.ndarray, contents: pa.Array, is_assistant: np.ndarray, is_user: np.ndarray
    ) -> None:
        self.column = column
        self.offsets = offsets
        self.contents = contents
        self.is_assistant = is_assistant
        self.is_user = is_user

    @classmethod
    def of(cls, frame: pa.Table, field: str) -> _Conversations:
        n = frame.num_rows
        if field not in frame.column_names:
            if n == 0:
                empty = np.zeros(0, bool)
                return cls(
                    pa.array([], pa.list_(pa.struct([]))),
                    np.zeros(1, np.int64),
                    pa.array([], pa.string()),
                    empty,
                    empty,
                )
            raise MissingFieldError(
                f"tokenize_chat: field {field!r} is missing from {_where(frame, 0)} (fields: "
                f"{F.payload_names(frame)}). Pass field=<the column holding the conversations>."
            )
        col = frame.column(field)
        t = col.type
        if pa.types.is_null(t):
            if n == 0:
                return cls.of(frame.drop_columns([field]), field)
            raise DatasetFormatError(
                f"tokenize_chat: field {field!r} is null in {_where(frame, 0)}; every row needs a "
                "list of messages. Fix the data or filter such rows out."
            )
        if not (pa.types.is_list(t) or pa.types.is_large_list(t)) or not pa.types.is_struct(t.value_type):
            raise WrongTypeError(
                f"tokenize_chat: field {field!r} has type {t} ({_where(frame, 0)}), not a list of messages: it must "
                "be list<struct<role: string, content: string>> (in Python, a list of {'role': ..., 'content': ...} "
                "dicts)."
            )
        st = t.value_type
        have = [st.field(i).name for i in range(st.num_fields)]
        for key in ("role", "content"):
            if key not in have:
                raise MissingFieldError(
                    f"tokenize_chat: the messages in field {field!r} have no {key!r} (their keys: "
                    f"{have}; {_where(frame, 0)}). Every message needs 'role' and 'content'."
                )
            kt = st.field(key).type
            if not (pa.types.is_string(kt) or pa.types.is_large_string(kt) or pa.types.is_null(kt)):
                raise WrongTypeError(
                    f"tokenize_chat: message {key!r} in field {field!r} has type {kt}, not text "
                    f"({_where(frame, 0)}); {key} must be a string."
                )
        arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        if arr.null_count:
            first = int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
            raise DatasetFormatError(
                f"tokenize_chat: field {field!r} is null in {_where(frame, first)}; every row needs a "
                "list of messages. Fix the data or filter such rows out."
            )
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(pc.list_value_length(arr).to_numpy(zero_copy_only=False), out=offsets[1:])
        values = pc.list_flatten(arr)

        def fail_at(bad: pa.Array, what: str) -> None:
            hits = np.flatnonzero(bad.to_numpy(zero_copy_only=False))
            if len(hits):
                j = int(hits[0])
                r = int(np.searchsorted(offsets, j, side="right") - 1)
                raise DatasetFormatError(
                    f"tokenize_chat: message {j - int(offsets[r])} of field {field!r} in "
                    f"{_where(frame, r)} {what}. Every message needs a 'role' and a text "
                    "'content'; fix the data or filter such rows out."
                )

        fail_at(values.is_null(), "is null")
        roles = pc.struct_field(values, "role")
        contents = pc.struct_field(values, "content")
        fail_at(roles.is_null(), "has no role")
        fail_at(contents.is_null(), "has no content")
        if pa.types.is_null(roles.type):
            roles = roles.cast(pa.string())
        if pa.types.is_null(contents.type):
            contents = contents.cast(pa.string())
        is_assistant = pc.equal(roles, "assistant").to_numpy(zero_copy_only=False).astype(bool)
        is_user = pc.equal(roles, "user").to_numpy(zero_copy_only=False).astype(bool)
        return cls(arr, offsets, contents, is_assistant, is_user)

    def rows(self) -> list[list[dict[str, Any]]]:
        """Python messages per row, with null-valued keys removed (see the module docstring)."""
        return [[_drop_nulls(m) for m in row] for row in self.column.to_pylist()]

    def last_user_local(self) -> np.ndarray:
        """Per row, the index of its last user message, or -1."""
        users = np.flatnonzero(self.is_user)
        n = len(self.offsets) - 1
        if not len(users):
            return np.full(n, -1, np.int64)
        idx = np.searchsorted(users, self.offsets[1:], side="left") - 1
        cand = users[np.maximum(idx, 0)]
        ok = (idx >= 0) & (cand >= self.offsets[:-1])
        return np.where(ok, cand - self.offsets[:-1], -1)


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def _row_values(frame: pa.Table, column: str | None) -> list[Any] | None:
    if column is None or column not in frame.column_names:
        return None
    return [_drop_nulls(v) for v in frame.column(column).to_pylist()]


def select_messages(is_assistant: np.ndarray, is_user: np.ndarray, offsets: np.ndarray, scope: str) -> np.ndarray:
    """Which messages get loss under ``scope`` (flat over the frame's messages; vectorized)."""
    if scope == "all_assistant":
        return is_assistant.copy()
    m = len(is_assistant)
    n = len(offsets) - 1
    if scope == "last_span":
        asst = np.flatnonzero(is_assistant)
        out = np.zeros(m, bool)
        if len(asst):
            idx = np.searchsorted(asst, offsets[1:], side="left") - 1
            cand = asst[np.maximum(idx, 0)]
            ok = (idx >= 0) & (cand >= offsets[:-1])
            out[cand[ok]] = True
        return out
    if scope == "after_last_user":
        users = np.flatnonzero(is_user)
        last = offsets[:-1] - 1  # no user message: every assistant message counts
        if len(users):
            idx = np.searchsorted(users, offsets[1:], side="left") - 1
            cand = users[np.maximum(idx, 0)]
            last = np.where((idx >= 0) & (cand >= offsets[:-1]), cand, last)
        row = np.repeat(np.arange(n), np.diff(offsets))
        return is_assistant & (np.arange(m) > last[row])
    raise ValueError(f"unknown loss scope {scope!r}")


def concat_messages(
    handle: TokenizerHandle,
    contents: pa.Array,
    offsets: np.ndarray,
    is_assistant: np.ndarray,
    selected: np.ndarray,
    eos_id: int | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The no-template path: every message's content tokenized in one batched call, concatenated
    per row, ``eos_id`` after each assistant message; mask 1 on the selected messages' tokens
    (their EOS included). Vectorized scatter, no per-token Python."""
    flat, msg_off = handle.encode_ids(contents.to_pylist(), add_special_tokens=False)
    tok_len = np.diff(msg_off)
    eos = is_assistant if eos_id is not None else np.zeros(len(tok_len), bool)
    out_len = tok_len + eos
    out_off = np.zeros(len(out_len) + 1, np.int64)
    np.cumsum(out_len, out=out_off[1:])
    ids = np.empty(int(out_off[-1]), np.int32)
    dest = np.arange(len(flat), dtype=np.int64) + np.repeat(out_off[:-1] - msg_off[:-1], tok_len)
    ids[dest] = flat
    if eos_id is not None:
        ids[out_off[1:][eos] - 1] = eos_id
    mask = np.repeat(selected.astype(np.int8), out_len)
    return ids, out_off[offsets], mask


def spans_to_token_mask(
    tok_offsets: np.ndarray,
    tok_starts: np.ndarray,
    tok_ends: np.ndarray,
    text_lens: np.ndarray,
    span_rows: np.ndarray,
    span_starts: np.ndarray,
    span_ends: np.ndarray,
) -> np.ndarray:
    """int8 mask over all tokens of a frame: 1 where a token shares a character with a span of its
    row. Rows are laid end to end (one character apart) in one coordinate space, so one sort and
    one ``searchsorted`` answer every token: a token [a, b) overlaps some span iff the largest end
    among the spans starting before b exceeds a. A zero-width token counts as [a, a+1)."""
    n_tok = len(tok_starts)
    if not n_tok or not len(span_rows):
        return np.zeros(n_tok, np.int8)
    base = np.zeros(len(text_lens) + 1, np.int64)
    np.cumsum(text_lens + 1, out=base[1:])
    tok_rows = np.repeat(np.arange(len(text_lens)), np.diff(tok_offsets))
    a = tok_starts + base[tok_rows]
    b = np.maximum(tok_ends, tok_starts + 1) + base[tok_rows]
    s = span_starts + base[span_rows]
    e = span_ends + base[span_rows]
    nonempty = e > s
    s, e = s[nonempty], e[nonempty]
    if not len(s):
        return np.zeros(n_tok, np.int8)
    order = np.argsort(s, kind="stable")
    s, e = s[order], np.maximum.accumulate(e[order])
    j = np.searchsorted(s, b, side="left") - 1
    hit = (j >= 0) & (e[np.maximum(j, 0)] > a)
    return hit.astype(np.int8)


# ---------------------------------------------------------------------- rendering
class _Renderer:
    """Renders one row's conversation (and its prefixes) and finds its supervised spans."""

    def __init__(
        self, template: Any, msgs: list[dict[str, Any]], ctx: dict[str, Any], frame: pa.Table, row: int, origin: str
    ) -> None:
        self.template = template
        self.msgs = msgs
        self.ctx = ctx
        self.frame = frame
        self.row = row
        self.origin = origin

    def render(self, msgs: list[dict[str, Any]], *, generation_prompt: bool = False, track: bool = False) -> str:
        kw = dict(self.ctx)
        kw["messages"] = msgs
        kw["add_generation_prompt"] = generation_prompt
        if track:
            kw[_TRACK_VAR] = _markers_for(msgs, self.ctx)
        try:
            return self.template.render(**kw)
        except Exception as err:  # a template can raise anything; name the row
            raise operator_failure(
                err,
                f"tokenize_chat: the chat template ({self.origin}) failed on "
                f"{_where(self.frame, self.row)}: {type(err).__name__}: {err}",
            ) from err

    def full(self) -> str:
        return self.render(self.msgs)

    def tagged(self) -> tuple[str, list[tuple[int, int]]]:
        """The full rendering and the character spans of its generation blocks."""
        raw = self.render(self.msgs, track=True)
        try:
            return strip_generation_marks(raw, *_markers_for(self.msgs, self.ctx))
        except ValueError as err:
            raise ConfigError(
                f"tokenize_chat: {err} in the chat template ({self.origin}) rendering "
                f"{_where(self.frame, self.row)}; use one level of {{% generation %}} blocks."
            ) from err

    def prefix(
        self,
        msgs: list[dict[str, Any]],
        text: str,
        *,
        what: str,
        generation_prompt: bool = False,
        why: str = "span_source='prefix_diff'",
        advice: str = "",
    ) -> str:
        """``msgs`` rendered, checked to be a prefix of ``text`` (the guard)."""
        p = (
            text
            if len(msgs) == len(self.msgs) and not generation_prompt
            else self.render(msgs, generation_prompt=generation_prompt)
        )
        if not text.startswith(p):
            at = next((i for i, (x, y) in enumerate(zip(p, text)) if x != y), min(len(p), len(text)))
            raise ConfigError(
                f"tokenize_chat({why}): the chat template ({self.origin}) renders {what} "
                f"(add_generation_prompt={generation_prompt}) as text that is not a prefix of the whole conversation's "
                f"rendering in {_where(self.frame, self.row)} (they differ from character {at}: "
                f"{p[at : at + 40]!r} vs {text[at : at + 40]!r}). The template renders earlier turns differently "
                "depending on what follows, so assistant spans cannot be found by diffing prefixes. "
                + (
                    advice
                    or "Wrap the assistant content (and its end-of-turn token) in {% generation %}..."
                    "{% endgeneration %} (span_source='generation_tags' or 'auto'), or use apply_chat_template=False."
                )
            )
        return p

    def assistant_span(self, i: int, text: str) -> tuple[int, int]:
        """Character span of assistant message ``i`` in ``text``: see the module docstring."""
        head = self.prefix(
            self.msgs[:i], text, what=f"the {i} messages before assistant message {i}", generation_prompt=True
        )
        upto = self.prefix(self.msgs[: i + 1], text, what=f"the messages up to assistant message {i}")
        s, e = len(head), len(upto)
        if e < s:
            raise ConfigError(
                f"tokenize_chat(span_source='prefix_diff'): in {_where(self.frame, self.row)} the chat template "
                f"({self.origin}) renders the generation prompt before assistant message {i} as longer text than "
                "the message itself; the assistant span cannot be found. Use {% generation %} tags or "
                "apply_chat_template=False."
            )
        segment = text[s:e]
        content = self.msgs[i]["content"]
        start, clen = s, 0
        if content:
            k = 0 if segment.startswith(content) else segment.find(content)
            clen = len(content)
            if k < 0 and content.strip():
                k, clen = segment.find(content.strip()), len(content.strip())
            if k >= 0:
                start = s + k
            else:
                clen = 0  # the template changed the content: supervise the whole segment
        end = max(s + len(segment.rstrip()), start + clen)
        return start, end


def _markers_for(msgs: Any, ctx: Any) -> tuple[str, str]:
    """Generation markers that occur nowhere in this row's conversation and context (the
    plain markers, unless the row holds them; then ones with a nonce it does not hold)."""
    strings: list[str] = []

    def walk(x: Any) -> None:
        if isinstance(x, str):
            strings.append(x)
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(k)
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)

    walk((msgs, ctx))
    text = "\x01".join(strings)
    open_, close, nonce = _OPEN, _CLOSE, 0
    while open_ in text or close in text:
        nonce += 1
        open_, close = f"{_OPEN}{nonce}\x00", f"\x00{nonce}{_CLOSE}"
    return open_, close


def strip_generation_marks(
    raw: str, open_mark: str = _OPEN, close_mark: str = _CLOSE
) -> tuple[str, list[tuple[int, int]]]:
    """Remove the generation markers from a tracked rendering; returns the text and the spans
    the markers enclosed. Raises ValueError on nested or unbalanced markers."""
    if open_mark not in raw and close_mark not in raw:
        return raw, []
    out: list[str] = []
    spans: list[tuple[int, int]] = []
    pos = length = 0
    while True:
        s = raw.find(open_mark, pos)
        if s < 0:
            break
        e = raw.find(close_mark, s + len(open_mark))
        before, inner = raw[pos:s], raw[s + len(open_mark) : e if e >= 0 else len(raw)]
        if e < 0 or close_mark in before:
            raise ValueError("unbalanced generation blocks")
        if open_mark in inner:
            raise ValueError("nested generation blocks")
        out.append(before)
        length += len(before)
        out.append(inner)
        spans.append((length, length + len(inner)))
        length += len(inner)
        pos = e + len(close_mark)
    tail = raw[pos:]
    if close_mark in tail:
        raise ValueError("unbalanced generation blocks")
    out.append(tail)
    return "".join(out), spans


def _environment() -> Any:
    """The Jinja environment chat templates are rendered in (transformers' settings)."""
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):
        """``{% generation %}...{% endgeneration %}``: renders its body; while spans are being
        recorded, between markers that `strip_generation_marks` turns into character spans."""

        tags = {"generation"}  # noqa: RUF012 - jinja2's Extension declares it an instance attribute

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_generation", [nodes.ContextReference()])
            return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _generation(self, context: Any, caller: Any) -> str:
            text = caller()
            markers = context.get(_TRACK_VAR)
            return f"{markers[0]}{text}{markers[1]}" if markers else text

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
    ) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def _resolve_template(chat_template: Any, tokenizer: Any, path: str | None) -> tuple[str, str]:
    """(template text, where it came from) for the chat_template= argument; see the module docstring."""
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


def _token_string(handle: TokenizerHandle, key: str, tid: int | None) -> str | None:
    """The text of special token ``tid`` (for the template's bos_token/eos_token variables)."""
    if tid is None:
        return None
    if handle.kind == "tokenizers":
        return handle.tokenizer.id_to_token(int(tid))
    fn = handle.wrapped
    value = getattr(fn, f"{key}_token", None)
    if isinstance(value, str):
        return value
    conv = getattr(fn, "convert_ids_to_tokens", None)
    return conv(int(tid)) if callable(conv) else None


def _where(frame: pa.Table, i: int) -> str:
    return sample_of(frame, i) if F.DATASET in frame.column_names else f"row {i} of the frame"
