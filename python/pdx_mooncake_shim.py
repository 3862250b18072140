"""Opt-in shim: serve ``import mooncake.engine`` from pdx (``pdx.mooncake``).

This module is tiny and imports nothing of pdx until ``mooncake.engine`` is
actually imported, because it runs at every interpreter start-up through a
``.pth`` file:

- ``pdx-mooncake-shim.pth`` (installed with the wheel) calls :func:`from_env`:
  nothing happens unless ``PDX_MOONCAKE_SHIM`` is ``1`` / ``true`` / ``yes`` /
  ``on``;
- ``python -m pdx.mooncake --install-shim`` writes ``pdx-mooncake-shim-always.pth``,
  which calls :func:`activate` unconditionally (``--uninstall-shim`` removes it).

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
import sysconfig
from types import ModuleType
from typing import Optional, Sequence

ENV = "PDX_MOONCAKE_SHIM"
ALWAYS_PTH = "pdx-mooncake-shim-always.pth"
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


def default_site_dir() -> str:
    """This environment's site-packages (where the wheel's files are)."""
    return sysconfig.get_paths()["purelib"]


def install(site_dir: str) -> str:
    """Write the always-on ``.pth`` into ``site_dir``; its path."""
    path = os.path.join(site_dir, ALWAYS_PTH)
    with open(path, "w", encoding="utf-8") as f:
        # One line (a .pth runs lines that start with `import`); harmless once pdx is uninstalled.
        f.write(
            'import importlib.util; importlib.util.find_spec("pdx_mooncake_shim") and '
            '__import__("pdx_mooncake_shim").activate("installed by python -m pdx.mooncake --install-shim")\n'
        )
    return path


def uninstall(site_dir: str) -> Optional[str]:
    """Remove the always-on ``.pth`` from ``site_dir``; its path, or None if there was none."""
    path = os.path.join(site_dir, ALWAYS_PTH)
    if not os.path.exists(path):
        return None
    os.remove(path)
    return path


def installed(site_dir: str) -> bool:
    """Whether ``install`` wrote its ``.pth`` into ``site_dir``."""
    return os.path.exists(os.path.join(site_dir, ALWAYS_PTH))
