"""Comparing data recipes: what a checkpoint was taken with against what is running now.

A recipe is the JSON-like description of everything that decides the data order (datasets,
seed, mixture, chunking, lanes, operators). Restoring a checkpoint into another recipe would
silently continue a different data order, so restores compare them first and name every
difference.

Example:
    >>> recipe_differences({"seed": 1, "chunk_size": 8}, {"seed": 2, "chunk_size": 8})
    ['seed: 1 in the checkpoint, 2 here']
"""

from __future__ import annotations

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
    if isinstance(saved, list) and isinstance(current, list) and len(saved) == len(current):
        return [d for i, (a, b) in enumerate(zip(saved, current)) for d in _differences(a, b, f"{path}[{i}]")]
    if saved != current:
        return [f"{path or 'recipe'}: {saved!r} in the checkpoint, {current!r} here"]
    return []


def _normalize(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True, default=str))
