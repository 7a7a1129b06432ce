"""The static source scan: the source of an op's user-written pure part (``process_many`` /
``process_one`` / ``process_columns``, or the kwargs form's functions) is parsed and searched
for writes to ``self`` (``OP_WRITES_TO_SELF``) and for calls that read the clock or unseeded
randomness (``OP_NONDETERMINISTIC_STDLIB_CALL``), resolved through the function's imports,
closure and globals. Also finds those user functions, which the operator checks read the
captured state of."""

from __future__ import annotations

import ast
import builtins
import functools
import inspect
import linecache
import types
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from zephon_columnar.validation.report import Issue

if TYPE_CHECKING:
    from zephon_columnar.ops.base import BaseOp


#: Methods whose call changes the object they are called on.
_MUTATING_METHODS = frozenset(
    {
        "append",
        "extend",
        "insert",
        "pop",
        "popitem",
        "remove",
        "clear",
        "update",
        "setdefault",
        "add",
        "discard",
        "sort",
        "reverse",
        "__setitem__",
        "__delitem__",
    }
)


def check_source(op: BaseOp, name: str) -> list[Issue]:
    """Warnings from the source of the op's pure part: writes to ``self``, and calls that read
    the clock or unseeded randomness."""
    issues = []
    for label, fn, is_method in user_functions(op):
        found = _function_source(fn, is_method)
        if found is None:
            continue  # no source to read (REPL, exec, builtin): nothing to say
        writes = _self_writes(found.node, found.receiver) if found.receiver else []
        if writes:
            issues.append(
                Issue(
                    "warning",
                    "OP_WRITES_TO_SELF",
                    name,
                    (
                        f"{label} writes to {found.receiver} ({found.show(writes)}). Configuration belongs in "
                        "__init__, per-worker resources in setup(), and state across calls in the accumulator "
                        "(accumulator())."
                    ),
                )
            )
        calls = _nondeterministic_calls(found.node, found.fn)
        if calls:
            issues.append(
                Issue(
                    "warning",
                    "OP_NONDETERMINISTIC_STDLIB_CALL",
                    name,
                    (
                        f"{label} reads the clock or unseeded randomness ({found.show(calls)}), which breaks replay. "
                        "Seed a generator from the record (random.Random(hash(record.meta.sample_id))) or from a seed "
                        "given to __init__; keep the clock out of the data."
                    ),
                )
            )
    return issues


def user_functions(op: BaseOp) -> list[tuple[str, Any, bool]]:
    """(label, callable, whether it is a method of the op) for the op's user-written pure part:
    the kwargs form's functions, or an instance's own process_many / process_one /
    process_columns (this library's defaults are skipped)."""
    from zephon_columnar.ops.user import FunctionOp

    if isinstance(op, FunctionOp):
        return [(label, fn, False) for label, fn in op.given_functions() if fn is not None]
    out = []
    for label in ("process_many", "process_one", "process_columns"):
        fn = inspect.getattr_static(type(op), label, None)
        if isinstance(fn, (staticmethod, classmethod)):
            fn = fn.__func__
        if isinstance(fn, types.FunctionType) and not (fn.__module__ or "").startswith("zephon_columnar."):
            out.append((label, fn, True))
    return out


def code_function(fn: Any) -> types.FunctionType | None:
    """The Python function whose code runs when ``fn`` is called (None: not Python code)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if isinstance(fn, types.MethodType):
        fn = fn.__func__
    if not isinstance(fn, types.FunctionType) and callable(fn):
        fn = getattr(type(fn), "__call__", None)  # noqa: B004 - not a callable() test: a callable object's class's __call__
    return fn if isinstance(fn, types.FunctionType) else None


@dataclass(frozen=True)
class _Source:
    """A user function's parsed source: its ``def``/``lambda`` node, the function, the name of
    its receiver (``self``; None for a plain function) and its file's lines."""

    node: ast.AST
    fn: types.FunctionType
    receiver: str | None
    lines: list[str]

    def show(self, line_numbers: list[int], limit: int = 4) -> str:
        shown = ", ".join(f"line {n}: {self.lines[n - 1].strip()[:80]}" for n in line_numbers[:limit])
        return shown + (f" (+{len(line_numbers) - limit} more)" if len(line_numbers) > limit else "")


def _function_source(fn: Any, is_method: bool) -> _Source | None:
    """``fn``'s `_Source`, or None when its source cannot be read."""
    code_fn = code_function(fn)
    if code_fn is None:
        return None
    bound = is_method or isinstance(fn, types.MethodType) or not isinstance(fn, (types.FunctionType, functools.partial))
    params = code_fn.__code__.co_varnames[: code_fn.__code__.co_argcount]
    receiver = params[0] if bound and params else None
    try:
        path = inspect.getsourcefile(code_fn)
    except TypeError:
        return None
    lines = linecache.getlines(path, code_fn.__globals__) if path else []
    if not lines:
        return None
    tree = _parsed("".join(lines))
    if tree is None:
        return None
    code = code_fn.__code__
    matches = [n for n in ast.walk(tree) if _defines(n, code)]
    return _Source(matches[0], code_fn, receiver, lines) if len(matches) == 1 else None


@functools.lru_cache(maxsize=16)
def _parsed(source: str) -> ast.AST | None:
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):
        return None


def _defines(node: ast.AST, code: types.CodeType) -> bool:
    """Whether ``node`` is the ``def`` or ``lambda`` that compiled to ``code``."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        return node.name == code.co_name and first == code.co_firstlineno
    if isinstance(node, ast.Lambda):
        args = [a.arg for a in node.args.posonlyargs + node.args.args]
        return (
            code.co_name == "<lambda>"
            and node.lineno == code.co_firstlineno
            and args == list(code.co_varnames[: code.co_argcount])
        )
    return False


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _self_writes(tree: ast.AST, receiver: str) -> list[int]:
    """Lines where ``tree`` stores into ``receiver.<attr>`` (assignment, augmented assignment,
    del, item store), mutates it in place (``self.seen.append(...)``) or calls setattr on it."""
    hits = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, (ast.Attribute, ast.Subscript))
            and isinstance(node.ctx, (ast.Store, ast.Del))
            and _root_name(node) == receiver
        ):
            hits.add(node.lineno)
        elif isinstance(node, ast.Call):
            func = node.func
            if (
                isinstance(func, ast.Attribute)
                and func.attr in _MUTATING_METHODS
                and not isinstance(func.value, ast.Name)
                and _root_name(func.value) == receiver
            ) or (
                isinstance(func, ast.Name)
                and func.id in ("setattr", "delattr")
                and node.args
                and isinstance(node.args[0], ast.Name)
                and node.args[0].id == receiver
            ):
                hits.add(node.lineno)
    return sorted(hits)


@dataclass(frozen=True)
class _Rule:
    """A call that reads the clock or unseeded randomness; with ``max_args`` set, only when
    given at most that many arguments (``random.Random()`` is unseeded, ``random.Random(7)``
    is not; ``time.localtime()`` reads the clock, ``time.localtime(t)`` does not)."""

    name: str
    max_args: int | None = None


@functools.lru_cache(maxsize=1)
def _nondeterministic_rules() -> dict[str, _Rule]:
    """The qualified names the static scan flags."""
    import random
    import secrets

    rules = [
        _Rule(f"random.{n}")
        for n in dir(random)
        if not n.startswith("_")
        and n not in ("Random", "SystemRandom", "seed", "getstate", "setstate")
        and callable(getattr(random, n))
        and not isinstance(getattr(random, n), type)
    ]
    rules += [_Rule("random.SystemRandom"), _Rule("random.Random", 0), _Rule("random.seed", 0)]
    rules += [
        _Rule(f"time.{n}")
        for n in (
            "time",
            "time_ns",
            "monotonic",
            "monotonic_ns",
            "perf_counter",
            "perf_counter_ns",
            "process_time",
            "process_time_ns",
            "thread_time",
            "thread_time_ns",
        )
    ]
    rules += [_Rule(f"time.{n}", 0) for n in ("ctime", "localtime", "gmtime", "asctime")] + [_Rule("time.strftime", 1)]
    rules += [_Rule("uuid.uuid1"), _Rule("uuid.uuid4"), _Rule("os.urandom")]
    rules += [
        _Rule(f"secrets.{n}")
        for n in dir(secrets)
        if not n.startswith("_") and callable(getattr(secrets, n)) and n not in ("compare_digest",)
    ]
    try:
        import numpy.random as npr

        seeded = ("default_rng", "RandomState", "seed")
        kept = (
            "Generator",
            "SeedSequence",
            "BitGenerator",
            "MT19937",
            "PCG64",
            "PCG64DXSM",
            "Philox",
            "SFC64",
            "get_state",
            "set_state",
            "get_bit_generator",
            "set_bit_generator",
        )
        rules += [
            _Rule(f"numpy.random.{n}", 0 if n in seeded else None) for n in getattr(npr, "__all__", ()) if n not in kept
        ]
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    return {r.name: r for r in rules}


@functools.lru_cache(maxsize=1)
def _rules_by_object() -> dict[int, str]:
    """id(the object) -> qualified name, for every flagged name that resolves to an object: calls
    through aliases (``from random import random as r``) are found by identity."""
    import importlib

    found: dict[int, str] = {}
    for qualname in _nondeterministic_rules():
        module, _, attr = qualname.rpartition(".")
        try:
            found[id(getattr(importlib.import_module(module), attr))] = qualname
        except (ImportError, AttributeError):
            continue
    return found


def _nondeterministic_calls(tree: ast.AST, fn: types.FunctionType) -> list[int]:
    """Lines of calls in ``tree`` to a flagged function, however its module was imported."""
    rules = _nondeterministic_rules()
    imports = _local_imports(tree)
    hits = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        qualname = _qualified_call(node.func, fn, imports)
        rule = rules.get(qualname) if qualname else None
        if rule and (rule.max_args is None or len(node.args) + len(node.keywords) <= rule.max_args):
            hits.add(node.lineno)
    return sorted(hits)


def _local_imports(tree: ast.AST) -> dict[str, str]:
    """Names bound by ``import`` statements inside the function -> what they name."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    bound[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return bound


def _qualified_call(func: ast.AST, fn: types.FunctionType, imports: dict[str, str]) -> str | None:
    """The qualified name a called expression ``a.b.c`` refers to, resolved through the
    function's local imports, closure and globals (None: not a dotted name)."""
    parts: list[str] = []
    while isinstance(func, ast.Attribute):
        parts.insert(0, func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return None
    root, rest = func.id, parts
    if root in imports:
        return _canonical(".".join([imports[root], *rest]))
    scope = dict(zip(fn.__code__.co_freevars, [_cell(c) for c in fn.__closure__ or ()]))
    missing = object()
    obj = scope.get(root, fn.__globals__.get(root, getattr(builtins, root, missing)))
    if obj is missing:  # unknown name: trust the spelling (``random.random()``)
        return _canonical(".".join([root, *rest]))
    for attr in rest:
        if not isinstance(obj, types.ModuleType):
            return None  # a method of some object (a seeded generator): not a module function
        obj = getattr(obj, attr, missing)
        if obj is missing:
            return None
    return _rules_by_object().get(id(obj))


def _cell(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:
        return None


def _canonical(dotted: str) -> str:
    return "numpy." + dotted[len("np.") :] if dotted.startswith("np.") else dotted
