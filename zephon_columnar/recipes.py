"""Comparing data recipes: what a checkpoint was taken with against what is running now.

A recipe is the JSON-like description of everything that decides the data order (datasets,
seed, mixture, chunking, lanes, operators). Restoring a checkpoint into another recipe would
silently continue a different data order, so restores compare them first and name every
difference.

Example:
    >>> recipe_differences({"seed": 1, "chunk_size": 8}, {"seed": 2, "chunk_size": 8})
    ['seed: 1 in the checkpoint, 2 here']
    >>> shuffle, pack = {"op": "shuffle", "seed": 1}, {"op": "pack_flat", "max_length": 8}
    >>> recipe_differences({"ops": [shuffle, pack]}, {"ops": [{**shuffle, "seed": 2}, pack]})
    ['ops[0] (shuffle).seed: 1 in the checkpoint, 2 here']
    >>> recipe_differences({"ops": [shuffle, pack]}, {"ops": [pack]})
    ['ops[0] (shuffle): in the checkpoint, absent here (shuffle(seed=1))']
"""

from __future__ import annotations

import difflib
import hashlib
import json
from typing import Any


def recipe_differences(saved: Any, current: Any, path: str = "") -> list[str]:
    """Human-readable differences between a saved recipe and the current one, one per leaf
    (dict keys recursively, lists element by element when their lengths match). Values are
    compared through JSON, so a tuple equals the list a JSON round trip makes of it."""
    return _differences(_normalize(saved), _normalize(current), path)


def _differences(saved: Any, current: Any, path: str) -> list[str]:
    if isinstance(saved, dict) and isinstance(current, dict):
        out = []
        for key in sorted(set(saved) | set(current)):
            sub = f"{path}.{key}" if path else str(key)
            if key not in saved:
                out.append(f"{sub}: absent in the checkpoint, {current[key]!r} here")
            elif key not in current:
                out.append(f"{sub}: {saved[key]!r} in the checkpoint, absent here")
            else:
                out.extend(_differences(saved[key], current[key], sub))
        return out
    if isinstance(saved, list) and isinstance(current, list) and _is_op_list(saved) and _is_op_list(current):
        return _op_differences(saved, current, path)
    if isinstance(saved, list) and isinstance(current, list) and len(saved) == len(current):
        return [d for i, (a, b) in enumerate(zip(saved, current)) for d in _differences(a, b, f"{path}[{i}]")]
    if saved != current:
        return [f"{path or 'recipe'}: {saved!r} in the checkpoint, {current!r} here"]
    return []


def _is_op_list(value: list[Any]) -> bool:
    """An operator list: each item an operator's fingerprint, ``{"op": name, argument: value}``."""
    return bool(value) and all(isinstance(v, dict) and isinstance(v.get("op"), str) for v in value)


def _call(op: dict[str, Any]) -> str:
    """``shuffle(seed=1, buffer_size=8)``: an operator's fingerprint as the call that made it."""
    return f"{op['op']}({', '.join(f'{k}={v!r}' for k, v in op.items() if k != 'op')})"


def _op_differences(saved: list[dict[str, Any]], current: list[dict[str, Any]], path: str) -> list[str]:
    """The operators that differ, each by position and name: the same operator with another
    argument (``ops[1] (shuffle).seed``), one only in the checkpoint or only here, or another
    operator in its place. The two lists are aligned by operator name, so one operator added or
    removed names that one, not every operator after it."""
    out: list[str] = []
    names = difflib.SequenceMatcher(None, [o["op"] for o in saved], [o["op"] for o in current], autojunk=False)
    for tag, i1, i2, j1, j2 in names.get_opcodes():
        if tag == "equal":
            for i, j in zip(range(i1, i2), range(j1, j2)):
                at = f"{path}[{i}]" if i == j else f"{path}[{i}] (here [{j}])"
                out += _differences(saved[i], current[j], f"{at} ({saved[i]['op']})")
            continue
        if tag == "replace":
            for i, j in zip(range(i1, i2), range(j1, j2)):
                out.append(
                    f"{path}[{i}]: {saved[i]['op']} in the checkpoint, {current[j]['op']} here "
                    f"(checkpoint: {_call(saved[i])}; here: {_call(current[j])})"
                )
            i1, j1 = i1 + min(i2 - i1, j2 - j1), j1 + min(i2 - i1, j2 - j1)
        out += [
            f"{path}[{i}] ({saved[i]['op']}): in the checkpoint, absent here ({_call(saved[i])})" for i in range(i1, i2)
        ]
        out += [
            f"{path}[{j}] ({current[j]['op']}): absent in the checkpoint, here ({_call(current[j])})"
            for j in range(j1, j2)
        ]
    return out


def _normalize(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def callable_identity(fn: Any) -> str:
    """Best-effort stable identity of a callable a recipe names (an HF-like tokenizer, a token
    counter): its class, ``name_or_path``, a hash of its vocabulary when it has ``get_vocab``, and
    its special token ids.

    Example:
        >>> callable_identity(len).startswith("callable:builtins.builtin_function_or_method|")
        True
    """
    cls = type(fn)
    parts = [f"{cls.__module__}.{cls.__qualname__}", str(getattr(fn, "name_or_path", ""))]
    get_vocab = getattr(fn, "get_vocab", None)
    if callable(get_vocab):
        try:
            vocab = json.dumps(sorted(get_vocab().items()))
        except Exception:  # noqa: BLE001 - identity is best effort: class and name then
            vocab = ""
        parts.append(hashlib.sha256(vocab.encode()).hexdigest())
    for key in ("bos", "eos", "pad"):
        parts.append(f"{key}={getattr(fn, f'{key}_token_id', None)}")
    return "callable:" + "|".join(parts)
