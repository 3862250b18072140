"""Opt-in shim: serve ``import mooncake.engine`` from pdx (``pdx.mooncake``).

This module is tiny and imports nothing of pdx until ``mooncake.engine`` is
actually imported, because it runs at every interpreter start-up through a
``.pth`` file:

- ``pdx-mooncake-shim.pth`` (installed with the wheel) calls :func:`from_env`:
  nothing happens unless ``PDX_MOONCAKE_SHIM`` is ``1`` / ``true`` / ``yes`` /
  ``on``;
- ``python -m pdx.mooncake --install-shim`` writes ``pdx-mooncake-shim-always.pth``,
  which calls :func:`activate` unconditionally (``--uninstall-shim`` removes it;
  both are ``pdx.mooncake``'s, so that this module is the only one of the two
  that imports the other).

When active, a line on stderr says so at start-up, and a finder placed first
on ``sys.meta_path`` answers ``mooncake.engine`` with a module holding
pdx's ``TransferEngine``, ``TransferNotify``, ``TransferOpcode`` (and the
wheel's other module names that pdx serves). The wheel's ``mooncake``
package, when installed, still loads for everything else (``mooncake.store``
...); without it, an empty ``mooncake`` package is provided.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType
from typing import Optional, Sequence

ENV = "PDX_MOONCAKE_SHIM"
_TRUE = ("1", "true", "yes", "on")


class _EngineLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[ModuleType]:
        return None  # a fresh module object

    def exec_module(self, module: ModuleType) -> None:
        import pdx.mooncake as served

        for name in served.__all__:
            setattr(module, name, getattr(served, name))
        module.__doc__ = "mooncake.engine served by pdx (pdx.mooncake); see pdx's docs/python.md."
        setattr(module, "__getattr__", served.__getattr__)  # names pdx does not serve
        module.served_by = "pdx"  # type: ignore[attr-defined]
        import logging

        logging.getLogger("pdx.mooncake").info("mooncake.engine is served by pdx (%s)", served.__file__)


class _PackageLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[ModuleType]:
        return None

    def exec_module(self, module: ModuleType) -> None:
        module.__path__ = []  # a package with no files: only mooncake.engine, from the finder


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]], target: Optional[ModuleType] = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname == "mooncake.engine":
            return importlib.util.spec_from_loader(fullname, _EngineLoader(), origin="pdx.mooncake")
        if fullname == "mooncake" and importlib.machinery.PathFinder.find_spec(fullname, path) is None:
            return importlib.util.spec_from_loader(fullname, _PackageLoader(), origin="pdx", is_package=True)
        return None


_finder: Optional[_Finder] = None


def active() -> bool:
    """Whether this process serves ``mooncake.engine`` from pdx."""
    return _finder is not None


def activate(reason: str = f"{ENV}=1") -> None:
    """Serve ``mooncake.engine`` from pdx in this process from now on (idempotent).

    A module already imported stays what it is; call this before importing it."""
    global _finder
    if _finder is not None:
        return
    _finder = _Finder()
    sys.meta_path.insert(0, _finder)
    sys.stderr.write(f"pdx: {reason}: `import mooncake.engine` is served by pdx (pdx.mooncake.TransferEngine)\n")


def from_env() -> None:
    """Activate when ``PDX_MOONCAKE_SHIM`` opts in; otherwise change nothing."""
    if os.environ.get(ENV, "").strip().lower() in _TRUE:
        activate(f"{ENV}={os.environ[ENV]}")
