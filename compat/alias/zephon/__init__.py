"""``import zephon`` -> ``zephon_columnar``: the import alias the compatibility harness runs under.

Only on ``sys.path`` while Zephon's own test suite runs against zephon_columnar (``compat/``);
never installed. ``zephon`` *is* ``zephon_columnar``; each ``zephon.X`` is a view of
``zephon_columnar.X`` whose every attribute read, write and deletion is the real module's (so
``zephon.pipeline.Pipeline is zephon_columnar.Pipeline`` and ``monkeypatch.setattr`` reaches the
code that runs). What is not our contract resolves to placeholders, classes that raise
:class:`PrivateInternalUsed` when called: Zephon's private modules (``zephon._internal``, any
``zephon._X``), private names of public modules, and names outside Zephon's declared
``__all__`` of a module (read from ``$ZC_ZEPHON_ALL``). A test file that imports one at module
level still loads, and only the tests that use it fail, recognisably.

Being a package on ``sys.path`` (rather than a hook installed by the test runner) lets spawned
processes (multiprocessing's spawn, torch DataLoader workers, Ray workers) resolve ``zephon``
too: they inherit ``PYTHONPATH``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import types
from typing import Any

import zephon_columnar

ALIAS = "zephon"
TARGET = "zephon_columnar"


class PrivateInternalUsed(RuntimeError):
    """A test used one of Zephon's private internals, which zephon_columnar does not provide."""


class _PrivateMeta(type):
    """Metaclass of the placeholder names: attribute access yields more placeholders; calls raise."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise PrivateInternalUsed(f"{cls.__qualname__} is a private Zephon internal")

    def __getitem__(cls, item: Any) -> Any:
        return cls


def _placeholder(qualname: str) -> type:
    return _PrivateMeta(qualname.rsplit(".", 1)[-1], (Exception,), {"__qualname__": qualname})


class _PrivateModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{self.__name__}.{name}")


def _load_zephons_all() -> dict[str, list[str]]:
    path = os.environ.get("ZC_ZEPHON_ALL")
    if not path:
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


_ZEPHONS_ALL = _load_zephons_all()


def _outside_zephons_all(module: str, name: str) -> bool:
    """Whether ``name`` is outside Zephon's declared public surface of ``module`` (its
    ``__all__``, frozen by Zephon's own tests): such a name is Zephon's implementation, not its
    API, and a test that uses it is treated like one using a private name."""
    declared = _ZEPHONS_ALL.get(module)
    return declared is not None and name not in declared


class _PublicView(types.ModuleType):
    """``zephon.X`` for a public module: every attribute read, written or deleted is the real
    ``zephon_columnar.X``'s (so ``monkeypatch.setattr`` reaches the code that runs), except that
    a private name the real module lacks (``from zephon.X import _helper``) is a placeholder."""

    def __init__(self, name: str, real: types.ModuleType) -> None:
        super().__init__(name, real.__doc__)
        object.__setattr__(self, "_real", real)
        object.__setattr__(self, "_alias", name)

    def __getattribute__(self, name: str) -> Any:
        if name in ("_real", "_alias", "__class__"):
            return object.__getattribute__(self, name)
        real = object.__getattribute__(self, "_real")
        if name == "__dict__":
            return real.__dict__
        try:
            return getattr(real, name)
        except AttributeError:
            alias = object.__getattribute__(self, "_alias")
            if (name.startswith("_") and not name.startswith("__")) or _outside_zephons_all(alias, name):
                return _placeholder(f"{real.__name__}.{name}")
            raise

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("__") and name.endswith("__"):
            # The import system stamps __spec__ & co. on the module it loads: keep those on the
            # view, so the real module keeps its own.
            object.__setattr__(self, name, value)
            return
        setattr(object.__getattribute__(self, "_real"), name, value)

    def __delattr__(self, name: str) -> None:
        delattr(object.__getattribute__(self, "_real"), name)

    def __dir__(self) -> list[str]:
        return dir(object.__getattribute__(self, "_real"))


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str | None) -> None:
        self._target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        if self._target is None:
            module = _PrivateModule(spec.name)
            module.__path__ = []  # a package: private submodules resolve too
            return module
        real = importlib.import_module(self._target)
        return _PublicView(spec.name, real)

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the target module ran when it was imported under its own name."""


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(ALIAS + "."):
            return None
        rest = fullname[len(ALIAS) + 1:]
        if any(part.startswith("_") for part in rest.split(".")):
            return importlib.machinery.ModuleSpec(fullname, _AliasLoader(None), is_package=True)
        target_name = f"{TARGET}.{rest}"
        if importlib.util.find_spec(target_name) is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(target_name))


if not any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
    sys.meta_path.insert(0, _AliasFinder())
sys.modules[ALIAS] = zephon_columnar
