"""Zephon 0.2.0's own test suite against zephon_columnar (``compat/``, see compat/README.md).

The full run takes most of an hour (Zephon's integration tests spawn processes); the test run
carries a CI-sized selection of Zephon's test files: every test of theirs that passes on Zephon
0.2.0 (``compat/zephon-0.2.0-outcomes.jsonl``, measured) must pass here, or be private (reaches
into Zephon's internals) or listed in docs/compatibility.md. The harness's own parts (the
import alias, the private-test classifier) are tested here too.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("zephon_suite", ROOT / "compat" / "zephon_suite.py")
assert SPEC is not None and SPEC.loader is not None
suite = importlib.util.module_from_spec(SPEC)
sys.modules["zephon_suite"] = suite
SPEC.loader.exec_module(suite)

ZEPHON_OUTCOMES = ROOT / "compat" / "zephon-0.2.0-outcomes.jsonl"

#: Zephon's test files run in CI: fast ones (seconds), grown as they pass.
SELECTION = [
    "tests/zephon/test_init.py",
    "tests/zephon/test_options.py",
    "tests/zephon/test_pipeline_iteration.py",
    "tests/zephon/test_pipeline_state.py",
    "tests/zephon/io/test_options.py",
    "tests/zephon/ops/test_traits.py",
    "tests/zephon/ops/accumulators/test_base.py",
    "tests/zephon/observability/test_stats.py",
    "tests/zephon/work/test_base.py",
    "tests/zephon/work/test_mixture.py",
]


def _in_alias(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(suite.ALIAS_DIR)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          cwd=str(ROOT / "compat"))


def test_the_alias_gives_zephon_columnar_modules_and_placeholders_for_private_ones():
    done = _in_alias("""
        import zephon, zephon.pipeline, zephon.ops.config
        import zephon_columnar, zephon_columnar.ops.config
        assert zephon is zephon_columnar and zephon.pipeline.Pipeline is zephon_columnar.Pipeline
        assert zephon.ops.config.PackingAlgorithm is zephon_columnar.ops.config.PackingAlgorithm
        zephon.ops.config.PATCHED = 1                      # writes reach the real module
        assert zephon_columnar.ops.config.PATCHED == 1
        from zephon._internal.io.catalog import clear_registry
        try:
            clear_registry()
        except RuntimeError as err:
            assert type(err).__name__ == "PrivateInternalUsed", err
        else:
            raise AssertionError("a private placeholder ran")
        print("ok")
    """)
    assert done.stdout.strip() == "ok", done.stderr


def test_private_tests_are_recognised_by_what_their_code_reaches(tmp_path):
    tests = tmp_path / "tests"
    (tests / "helpers").mkdir(parents=True)
    (tests / "helpers" / "__init__.py").write_text("")
    (tests / "helpers" / "engine.py").write_text("from zephon._internal.graph import Graph\n\n"
                                                 "def make_graph():\n    return Graph()\n\n"
                                                 "def plain():\n    return 1\n")
    (tests / "test_x.py").write_text(textwrap.dedent("""
        import pytest
        from zephon import Pipeline
        from tests.helpers.engine import make_graph, plain

        @pytest.fixture
        def built():
            return Pipeline(None)._plan

        def helper():
            return make_graph()

        def test_public():
            assert plain() == 1

        def test_private_attribute(built):
            assert built

        def test_private_helper():
            helper()

        def test_self_attribute_is_fine():
            class A:
                def f(self):
                    return self._x
            assert A
    """))
    names = ["test_public", "test_private_attribute", "test_private_helper", "test_self_attribute_is_fine"]
    verdicts = suite.private_tests(tmp_path, [f"tests/test_x.py::{n}" for n in names])
    assert set(verdicts) == {"tests/test_x.py::test_private_attribute", "tests/test_x.py::test_private_helper"}
    assert "._plan" in verdicts["tests/test_x.py::test_private_attribute"]


def test_zephon_suite_selection_passes(tmp_path):
    suite.fetch()  # Zephon's sdist, downloaded once (make venv does it)
    out = tmp_path / "columnar.jsonl"
    code = suite.run("columnar", sys.executable, out, SELECTION, timeout_s=120)
    assert code in (0, 1), f"the harness's pytest run ended with exit code {code}"
    zephon = {t: e for t, e in suite.load_outcomes(ZEPHON_OUTCOMES).items() if t.split("::")[0] in SELECTION}
    assert zephon, "no reference outcomes for the selection: re-measure compat/zephon-0.2.0-outcomes.jsonl"
    verdicts = suite.verdicts(zephon, suite.load_outcomes(out), suite.SDIST)
    failing = {test: why for test, (verdict, why) in verdicts.items() if verdict == "FAIL"}
    assert not failing, json.dumps(failing, indent=1)
    assert sum(v == "pass" for v, _ in verdicts.values()) >= 0.9 * len(verdicts)
