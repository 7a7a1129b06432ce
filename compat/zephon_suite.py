"""Zephon 0.2.0's own test suite, run against zephon_columnar: the drop-in compatibility harness.

Zephon's source distribution on the package index ships its test suite. This script downloads it
(never copied into this repository), runs its test files unchanged against zephon_columnar
through an import alias (``compat/alias/zephon``: ``zephon`` is ``zephon_columnar`` and
``zephon.X`` a view of ``zephon_columnar.X``), and reports, per file, what passes, what fails and
what is excluded, side by side with the same files run on Zephon 0.2.0 itself.

Commands (from the repository root)::

    python compat/zephon_suite.py fetch
    python compat/zephon_suite.py run --target columnar --out .compat/columnar.jsonl [FILES...]
    python compat/zephon_suite.py run --target zephon --python ZEPHON_VENV/bin/python --out F
    python compat/zephon_suite.py report --zephon compat/zephon-0.2.0-outcomes.jsonl \\
        --columnar .compat/columnar.jsonl

What "excluded" means: a test that reaches into Zephon's private modules (``zephon._internal``
and any ``zephon._X``) or private attributes is not our contract. The report names such a test
*private* when its own code, or a fixture or helper it uses from the same file, mentions a
private module, a name imported from one, or an ``obj._attribute`` (see :func:`private_tests`);
or when it failed on a placeholder (the alias's ``PrivateInternalUsed``: a private name, or a
name outside Zephon's declared ``__all__`` of its module). *Repository* tests check Zephon's
repository, not its API (`REPOSITORY_TESTS`). *Deliberate* differences are listed, with their
reasons, in docs/compatibility.md.

The one change to Zephon's files: its root ``conftest.py`` resets Zephon's private shard catalog
around every test (an autouse fixture); that fixture is removed for the zephon_columnar run.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".compat"
ZEPHON_VERSION = "0.2.0"
SDIST = WORK / f"zephon-{ZEPHON_VERSION}"
ALIAS_DIR = ROOT / "compat" / "alias"
PLUGIN_DIR = ROOT / "compat" / "plugin"
DIFFERENCES = ROOT / "docs" / "compatibility.md"
Target = Literal["columnar", "zephon"]

# The test trees Zephon's maintainers run (tests/packaging builds wheels; tests/typing runs pyright),
# fast unit tests first. Its private test tree (unit tests of zephon._internal) is not run at all.
SUITE = ("tests/zephon", "tests/test_examples.py", "tests/fuzzing", "tests/integration")
PRIVATE_TREE = "tests/zephon/_internal/"
#: Test files that check Zephon's repository rather than its API: they read Zephon's own source
#: and docs files from disk (with ast; they never import zephon), so they cannot apply to
#: another package. Excluded from the bar, named in the report.
REPOSITORY_TESTS = {
    "tests/zephon/test_api_reference.py": "compares Zephon's docs/source/api/*.rst with type aliases parsed "
                                          "from Zephon's own source files",
}
CATALOG_FIXTURE = "_isolated_shard_catalogs"


def fetch() -> Path:
    """Download and unpack Zephon's source distribution into ``.compat/`` (idempotent)."""
    if (SDIST / "tests").is_dir():
        return SDIST
    WORK.mkdir(exist_ok=True)
    archive = WORK / f"zephon-{ZEPHON_VERSION}.tar.gz"
    if not archive.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                        f"zephon=={ZEPHON_VERSION}", "-d", str(WORK)], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(WORK, filter="data")
    return SDIST


def _without_fixture(source: str, name: str) -> str:
    """``source`` with the top-level function ``name`` (and its decorators) cut out."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
            assert node.end_lineno is not None
            return "".join(lines[:first] + lines[node.end_lineno:])
    raise ValueError(f"conftest.py has no fixture {name!r}: the harness needs updating for this Zephon version")


def prepare(target: Target) -> Path:
    """A copy of the sdist to run the tests in."""
    fetch()
    # A fresh folder per run: runs may go on side by side.
    run_dir = Path(tempfile.mkdtemp(prefix=f"run-{target}-", dir=WORK))
    # Zephon's run keeps its package beside the tests (some tests read its source files); the
    # zephon_columnar run must not see it, or ``import zephon`` would find it before the alias.
    hidden = ("zephon", "zephon.egg-info") if target == "columnar" else ()

    def skipped(directory: str, names: list[str]) -> set[str]:
        at_root = Path(directory) == SDIST
        return {n for n in names if n == "__pycache__" or (at_root and n in hidden)}

    shutil.copytree(SDIST, run_dir, ignore=skipped, dirs_exist_ok=True)
    if target == "columnar":
        conftest = run_dir / "tests" / "conftest.py"
        conftest.write_text(_without_fixture(conftest.read_text(), CATALOG_FIXTURE))
    return run_dir


def zephons_all(root: Path) -> dict[str, list[str]]:
    """Zephon's declared public surface, ``{module: __all__}``, as its own test of it freezes it
    (``tests/zephon/test_public_surface.py``'s ``EXPECTED_ALL``)."""
    tree = ast.parse((root / "tests" / "zephon" / "test_public_surface.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EXPECTED_ALL"
                                                for t in node.targets):
            return ast.literal_eval(node.value)
    raise ValueError("Zephon's test_public_surface.py has no EXPECTED_ALL: the harness needs updating")


def _write_zephons_all(run_dir: Path) -> Path:
    path = run_dir / "zephon_all.json"
    path.write_text(json.dumps(zephons_all(run_dir)))
    return path


def run(target: Target, python: str, out: Path, paths: list[str], timeout_s: int) -> int:
    """Run ``paths`` (default: the whole suite) and append one JSON line per test to ``out``.

    A run that crashes (a segfault, a worker that takes the interpreter down) records the test
    that was running as ``crashed`` and goes on with the rest.
    """
    run_dir = prepare(target)
    try:
        return _run_in(run_dir, target, python, out.resolve(), paths, timeout_s)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def _run_in(run_dir: Path, target: Target, python: str, out: Path, paths: list[str], timeout_s: int) -> int:
    out.unlink(missing_ok=True)
    pythonpath = [str(PLUGIN_DIR)] + ([str(ALIAS_DIR)] if target == "columnar" else [])
    env = {**os.environ, "ZC_OUTCOMES": str(out), "PYTHONPATH": os.pathsep.join(pythonpath),
           "ZC_ZEPHON_ALL": str(_write_zephons_all(run_dir))}
    current = Path(f"{out}.current")
    base = [python, "-m", "pytest", "-p", "zc_outcomes", "-p", "no:cacheprovider", "--run-integration",
            f"--timeout={timeout_s}", "-o", "log_cli=false", "--color=no", "-q", "--tb=line",
            f"--ignore={PRIVATE_TREE}", "--continue-on-collection-errors"]
    deselected: list[str] = []
    while True:
        current.unlink(missing_ok=True)
        done = {json.loads(line)["test"] for line in out.read_text().splitlines()} if out.exists() else set()
        args = [*base, *(f"--deselect={t}" for t in sorted(done | set(deselected))), *(paths or SUITE)]
        code = subprocess.run(args, cwd=run_dir, env=env).returncode
        if code in (0, 1, 5) or not current.exists():
            current.unlink(missing_ok=True)  # the run ended: no test is in progress
            return code
        crashed = current.read_text().strip()
        with out.open("a") as f:
            f.write(json.dumps({"test": crashed, "outcome": "crashed", "seconds": 0.0,
                                "error": f"the test process exited with {code}"}) + "\n")
        deselected.append(crashed)


# --- the report -------------------------------------------------------------------------------

_PRIVATE_MODULE = re.compile(r"\bzephon\.(?:_\w+)")
_ATTRIBUTE_CALLS = ("getattr", "setattr", "hasattr", "delattr")
_SCRIPT_IMPORTS = re.compile(r"from zephon[\w.]* import (\([^)]*\)|[^\n]*)")  # in the text of a test's script


@dataclass
class _FileFacts:
    """What a test file reaches: names bound to private things and which functions mention them."""

    private_names: set[str] = field(default_factory=set)
    functions: dict[str, ast.AST] = field(default_factory=dict)


def _mentions_private(node: ast.AST, private_names: set[str]) -> str | None:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id in private_names:
            return f"uses {sub.id} (from a private module)"
        if isinstance(sub, ast.Attribute):
            attr = sub.attr
            if attr.startswith("_") and not attr.startswith("__") and not (
                    isinstance(sub.value, ast.Name) and sub.value.id in ("self", "cls")):
                return f"reads private attribute .{attr}"
        if isinstance(sub, (ast.ImportFrom, ast.Import)):
            modules = [sub.module or ""] if isinstance(sub, ast.ImportFrom) else [a.name for a in sub.names]
            if any(_PRIVATE_MODULE.search(m) or m.startswith("zephon._") for m in modules):
                return "imports a private module"
            if isinstance(sub, ast.ImportFrom) and sub.module == "zephon" and any(
                    a.name.startswith("_") for a in sub.names):
                return "imports a private module"
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and _PRIVATE_MODULE.search(sub.value):
            return "names a private module"
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and any(
                name.strip(" \n()").startswith("_") for names in _SCRIPT_IMPORTS.findall(sub.value)
                for name in names.split(",")):
            return "runs a script that imports a private name"
        called = (sub.func.id if isinstance(sub.func, ast.Name) else sub.func.attr
                  if isinstance(sub.func, ast.Attribute) else None) if isinstance(sub, ast.Call) else None
        # getattr(x, "_name"), and monkeypatch.setattr(x, "_name", ...) which replaces a private
        if (isinstance(sub, ast.Call) and called in _ATTRIBUTE_CALLS
                and (isinstance(sub.func, ast.Name) or called in ("setattr", "delattr"))
                and len(sub.args) >= 2 and isinstance(sub.args[1], ast.Constant)
                and isinstance(sub.args[1].value, str) and sub.args[1].value.startswith("_")
                and not sub.args[1].value.startswith("__")):
            return f"reads private attribute {sub.args[1].value} ({called})"
    return None


def _module_facts(path: Path, helper_private: dict[str, set[str]]) -> _FileFacts:
    facts = _FileFacts()
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("zephon._"):
                facts.private_names |= {a.asname or a.name for a in node.names}
            elif node.module == "zephon" or node.module.startswith("zephon."):  # a public module's private name
                facts.private_names |= {a.asname or a.name for a in node.names if a.name.startswith("_")}
            elif node.module in helper_private:
                facts.private_names |= {a.asname or a.name for a in node.names
                                        if a.name in helper_private[node.module]}
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("zephon._"):
                    facts.private_names.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            facts.functions[node.name] = node
        elif isinstance(node, ast.ClassDef):
            facts.functions[node.name] = node
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    facts.functions[f"{node.name}.{item.name}"] = item
        elif isinstance(node, ast.Assign) and _mentions_private(node, facts.private_names):
            facts.private_names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return facts


def _helper_private_names(root: Path) -> dict[str, set[str]]:
    """Per helper module of Zephon's tests, the names whose code touches a private internal."""
    found: dict[str, set[str]] = {}
    for path in [*root.glob("tests/helpers/*.py"), *root.glob("tests/_*.py"), *root.glob("tests/conftest.py")]:
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        facts = _module_facts(path, {})
        found[module] = {name for name, node in facts.functions.items()
                         if _mentions_private(node, facts.private_names)} | facts.private_names
    return found


def private_tests(root: Path, tests: list[str]) -> dict[str, str]:
    """Which of ``tests`` (pytest node ids) reach a private internal, with the reason.

    A test is private if it lives in ``tests/zephon/_internal/``, or if its function, one of its
    same-file fixtures (by parameter name) or a same-file function it calls mentions a private
    module, a name bound from one, or a private attribute; followed transitively within the file.
    """
    helper_private = _helper_private_names(root)
    facts_by_file: dict[str, _FileFacts] = {}
    verdicts: dict[str, str] = {}
    for test in tests:
        file, _, rest = test.partition("::")
        if file.startswith(PRIVATE_TREE):
            verdicts[test] = "in Zephon's private test tree"
            continue
        if not rest or not (root / file).exists():
            continue
        facts = facts_by_file.get(file) or facts_by_file.setdefault(file, _module_facts(root / file, helper_private))
        parts = [p.split("[")[0] for p in rest.split("::")]
        start = ".".join(parts[-2:]) if len(parts) > 1 else parts[0]
        seen: set[str] = set()
        todo = [start, *parts[:-1]]
        while todo:
            name = todo.pop()
            node = facts.functions.get(name)
            if node is None or name in seen:
                continue
            seen.add(name)
            reason = _mentions_private(node, facts.private_names)
            if reason is not None:
                verdicts[test] = f"{reason} (in {name})" if name != start else reason
                break
            referenced = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                referenced |= {a.arg for a in node.args.args}
            todo.extend(r for r in referenced if r in facts.functions)
    return verdicts


def deliberate_differences() -> dict[str, str]:
    """The tests ``docs/compatibility.md`` lists as deliberate differences, with their reasons.

    The list is the table rows whose first cell is a test node id in backticks; a test function
    without parameters in brackets covers each of its parametrized cases.
    """
    if not DIFFERENCES.exists():
        return {}
    rows = re.findall(r"^\|\s*`(tests/[^`]+)`\s*\|([^|]*)\|", DIFFERENCES.read_text(), re.MULTILINE)
    return {test: reason.strip() for test, reason in rows}


def load_outcomes(path: Path) -> dict[str, dict]:
    return {entry["test"]: entry for entry in map(json.loads, path.read_text().splitlines())}


Verdict = Literal["pass", "FAIL", "private", "repository", "deliberate", "not on zephon"]


def verdicts(zephon: dict[str, dict], columnar: dict[str, dict], root: Path) -> dict[str, tuple[Verdict, str]]:
    """Each test Zephon's run knows: did zephon_columnar meet the bar, and if not, why not."""
    private = private_tests(root, list(zephon))
    deliberate = deliberate_differences()
    result: dict[str, tuple[Verdict, str]] = {}
    for test, ref in zephon.items():
        ours = columnar.get(test, {"outcome": "missing", "error": "not run (or not collected)"})
        if ref["outcome"] != "passed":
            result[test] = ("not on zephon", ref["outcome"])
        elif ours["outcome"] == "passed":
            result[test] = ("pass", "")
        elif test in private or ours.get("private"):
            result[test] = ("private", private.get(test, "failed on a private placeholder"))
        elif test.split("::")[0] in REPOSITORY_TESTS:
            result[test] = ("repository", REPOSITORY_TESTS[test.split("::")[0]])
        elif test in deliberate or test.split("[")[0] in deliberate:
            result[test] = ("deliberate", deliberate.get(test) or deliberate[test.split("[")[0]])
        else:
            result[test] = ("FAIL", f"{ours['outcome']}: {ours.get('error', '')}")
    return result


def report(zephon_path: Path, columnar_path: Path, markdown: Path | None, failures: Path | None) -> str:
    fetch()
    zephon, columnar = load_outcomes(zephon_path), load_outcomes(columnar_path)
    result = verdicts(zephon, columnar, SDIST)
    per_file: dict[str, Counter[str]] = defaultdict(Counter)
    for test, (verdict, _) in result.items():
        per_file[test.split("::")[0]][verdict] += 1
    head = "| file | passed on Zephon | passed on zephon_columnar | fail | private | repository | deliberate |"
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|"]
    total: Counter[str] = Counter()
    for file in sorted(per_file):
        c = per_file[file]
        on_zephon = sum(v for k, v in c.items() if k != "not on zephon")
        total.update(c)
        lines.append(f"| {file} | {on_zephon} | {c['pass']} | {c['FAIL']} | {c['private']} | {c['repository']} "
                     f"| {c['deliberate']} |")
    on_zephon = sum(v for k, v in total.items() if k != "not on zephon")
    lines.append(f"| **all** | {on_zephon} | {total['pass']} | {total['FAIL']} | {total['private']} "
                 f"| {total['repository']} | {total['deliberate']} |")
    text = "\n".join(lines)
    if markdown:
        markdown.write_text(text + "\n")
    if failures:
        failures.write_text("".join(json.dumps({"test": t, "verdict": v, "why": why}) + "\n"
                                    for t, (v, why) in sorted(result.items()) if v in ("FAIL", "private")))
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("fetch", help="download and unpack Zephon's sdist into .compat/")
    run_cmd = commands.add_parser("run", help="run Zephon's tests, one JSON line per test")
    run_cmd.add_argument("--target", choices=["columnar", "zephon"], default="columnar")
    run_cmd.add_argument("--python", default=sys.executable,
                         help="the interpreter (for --target zephon: one with zephon==0.2.0 installed)")
    run_cmd.add_argument("--out", type=Path, required=True)
    run_cmd.add_argument("--timeout", type=int, default=300, help="seconds per test")
    run_cmd.add_argument("paths", nargs="*", help="test files or node ids (default: the whole suite)")
    report_cmd = commands.add_parser("report", help="per-file table of the two runs")
    report_cmd.add_argument("--zephon", type=Path, required=True)
    report_cmd.add_argument("--columnar", type=Path, required=True)
    report_cmd.add_argument("--markdown", type=Path)
    report_cmd.add_argument("--failures", type=Path, help="write each failing or private test, with why")
    args = parser.parse_args(argv)
    if args.command == "fetch":
        print(fetch())
        return 0
    if args.command == "run":
        return run(args.target, args.python, args.out, args.paths, args.timeout)
    print(report(args.zephon, args.columnar, args.markdown, args.failures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
