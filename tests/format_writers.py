"""Other loaders' writers, imported for the tests that read their files.

``mosaicml-streaming`` imports torchvision when it is imported (for its image datasets, which
the tests never use), and the torchvision wheel on the package index does not load against the
CPU torch wheel the tests pin. `streaming` stands in the two names it reads at import
(``torchvision.datasets.VisionDataset``, a base class, and
``torchvision.transforms.functional.to_tensor``) when torchvision cannot be imported, then
imports MDSWriter's package: the writer itself needs neither.

Both writers are installed by ``make venv`` with ``--no-deps`` (``mosaicml-streaming`` pins
numpy below the version the package runs; its writer works on this one), their small
dependencies through the ``formats`` extra.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types

import torch.utils.data

from tests.extras import require


def _stand_in(name: str, **attributes: object) -> types.ModuleType:
    module = types.ModuleType(name)
    # transformers asks importlib.util.find_spec("torchvision"), which needs a spec.
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    module.__path__ = []
    module.__dict__.update(attributes)
    sys.modules[name] = module
    return module


def _torchvision_stand_in() -> None:
    try:
        import torchvision  # noqa: F401
    except Exception:  # the index's wheel fails to load against the CPU torch (not only ImportError)
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]

        def to_tensor(picture: object) -> object:
            raise NotImplementedError("torchvision stands in for mosaicml-streaming's writer only")

        class VisionDataset(torch.utils.data.Dataset):
            pass

        root = _stand_in("torchvision")
        root.datasets = _stand_in("torchvision.datasets", VisionDataset=VisionDataset)
        root.transforms = _stand_in("torchvision.transforms")
        root.transforms.functional = _stand_in("torchvision.transforms.functional", to_tensor=to_tensor)


def streaming() -> types.ModuleType:
    """``import streaming`` (MDSWriter, StreamingDataset), with torchvision stood in where needed."""
    if "streaming" not in sys.modules:
        _torchvision_stand_in()
    return require("streaming", "formats")


def litdata() -> types.ModuleType:
    """``import litdata`` (optimize, StreamingDataset)."""
    return require("litdata", "formats")
