"""Each builder that hands its arguments to an operator (``Pipeline._op_arguments``) takes what
the operator takes, plus ``placement`` (and what the builder handles itself): the same names
with the same defaults. The packing operators pass their ``**options`` on to
``resolve_spec``, whose signature then counts as theirs. An argument added to one and not the
other fails here instead of being silently dropped or refused at run time. The same holds
``SampleBatch.to_training`` to `TrainingOptions`, which it builds from its keywords."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from zephon_columnar import Pipeline
from zephon_columnar.ops.chat import TokenizeChatOp
from zephon_columnar.ops.ensure_mixture import EnsureMixtureOp
from zephon_columnar.ops.pack import PackFlatOp, PackSequencesOp
from zephon_columnar.ops.pack.spec import resolve_spec
from zephon_columnar.ops.shuffle import ShuffleOp
from zephon_columnar.ops.tokenize.op import TokenizeOp

BUILDERS: list[tuple[str, type, tuple[str, ...]]] = [
    ("tokenize", TokenizeOp, ()),
    ("tokenize_chat", TokenizeChatOp, ()),
    ("shuffle", ShuffleOp, ()),
    ("ensure_mixture", EnsureMixtureOp, ()),
    ("pack_flat", PackFlatOp, ()),
    ("pack_sequences", PackSequencesOp, ("length_fn",)),  # refused by the builder (no length field)
]


def parameters(fn: Any, leave_out: tuple[str, ...] = ()) -> dict[str, Any]:
    """``{name: default}`` of ``fn``'s named parameters, but ``leave_out`` and ``**kwargs``."""
    return {
        name: p.default
        for name, p in inspect.signature(fn).parameters.items()
        if name not in ("self", "placement", *leave_out) and p.kind is not p.VAR_KEYWORD
    }


def accepted(op: type) -> dict[str, Any]:
    """What ``op(...)`` accepts: its ``__init__``'s names, and `resolve_spec`'s for a packer
    (but what does not apply to `PackSequencesOp`: it passes ``emit_positions=False`` itself, and
    its rows keep their segments apart, unpadded, so ``pad_token_id`` is not one of its options)."""
    names = parameters(op.__init__)
    if issubclass(op, PackFlatOp):
        fixed = ("emit_positions", "pad_token_id") if op is PackSequencesOp else ()
        names = {**parameters(resolve_spec, ("op", "min_max_length", *fixed)), **names}
    return names


@pytest.mark.parametrize(("builder", "op", "own"), BUILDERS, ids=[b[0] for b in BUILDERS])
def test_a_builder_and_its_operator_take_the_same_arguments_with_the_same_defaults(builder, op, own):
    method = getattr(Pipeline, builder)
    assert parameters(method, own) == accepted(op)
    assert inspect.signature(method).parameters["placement"].default == "auto"


def test_the_check_sees_a_difference():
    def builder(self, a, *, b=1, placement="auto"): ...

    def init(self, a, *, b=2): ...

    assert parameters(builder, ()) != parameters(init, ())


def test_to_training_takes_exactly_the_fields_of_training_options_with_their_defaults():
    from dataclasses import fields

    from zephon_columnar.training import TrainingOptions
    from zephon_columnar.types import SampleBatch

    assert parameters(SampleBatch.to_training) == {f.name: f.default for f in fields(TrainingOptions)}


def test_the_keyword_check_keeps_every_builder_signature():
    """`zephon_columnar.keywords` wraps the builders; their signatures are still their own."""
    assert list(inspect.signature(Pipeline.tokenize).parameters)[:4] == ["self", "tokenizer", "tokenizer_id", "field"]
    for name, fn in vars(Pipeline).items():
        if callable(fn) and not name.startswith("_"):
            kinds = {p.kind for p in inspect.signature(fn).parameters.values()}
            assert kinds != {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD}, name
