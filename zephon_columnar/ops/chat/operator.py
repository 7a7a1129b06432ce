"""`TokenizeChatOp`, the ``tokenize_chat`` operator (the package docstring is its manual): per frame,
conversations -> ``input_ids`` and a loss mask, one batched tokenizer call.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from typing import Any, get_args

import numpy as np
import pyarrow as pa

from zephon_columnar import frame as F
from zephon_columnar.errors import ConfigError, warn
from zephon_columnar.keywords import choice
from zephon_columnar.ops.base import FrameOp, OpContext, OpTraits
from zephon_columnar.ops.chat.conversations import Conversations, row_values
from zephon_columnar.ops.chat.masks import concat_messages, select_messages, spans_to_token_mask
from zephon_columnar.ops.chat.rendering import GENERATION_TAG, Renderer, template_environment
from zephon_columnar.ops.chat.templates import resolve_template, token_string
from zephon_columnar.ops.config import LossScope, SpanSource, TokenizerBackend
from zephon_columnar.ops.tokenize.load import tokenizer_source
from zephon_columnar.ops.tokenize.owner import TokenizerOwner

SPAN_SOURCES: tuple[str, ...] = get_args(SpanSource)
LOSS_SCOPES: tuple[str, ...] = get_args(LossScope)
IDS_FIELD = "input_ids"
_RESERVED_KWARGS = ("messages", "add_generation_prompt")
_INT32_MAX = 2**31 - 1


class TokenizeChatOp(TokenizerOwner, FrameOp):
    """Tokenize conversations into ``input_ids`` plus a loss mask; see `zephon_columnar.ops.chat`.

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
        choice("tokenize_chat", "span_source", span_source, SPAN_SOURCES)
        choice("tokenize_chat", "loss_scope", loss_scope, (None, *LOSS_SCOPES))
        if loss_on_last_turn_only is not None:
            warn(
                "tokenize_chat: loss_on_last_turn_only is deprecated; use loss_scope='last_span' "
                "(True) or loss_scope='all_assistant' (False).",
                DeprecationWarning,
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
            self.template_text, self.template_origin = resolve_template(chat_template, tokenizer, self._path)
            has_tags = bool(GENERATION_TAG.search(self.template_text))
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
        eos_str = token_string(h, "eos", h.eos_token_id)
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
            eos_str = token_string(h, "eos", eos_id)
        self._specials = (eos_id, token_string(h, "bos", h.bos_token_id), eos_str)
        return self._specials

    def _compile(self) -> Any:
        if self._compiled is None and self.template_text is not None:
            import jinja2

            try:
                self._compiled = template_environment().from_string(self.template_text)
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
        conv = Conversations.of(frame, self.field)
        selected = select_messages(conv.is_assistant, conv.is_user, conv.offsets, self.loss_scope)
        if self.apply_chat_template:
            ids, offsets, mask = self._templated(frame, conv, selected)
        else:
            ids, offsets, mask = concat_messages(h, conv.contents, conv.offsets, conv.is_assistant, selected, eos_id)
        return self._assemble(frame, ids, offsets, mask)

    # ------------------------------------------------------------------ with a template
    def _templated(
        self, frame: pa.Table, conv: Conversations, selected: np.ndarray
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
            key: row_values(frame, col)
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
            render = Renderer(template, msgs, ctx, frame, r, self.template_origin)
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
