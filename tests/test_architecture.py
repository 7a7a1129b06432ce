"""The package's import graph, read from its source: layers, and no import cycles.

Imports run down the layers (see ``LAYERS``): a module may import its own layer and the ones
below, never one above, not even for type annotations. Import cycles are counted over what runs
(module-level and deferred imports inside functions alike); imports under ``if TYPE_CHECKING:``
only name types and are left out of the cycle check. A module's import of its own parent
package is not an edge (the parent imports its children).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "zephon_columnar"
PACKAGE = "zephon_columnar"

#: Bottom first: each layer and the top-level modules or packages in it.
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    (
        "core",
        frozenset(
            {"compatibility", "device", "errors", "frame", "keywords", "losses", "records", "references", "memory", "recipes", "training", "types", "observability"}
        ),
    ),
    ("io", frozenset({"io"})),
    ("work", frozenset({"work"})),
    ("ops", frozenset({"ops"})),
    ("options", frozenset({"options"})),
    ("engine", frozenset({"engine"})),
    (
        "api",
        frozenset(
            {
                "",  # the package's __init__
                "__main__",
                "build_index",
                "cli",
                "debug",
                "pipeline",
                "progress",
                "session",
                "testing",
                "torch",
                "validation",
            }
        ),
    ),
)

@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    type_only: bool


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE_DIR.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes inside ``if TYPE_CHECKING:`` blocks."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else ""
            if name == "TYPE_CHECKING":
                inside.update(id(n) for block in node.body for n in ast.walk(block))
    return inside


def _edges(modules: dict[str, Path]) -> Iterator[Edge]:
    def owner(name: str) -> str:
        while name not in modules:
            name = name.rpartition(".")[0]
        return name

    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), filename=str(path))
        type_only = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [owner(a.name) for a in node.names if a.name.split(".")[0] == PACKAGE]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = module.split(".") if is_package else module.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                if base.split(".")[0] != PACKAGE:
                    continue
                # `from package import submodule` depends on the submodule itself.
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in modules else owner(base) for a in node.names
                ]
            for target in targets:
                if target != module and not module.startswith(target + "."):
                    yield Edge(module, target, node.lineno, id(node) in type_only)


def _layer_of(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    for rank, (_, members) in enumerate(LAYERS):
        if top in members:
            return rank
    raise AssertionError(f"{module} is in no layer: add its top-level name to LAYERS in {__file__}.")


def _cycles(edges: list[Edge], modules: dict[str, Path]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for e in edges:
        if not e.type_only:
            graph[e.source].add(e.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


@pytest.fixture(scope="module")
def graph() -> tuple[dict[str, Path], list[Edge]]:
    modules = _modules()
    return modules, list(_edges(modules))


def test_the_graph_is_read(graph: tuple[dict[str, Path], list[Edge]]) -> None:
    modules, edges = graph
    assert {f"{PACKAGE}.pipeline", f"{PACKAGE}.engine.engine", f"{PACKAGE}.io.parquet"} <= set(modules)
    # A module-level, a deferred and a type-only import the package is known to have.
    assert any(e.source == f"{PACKAGE}.engine.engine" and e.target == f"{PACKAGE}.engine.lane" for e in edges)
    assert any(e.source == f"{PACKAGE}.engine.lane.chain" and e.target.startswith(f"{PACKAGE}.engine.lane.") for e in edges)
    assert any(e.source == f"{PACKAGE}.engine.runners.waits" and e.target == f"{PACKAGE}.errors" for e in edges)
    assert any(e.type_only and e.source == f"{PACKAGE}.engine.lane.snapshot" for e in edges)


def test_imports_run_down_the_layers(graph: tuple[dict[str, Path], list[Edge]]) -> None:
    _, edges = graph
    upward = [
        f"{e.source} (line {e.line}{', type only' if e.type_only else ''}) imports {e.target}: "
        f"layer {LAYERS[_layer_of(e.source)][0]} -> {LAYERS[_layer_of(e.target)][0]}"
        for e in edges
        if _layer_of(e.target) > _layer_of(e.source)
    ]
    assert not upward, "imports up the layers:\n" + "\n".join(upward)


def test_no_import_cycles(graph: tuple[dict[str, Path], list[Edge]]) -> None:
    modules, edges = graph
    cycles = _cycles(edges, modules)
    assert not cycles, f"import cycles: {[sorted(c) for c in cycles]}"


def test_the_cycle_finder_finds_a_cycle() -> None:
    modules = {name: Path(name) for name in ("p.a", "p.b", "p.c", "p.d")}
    edges = [
        Edge("p.a", "p.b", 1, False),
        Edge("p.b", "p.c", 1, False),
        Edge("p.c", "p.a", 1, False),
        Edge("p.c", "p.d", 1, False),
        Edge("p.d", "p.c", 1, True),  # type only: no cycle through d
    ]
    assert _cycles(edges, modules) == [frozenset({"p.a", "p.b", "p.c"})]


RUNNER_NAMES = frozenset({"inline", "threads", "process", "remote", "ray"})


def _runner_name_comparisons(tree: ast.AST) -> list[int]:
    """Lines comparing a value with a runner name (``==``, ``!=``, ``in``, ``not in``)."""
    def names_in(node: ast.expr) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in RUNNER_NAMES
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(isinstance(e, ast.Constant) and e.value in RUNNER_NAMES for e in node.elts)
        return False

    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare)
        and any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops)
        and any(names_in(side) for side in (node.left, *node.comparators))
    ]


def test_no_runner_name_is_compared_outside_the_runner_registry() -> None:
    # What the engine does differently for a runner is a trait the runner declares
    # (engine/runners/base.py: RunnerTraits); comparing names is how explain() once printed
    # place=local for the Ray runner ('ray' had already been resolved to 'remote').
    found = [
        f"{path.relative_to(PACKAGE_DIR.parent)}:{line}"
        for module, path in _modules().items()
        if not module.startswith(f"{PACKAGE}.engine.runners")
        for line in _runner_name_comparisons(ast.parse(path.read_text()))
    ]
    assert not found, "runner names compared (read RunnerTraits instead):\n" + "\n".join(found)


def test_the_runner_name_finder_finds_a_comparison() -> None:
    tree = ast.parse('x = runner == "ray"\ny = name in ("process", "remote")\nz = kind == "tokenizers"\n')
    assert _runner_name_comparisons(tree) == [1, 2]


# ---------------------------------------------------------------------- the lane
LANE = f"{PACKAGE}.engine.lane"
#: Where the two checkpoint modes may be told apart: the checkpoint package and the lane's start.
KNOWS_THE_MODES = (f"{PACKAGE}.engine.checkpoint", f"{LANE}.start")
LANE_MODULE_LINES = 400


def _mode_checks(tree: ast.AST) -> list[int]:
    """Lines that tell the checkpoint modes apart: ``isinstance(x, LaneSnapshot | LaneCursor)``
    or a comparison with ``"replay"`` / ``"reference"``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance":
            names = {n.id for arg in node.args[1:] for n in ast.walk(arg) if isinstance(n, ast.Name)}
            if names & {"LaneSnapshot", "LaneCursor"}:
                found.append(node.lineno)
        elif isinstance(node, ast.Compare) and any(
            isinstance(side, ast.Constant) and side.value in ("replay", "reference")
            for side in (node.left, *node.comparators)
        ):
            found.append(node.lineno)
    return found


def test_only_the_checkpoint_package_and_the_lane_start_know_the_checkpoint_modes() -> None:
    found = [
        f"{path.relative_to(PACKAGE_DIR.parent)}:{line}"
        for module, path in _modules().items()
        if not module.startswith(KNOWS_THE_MODES)
        for line in _mode_checks(ast.parse(path.read_text()))
    ]
    assert not found, "checkpoint modes told apart (use the lane's start and ledger):\n" + "\n".join(found)


def test_the_mode_finder_finds_a_check() -> None:
    tree = ast.parse('a = isinstance(s, LaneSnapshot)\nb = mode.by == "replay"\nc = isinstance(s, (int, LaneCursor))\n')
    assert _mode_checks(tree) == [1, 2, 3]


def test_the_lane_is_small_modules_that_need_no_engine(graph: tuple[dict[str, Path], list[Edge]]) -> None:
    modules, edges = graph
    lane = {name: path for name, path in modules.items() if name == LANE or name.startswith(f"{LANE}.")}
    assert len(lane) >= 8
    long = {name: n for name, path in lane.items() if (n := len(path.read_text().splitlines())) > LANE_MODULE_LINES}
    assert not long, f"lane modules over {LANE_MODULE_LINES} lines: {long}"
    needs_engine = [e for e in edges if e.source in lane and e.target in (f"{PACKAGE}.engine.engine", f"{PACKAGE}.session")]
    assert not needs_engine, f"the lane imports the engine: {needs_engine}"


def test_no_operator_class_is_named_under_the_engine() -> None:
    # What the engine reads about an operator is its traits (ops/traits.py) or a declared
    # protocol; a packer's "at most one composes rows" is `OpTraits.composes_rows`.
    named = [
        f"{path.relative_to(PACKAGE_DIR.parent)}:{node.lineno}"
        for module, path in _modules().items()
        if module.startswith(f"{PACKAGE}.engine")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Name) and node.id in ("PackFlatOp", "PackSequencesOp", "ShuffleOp", "EnsureMixtureOp")
    ]
    assert not named, "operator classes named under engine/:\n" + "\n".join(named)
