"""Stand-in for ``sgl_kernel`` in the serving tier (scripts/test-serving.sh).

SGLang imports ``sgl_kernel`` (its CUDA kernels) at module level in many
places, and PyPI publishes no CPU build of it. On the CPU paths the tier runs
(``--device cpu --attention-backend torch_native``) none of its functions is
called: every name resolves to a placeholder that raises when it is called,
so a path that does need a kernel fails loudly instead of computing garbage.
Submodules (``sgl_kernel.kvcacheio``, ``sgl_kernel.flash_attn`` ...) are
served the same way.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import Any, Optional, Sequence

__version__ = "0.0.0+pdx-serving-stub"


class _Missing:
    """A kernel (or a namespace of kernels) that is not available on CPU."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> "_Missing":
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{self._name}: sgl_kernel is a stub in pdx's CPU serving tier")

    def __repr__(self) -> str:
        return f"<sgl_kernel stub {self._name}>"


def _module_getattr(module_name: str):
    def __getattr__(attr: str) -> _Missing:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{module_name}.{attr}")

    return __getattr__


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[ModuleType]:
        return None

    def exec_module(self, module: ModuleType) -> None:
        module.__path__ = []  # type: ignore[attr-defined]  # a package: deeper names resolve too
        module.__getattr__ = _module_getattr(module.__name__)  # type: ignore[attr-defined]


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]], target: Optional[ModuleType] = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname.startswith(__name__ + "."):
            return importlib.util.spec_from_loader(fullname, _Loader(), is_package=True)
        return None


sys.meta_path.append(_Finder())
__getattr__ = _module_getattr(__name__)
