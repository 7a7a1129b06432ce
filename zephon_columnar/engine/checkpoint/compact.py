"""A lane's work-source state as a checkpoint writes it: the per-component maps of a wide
mixture, compactly.

A work source's state (Zephon's layout) holds a dozen maps keyed by component, in the order of
its ``component_order`` (cursors, positions, epochs, weights, policies, ...). With hundreds of
datasets they are almost all of a checkpoint (~420 bytes a dataset in every lane), though most
entries repeat one value: a dataset not read yet is at position 0 of epoch 0. From
`COMPACT_FROM` components on, each such map is written as the value most of its entries share
and the entries that differ (``{"<common>": v, "<except>": {...}}``), or, where no value is
shared by half of them, as its values in component order (``{"<in_order>": [...]}``). A dataset
then costs a few bytes in each lane until it is read. The component order and the datasets'
ids, which the recipe already holds, are not written again. `expanded` gives back the very dict.

Example:
    >>> order = [f"d{i}" for i in range(8)]
    >>> state = {"component_order": order, "positions": {c: 0 for c in order},
    ...          "ids": {c: i for i, c in enumerate(order)}}
    >>> state["positions"]["d3"] = 7
    >>> small = compacted(state)
    >>> small["positions"], small["ids"]
    ({'<common>': 0, '<except>': {'d3': 7}}, {'<in_order>': [0, 1, 2, 3, 4, 5, 6, 7]})
    >>> expanded(small, "lanes.0.source_state") == state
    True
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Mapping
from typing import Any

from zephon_columnar.errors import CheckpointError

#: Mixtures of fewer components are written as they are.
COMPACT_FROM = 8
_COMMON, _EXCEPT, _IN_ORDER, _FROM_RECIPE, _COLUMNS = "<common>", "<except>", "<in_order>", "<from recipe>", "<columns>"


def _order(state: Mapping[str, Any]) -> list[str] | None:
    order = state.get("component_order")
    if isinstance(order, list) and len(order) >= COMPACT_FROM and all(isinstance(c, str) for c in order):
        return order
    return None


def _from_recipe(work_source: Any) -> dict[str, Any]:
    """What a work-source state repeats of its recipe (``recipe.work_source``): the components
    in the mixture's order, and each dataset's id (its place in the recipe's datasets)."""
    out: dict[str, Any] = {}
    if isinstance(work_source, Mapping):
        mixture, datasets = work_source.get("mixture"), work_source.get("datasets")
        if isinstance(mixture, Mapping):
            out["component_order"] = list(mixture)
        if isinstance(datasets, list) and all(isinstance(d, Mapping) and "name" in d for d in datasets):
            out["dataset_ids"] = {d["name"]: i for i, d in enumerate(datasets)}
    return out


def compacted(state: Mapping[str, Any], work_source: Any = None, *, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """``state`` with each map keyed by its ``component_order`` written compactly, and what
    it repeats of ``work_source`` (its recipe) named instead (a wide mixture's; others
    unchanged)."""
    order = _order(state)
    out = dict(state)
    if order is None:
        return out
    for key, value in _from_recipe(work_source).items():
        if state.get(key) == value:
            out[key] = _FROM_RECIPE
    for key, value in state.items():
        if isinstance(value, Mapping) and list(value) == order and out[key] != _FROM_RECIPE and key not in skip:
            texts = [json.dumps(v, sort_keys=True) for v in value.values()]
            shared, count = Counter(texts).most_common(1)[0]
            if 2 * count >= len(order):
                common = value[order[texts.index(shared)]]
                out[key] = {_COMMON: common, _EXCEPT: {c: value[c] for c, t in zip(order, texts) if t != shared}}
            else:
                out[key] = {_IN_ORDER: list(value.values())}
    return out


def compacted_recipe(recipe: Mapping[str, Any]) -> dict[str, Any]:
    """A checkpoint's ``recipe`` with its work source's per-dataset entries written compactly (a
    wide mixture's): the maps keyed by the mixture's components (policies, block sizes, ...) as
    `compacted` writes them, and the list of datasets as one list per field
    (``{"<columns>": {"name": [...], "rows": [...], ...}}``). The mixture's weights stay as
    they are: they give the order."""
    work_source = recipe.get("work_source")
    if not isinstance(work_source, Mapping) or not isinstance(work_source.get("mixture"), Mapping):
        return dict(recipe)
    order = list(work_source["mixture"])
    ws = compacted(dict(work_source, component_order=order), skip=("mixture",))
    del ws["component_order"]
    datasets = ws.get("datasets")
    if len(order) >= COMPACT_FROM and isinstance(datasets, list) and datasets:
        fields = list(datasets[0]) if isinstance(datasets[0], Mapping) else None
        if fields and all(isinstance(d, Mapping) and list(d) == fields for d in datasets):
            ws["datasets"] = {_COLUMNS: {f: [d[f] for d in datasets] for f in fields}}
    return dict(recipe, work_source=ws)


def expanded_recipe(recipe: Mapping[str, Any], where: str = "recipe") -> dict[str, Any]:
    """The recipe `compacted_recipe` wrote, whole again."""
    work_source = recipe.get("work_source")
    if not isinstance(work_source, Mapping) or not isinstance(work_source.get("mixture"), Mapping):
        return dict(recipe)
    ws = dict(work_source)
    datasets = ws.get("datasets")
    if isinstance(datasets, Mapping) and set(datasets) == {_COLUMNS}:
        columns = datasets[_COLUMNS]
        lengths = {len(v) for v in columns.values()} if isinstance(columns, Mapping) else set()
        if not (
            isinstance(columns, Mapping) and all(isinstance(v, list) for v in columns.values()) and len(lengths) == 1
        ):
            raise CheckpointError(f"checkpoint {where}.work_source.datasets: columns of one length expected; damaged.")
        ws["datasets"] = [dict(zip(columns, row)) for row in zip(*columns.values())]
    whole = expanded(dict(ws, component_order=list(ws["mixture"])), f"{where}.work_source")
    del whole["component_order"]
    return dict(recipe, work_source=whole)


def expanded(state: Mapping[str, Any], where: str, work_source: Any = None) -> dict[str, Any]:
    """The state `compacted` wrote (with the same ``work_source``), whole again; a compact map
    that does not fit its ``component_order`` is a `CheckpointError` naming it (``where``: the
    state's path)."""
    out = dict(state)
    for key, value in _from_recipe(work_source).items():
        if out.get(key) == _FROM_RECIPE:
            out[key] = value
    order = _order(out)
    if order is None:
        return out
    for key, value in out.items():
        if not isinstance(value, Mapping):
            continue
        if set(value) == {_IN_ORDER}:
            values = value[_IN_ORDER]
            if not isinstance(values, list) or len(values) != len(order):
                raise CheckpointError(
                    f"checkpoint {where}.{key}: {len(order)} values in component order expected; the checkpoint "
                    "is damaged."
                )
            out[key] = dict(zip(order, values))
        elif set(value) == {_COMMON, _EXCEPT}:
            differ = value[_EXCEPT]
            if not isinstance(differ, Mapping) or not set(differ) <= set(order):
                raise CheckpointError(
                    f"checkpoint {where}.{key}: its exceptions name components outside component_order; the "
                    "checkpoint is damaged."
                )
            common = value[_COMMON]
            out[key] = {c: differ[c] if c in differ else copy.deepcopy(common) for c in order}
    return out
