"""Forged damage (the digests computed again, as a tool that edits checkpoints would) meets the
engine's own checks. A malformed value (a key removed, null, a wrong type, a fraction, a negative
count, a list or text cut) anywhere in the lane's structure (positions, stage list, queues, rows
held by reference, targets) is refused with a `CheckpointError` or changes nothing. What only the
digest tells apart, and is not asked of the engine here: an in-range value moved (a position off
by one), and values inside an operator's own state (its ``state`` dict, its per-row ``__s_*``
columns, a packed row's ``__segments``) that still parse (see test_checkpoint_damage.py)."""

from __future__ import annotations

import re

import pytest

from tests.engine.test_checkpoint_damage import MALFORMED, RECIPES, _outcomes

#: Paths inside an operator's own state: the operator reads them, the digest guards them. (And a
#: mixture cursor's ``accumulator``, a rational as text: cut short, "-1/9" is "-1", another value
#: in range, which only the digest tells apart.)
OPERATOR_STATE = re.compile(r"\.state(\.|$)|\.__s_|\.__sf_|__segments|\.schema")


#: In CI, every third case of each recipe (which third depends on the recipe); all of them with
#: ``-m slow`` (~3 min on 2 cores).
CI_SHARE = 3


def _forged(recipe: str, share: int) -> None:
    # Of the wide mixture, what the others do not have: its compactly written work-source state.
    own = (lambda path: ".source_state." in path) if recipe == "wide_mixture" else (lambda path: True)
    wrong, _, cases = _outcomes(recipe, forged=True,
                                keep=lambda path, damage: damage in MALFORMED and not OPERATOR_STATE.search(path)
                                and not (damage == "cut" and path.endswith(".accumulator")) and own(path),
                                share=(share, sorted(RECIPES).index(recipe) % share))
    assert cases and not wrong, wrong


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_forged_malformed_structure_is_refused_by_the_engines_own_checks(recipe):
    _forged(recipe, CI_SHARE)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_forged_malformed_structure_is_refused_by_the_engines_own_checks_every_case(recipe):
    _forged(recipe, 1)
