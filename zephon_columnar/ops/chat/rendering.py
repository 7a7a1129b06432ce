"""Rendering a conversation with a Jinja chat template as transformers does (`template_environment`),
recording the text ``{% generation %}`` wraps (`strip_generation_marks`), and the prefix-diff spans
(`Renderer`).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pyarrow as pa

from zephon_columnar.errors import ConfigError, operator_failure
from zephon_columnar.ops.chat.conversations import describe_row

GENERATION_TAG = re.compile(r"\{%[-+]?\s*generation\s*[-+]?%\}")
# Markers the generation tag puts around its text while spans are being recorded (stripped before
# tokenizing). NULs and a supplementary private-use code point: not found in real conversations;
# a row whose text holds them anyway gets markers with a nonce it does not hold (`markers_for`).
_OPEN = "\x00\U000f0000<zc-gen\x00"
_CLOSE = "\x00zc-gen>\U000f0000\x00"
_TRACK_VAR = "__zephon_columnar_track_generation"


class Renderer:
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
            kw[_TRACK_VAR] = markers_for(msgs, self.ctx)
        try:
            return str(self.template.render(**kw))
        except Exception as err:  # a template can raise anything; name the row
            raise operator_failure(
                err,
                f"tokenize_chat: the chat template ({self.origin}) failed on "
                f"{describe_row(self.frame, self.row)}: {type(err).__name__}: {err}",
            ) from err

    def full(self) -> str:
        return self.render(self.msgs)

    def tagged(self) -> tuple[str, list[tuple[int, int]]]:
        """The full rendering and the character spans of its generation blocks."""
        raw = self.render(self.msgs, track=True)
        try:
            return strip_generation_marks(raw, *markers_for(self.msgs, self.ctx))
        except ValueError as err:
            raise ConfigError(
                f"tokenize_chat: {err} in the chat template ({self.origin}) rendering "
                f"{describe_row(self.frame, self.row)}; use one level of {{% generation %}} blocks."
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
                f"rendering in {describe_row(self.frame, self.row)} (they differ from character {at}: "
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
        """Character span of assistant message ``i`` in ``text``: see `zephon_columnar.ops.chat`."""
        head = self.prefix(
            self.msgs[:i], text, what=f"the {i} messages before assistant message {i}", generation_prompt=True
        )
        upto = self.prefix(self.msgs[: i + 1], text, what=f"the messages up to assistant message {i}")
        s, e = len(head), len(upto)
        if e < s:
            raise ConfigError(
                f"tokenize_chat(span_source='prefix_diff'): in {describe_row(self.frame, self.row)} the chat template "
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


def markers_for(msgs: Any, ctx: Any) -> tuple[str, str]:
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


def template_environment() -> Any:
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
