"""Load a hot module's two implementations side by side: the ``.py`` (numpy
or the standard library) and its compiled ``.pyx`` twin from build/native,
whatever path this run selected (``device_pool.native``)."""

from __future__ import annotations

import importlib.util
import sysconfig
from types import ModuleType

import pytest

from device_pool import native


def _load(name: str, path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def twins(package: str, module: str) -> tuple[ModuleType, ModuleType]:
    """(pure, compiled) ``package.module``; skips when no current build exists."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    built = native.folder(native.BUILD, package) / f"{module}{suffix}"
    why = native.why_pure(package)
    if not built.exists() or (why is not None and "stale" in why):
        pytest.skip(f"no current compiled {package}.{module} ({why}); `make` builds it")
    pure = _load(f"{module}_pure", str(native.folder(native.ROOT, package) / f"{module}.py"))
    return pure, _load(f"{package}.{module}", str(built))
