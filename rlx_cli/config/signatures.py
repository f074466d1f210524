"""The registered components' signatures, for checking a config without importing torch.

``components/__init__`` imports every component module, and they import torch (1 to 4 s). A config's check needs
only their signatures, which ``components.registry.declared`` reads from their source. ``registry()`` is that module
without the package: loaded from its file under its own name when the package is not imported yet (it imports
nothing of the package), so that the package, once a run imports it, registers its functions into that same module.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from components.registry import Signatures

NAME = "components.registry"


def registry() -> ModuleType:
    """``components.registry``, imported on its own when ``components`` is not imported yet."""
    if NAME in sys.modules:
        return sys.modules[NAME]
    if "components" in sys.modules:
        return importlib.import_module(NAME)
    package = importlib.util.find_spec("components")  # finds the folder without running the package
    spec = importlib.util.spec_from_file_location(NAME, Path(package.submodule_search_locations[0]) / "registry.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[NAME] = module
    spec.loader.exec_module(module)
    return module


@cache
def table() -> Signatures:
    """group -> name -> ``registry.Signature`` of every registered component: read from the source, or, where a
    declaration is not a literal ``declared`` can read, from the functions themselves (importing them)."""
    components = registry()
    try:
        return components.declared()
    except components.Undeclared:
        importlib.import_module("components")
        return components.signatures()
