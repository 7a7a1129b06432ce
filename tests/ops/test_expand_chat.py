"""expand_chat: one prefix per answered user turn (with its whole assistant/tool exchange),
Zephon's lineage rule, nested fields, bad input named, and exact resume through a pipeline."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from zephon_columnar import Dataset, Pipeline, StaticMixtureWorkSource
from zephon_columnar.frame import frame_of, lineage_paths, payload_of
from zephon_columnar.ops.expand_chat import ExpandChatOp


def msg(role: str, content: str = "") -> dict:
    return {"role": role, "content": content or role}


def contents(frame) -> list[list[str]]:
    return [[m["content"] for m in row] for row in payload_of(frame).column("messages").to_pylist()]


def test_prefixes_end_before_the_next_user_turn_and_skip_unanswered_ones():
    convo = [msg("system", "S"), msg("user", "U1"), msg("assistant", "A1"), msg("tool", "T1"),
             msg("assistant", "A1b"), msg("user", "U2"), msg("user", "U3"), msg("assistant", ""),
             msg("user", "U4")]
    out = ExpandChatOp().process_frame(frame_of({"messages": [convo], "id": [7]}))
    assert contents(out) == [["S", "U1", "A1", "T1", "A1b"],
                             ["S", "U1", "A1", "T1", "A1b", "U2", "U3", "assistant"]]  # empty answer counts
    assert lineage_paths(out) == [(0,), (2,)]  # user-turn ordinals: U2 (1) unanswered, U4 (3) too
    assert payload_of(out).column("id").to_pylist() == [7, 7]


def test_a_sole_prefix_keeps_the_lineage_and_unanswered_conversations_are_dropped():
    rows = [[msg("user", "a"), msg("assistant", "b"), msg("user", "c")],  # one answered turn
            [msg("user", "x")], [msg("system", "s"), msg("assistant", "a")], []]
    out = ExpandChatOp().process_frame(frame_of({"messages": rows}))
    assert contents(out) == [["a", "b"]] and lineage_paths(out) == [()]
    assert out.column("__offset").to_pylist() == [0]


def test_a_nested_field_is_expanded_in_place():
    chat = [{"meta": 1, "messages": [msg("user", "q1"), msg("assistant", "r1"), msg("user", "q2"),
                                     msg("assistant", "r2")]}]
    out = ExpandChatOp(field="chat.messages").process_frame(frame_of({"chat": chat}))
    rows = payload_of(out).column("chat").to_pylist()
    assert [[m["content"] for m in r["messages"]] for r in rows] == [["q1", "r1"], ["q1", "r1", "q2", "r2"]]
    assert [r["meta"] for r in rows] == [1, 1]


@pytest.mark.parametrize("payload, field, error, fragment", [
    ({"text": ["hi"]}, "messages", ValueError, "no 'messages' field"),
    ({"messages": ["not a list"]}, "messages", TypeError, "list of messages"),
    ({"messages": [[{"role": "", "content": "x"}]]}, "messages", ValueError, "message 0"),
    ({"messages": [[{"content": "x"}]]}, "messages", ValueError, "'role'"),
    ({"chat": [{"m": 1}]}, "chat.messages", ValueError, "'messages' is not a field"),
])
def test_bad_input_names_the_field_and_the_sample(payload, field, error, fragment):
    with pytest.raises(error, match=fragment):
        ExpandChatOp(field=field).process_frame(frame_of(payload))


def test_bad_field_argument_is_a_value_error():
    with pytest.raises(ValueError, match="expand_chat"):
        ExpandChatOp(field="chat..messages")


def test_through_a_pipeline_every_prefix_once_and_resume_exactly():
    convos = [[msg("user", f"q{i}.{t}") if k == 0 else msg("assistant", f"a{i}.{t}")
               for t in range(1 + i % 3) for k in range(2)] for i in range(40)]
    ds = Dataset.from_tables("chat", [pa.table({"messages": convos[:20]}), pa.table({"messages": convos[20:]})])

    def build():
        ws = StaticMixtureWorkSource([ds], {"chat": 1.0}, chunk_size=8, seed=3)
        return Pipeline(ws).expand_chat(field="messages").shuffle(buffer_size=8, seed=1).batch(4).options(
            canonical_replicas=2, runner="threads")

    def key(b):
        return [[m["content"] for m in r.payload["messages"]] for r in b.records]

    full = [key(b) for b in build()]
    assert sum(len(b) for b in full) <= sum(1 + i % 3 for i in range(40))
    pipe = build()
    it = iter(pipe)
    head = [key(next(it)) for _ in range(5)]
    ckpt = json.loads(json.dumps(pipe.checkpoint()))
    it.close()
    resumed = build()
    resumed.restore(ckpt)
    assert head + [key(b) for b in resumed] == full
