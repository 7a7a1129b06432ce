"""Optional extras in the tests.

A test that needs an optional library (an extra of ``pyproject.toml``) gets it through
`require`: skipped where the extra is not installed (a core install, ``pip install
'zephon_columnar[test]'``), and failing where the full test setup promises it: ``make test``
(what CI runs) sets ``ZC_REQUIRE_EXTRAS=1``, so nothing is ever skipped silently there.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def require(module: str, extra: str) -> ModuleType:
    """``import module``, or skip the caller (a test, or a whole test module at import) when the
    extra that provides it is not installed."""
    if os.environ.get("ZC_REQUIRE_EXTRAS") == "1":
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f"needs the {extra} extra: pip install 'zephon_columnar[{extra}]'")
