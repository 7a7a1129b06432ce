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

from zephon_columnar.ops.chat.masks import spans_to_token_mask
from zephon_columnar.ops.chat.operator import IDS_FIELD, LOSS_SCOPES, SPAN_SOURCES, TokenizeChatOp
from zephon_columnar.ops.chat.rendering import strip_generation_marks

__all__ = [
    "IDS_FIELD",
    "LOSS_SCOPES",
    "SPAN_SOURCES",
    "TokenizeChatOp",
    "spans_to_token_mask",
    "strip_generation_marks",
]
