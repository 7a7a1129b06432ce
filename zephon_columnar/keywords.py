"""Misspelt keywords and option values: answers that name the closest valid one.

`suggest_keywords` wraps a public call (a builder, a constructor, ``to_training``) so that an
unknown keyword argument is still Python's ``TypeError``, but one that says which keyword was
meant, or lists them all; the call's signature is unchanged (``functools.wraps``: what
``inspect.signature`` and ``tests/test_builder_signatures.py`` see). `suggest_keywords_of` does it
for every public method of a class, once. `choice` checks a string option with a fixed set of
values and answers a wrong one with a `ConfigError` naming the option, the closest value and
all of them.

Example:
    >>> @suggest_keywords
    ... def shuffle(buffer_size=None, *, seed=0):
    ...     return buffer_size
    >>> shuffle(buffer=8)
    Traceback (most recent call last):
    ...
    TypeError: shuffle() got an unexpected keyword argument 'buffer'; did you mean 'buffer_size'?
    >>> try:
    ...     choice("shuffle", "algorithm", "blok", ("streaming", "block"))
    ... except ValueError as err:  # a ConfigError
    ...     print(err)
    shuffle(algorithm='blok'): algorithm must be one of ['streaming', 'block']; did you mean 'block'?
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ParamSpec, TypeVar

import numpy as np

from zephon_columnar.errors import ConfigError

P = ParamSpec("P")
R = TypeVar("R")
C = TypeVar("C", bound=type)

#: Words other libraries use for a keyword that has another name here (Hugging Face's
#: ``add_special_tokens`` is ``tokenize``'s ``special_tokens``): offered before difflib's guess.
ALIASES: Mapping[str, str] = {
    "add_special_tokens": "special_tokens",
    "format": "fmt",
    "shuffle": "shuffle_strategy",
    "seq_len": "max_length",
    "sequence_length": "max_length",
    "batch_size": "microbatch_size",
}


def closest(word: str, valid: Iterable[str], *, aliases: Mapping[str, str] = ALIASES) -> str | None:
    """The valid word ``word`` most likely misspells (an alias first), or None.

    Example:
        >>> closest("buffer", ["buffer_size", "seed"]), closest("add_special_token", ["field", "special_tokens"])
        ('buffer_size', 'special_tokens')
    """
    valid = list(valid)
    alias = aliases.get(word) or aliases.get(word + "s")
    if alias in valid:
        return alias
    close = difflib.get_close_matches(word, valid, n=1, cutoff=0.6)
    if close:
        return close[0]
    prefixed = [v for v in valid if v.startswith(word) or word.startswith(v)]
    return prefixed[0] if len(prefixed) == 1 else None


def unknown_keyword_error(where: str, unknown: Iterable[str], valid: Iterable[str]) -> TypeError:
    """Python's unexpected-keyword ``TypeError`` for ``where``, with the keyword meant (or the list).

    Example:
        >>> print(unknown_keyword_error("Pipeline.batch()", ["dropp"], ["microbatch_size", "drop_last"]))
        Pipeline.batch() got an unexpected keyword argument 'dropp'; its keywords are ['microbatch_size', 'drop_last'].
    """
    valid = list(valid)
    parts = []
    for name in unknown:
        meant = closest(name, valid)
        hint = f"did you mean {meant!r}?" if meant else f"its keywords are {valid}."
        parts.append(f"{where} got an unexpected keyword argument {name!r}; {hint}")
    return TypeError(" ".join(parts))


def _where(fn: Callable[..., Any]) -> str:
    """``Pipeline.tokenize()``, or ``StaticMixtureWorkSource()`` for a constructor."""
    name = fn.__qualname__
    return f"{name.removesuffix('.__init__')}()"


def suggest_keywords(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn``, but an unknown keyword argument raises a TypeError naming the one meant.

    A function with ``**kwargs`` is returned as it is (every keyword is valid there). The check
    is a set lookup per keyword given, before the call; the signature is ``fn``'s.
    """
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return fn
    named = frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    positional_only = frozenset(p.name for p in params if p.kind is p.POSITIONAL_ONLY)
    shown = [p.name for p in params if p.name in named and p.name not in ("self", "cls")]
    where = _where(fn)

    @functools.wraps(fn)
    def checked(*args: P.args, **kwargs: P.kwargs) -> R:
        if not named.issuperset(kwargs):
            unknown = [k for k in kwargs if k not in named and k not in positional_only]
            if unknown:  # else Python's own answer (a positional-only parameter passed by name)
                raise unknown_keyword_error(where, unknown, shown)
        return fn(*args, **kwargs)

    return checked


def suggest_keywords_of(cls: C) -> C:
    """Apply `suggest_keywords` to every public method of ``cls`` (and ``__init__``), its
    class and static methods included; properties and attributes are left as they are."""
    for name, attr in list(vars(cls).items()):
        if name.startswith("_") and name != "__init__":
            continue
        if isinstance(attr, classmethod):
            setattr(cls, name, classmethod(suggest_keywords(attr.__func__)))
        elif isinstance(attr, staticmethod):
            setattr(cls, name, staticmethod(suggest_keywords(attr.__func__)))
        elif inspect.isfunction(attr) and attr.__qualname__.startswith(f"{cls.__qualname__}."):
            setattr(cls, name, suggest_keywords(attr))
    return cls


def choice(where: str, option: str, value: Any, values: Iterable[Any]) -> Any:
    """``value`` when it is one of ``values``, else a `ConfigError` naming ``where``'s
    ``option``, the value, the closest valid one and all of them.

    Example:
        >>> choice("tokenize", "special_tokens", "eos", ("bos_eos", "eos"))
        'eos'
    """
    values = list(values)
    if any(value is v or (type(value) is type(v) and value == v) for v in values):
        return value
    strings = [v for v in values if isinstance(v, str)]
    meant = closest(value, strings, aliases={}) if isinstance(value, str) else None
    hint = f"; did you mean {meant!r}?" if meant else "."
    if isinstance(value, bool) and None in values and strings:  # shuffle_strategy=True: a switch, not a value
        hint = f"; for {value} pass {strings[0] if value else None!r}."
    kind = "" if isinstance(value, str) or value is None else f" (a {type(value).__name__})"
    # "<option> must be one of" is Zephon's wording, which its users' tests match.
    raise ConfigError(f"{where}({option}={value!r}){kind}: {option} must be one of {values}{hint}")


def flag(where: str, option: str, value: Any) -> bool:
    """``value`` as a bool when it is one (numpy's too), else a `ConfigError`: ``"yes"`` or
    ``1`` for a flag is refused rather than read as true.

    Example:
        >>> flag("batch", "drop_last", "yes")
        Traceback (most recent call last):
        ...
        zephon_columnar.errors.ConfigError: batch(drop_last='yes') (a str): pass True or False.
    """
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ConfigError(f"{where}({option}={value!r}) (a {type(value).__name__}): pass True or False.")


__all__ = ["ALIASES", "choice", "closest", "flag", "suggest_keywords", "suggest_keywords_of", "unknown_keyword_error"]
