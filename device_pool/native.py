"""Compiled hot path: which modules run as C extensions, and when.

The hot path's primitives (``HOT_MODULES``) each have two implementations
under one module name: ``<module>.py`` (numpy or the standard library) and
``<module>.pyx``, the same steps as typed C loops, which Cython compiles
(``scripts/build_native.py``, run by ``make``); tests drive both with the same
calls and compare every answer. The tree's logic itself stays in Python, in
one copy. The build goes to ``build/native/``, outside the packages, with a
manifest of each compiled source's SHA-256. A package puts that folder first
on its ``__path__`` (``use_compiled``) only when

- ``HICACHE_PURE`` is not ``1``,
- the build is there, for this Python, and
- every compiled module was built from the source that is there now (a stale
  build is never run: edit a ``.pyx`` and the ``.py`` runs until rebuilt).

Otherwise the pure-Python modules run, and the reason is logged (INFO when
the build is simply absent or turned off, WARNING when stale). Stdlib only:
``device_pool`` and ``hicache.tree`` import it before anything else; it lives in
the lowest package so that none imports upward to reach it. A package is named
here by its dotted path; its folder mirrors it.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import sys
import sysconfig
from pathlib import Path

logger = logging.getLogger(__name__)

PURE_ENV = "HICACHE_PURE"
ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "native"
MANIFEST = BUILD / "manifest.json"
# package -> its hot primitives (a .py and a .pyx each), compiled when built
HOT_MODULES: dict[str, tuple[str, ...]] = {
    "device_pool": ("page_table",),
    "hicache.tree": ("token_ids",),
}


def folder(base: Path, package: str) -> Path:
    """A (dotted) package's folder under ``base``: the tree or the build."""
    return base.joinpath(*package.split("."))


def source_path(package: str, module: str) -> Path:
    """What a hot module is compiled from: its ``.pyx`` twin when it has one
    (typed C loops beside the numpy ``.py``), else the ``.py`` itself."""
    pyx = folder(ROOT, package) / f"{module}.pyx"
    return pyx if pyx.exists() else folder(ROOT, package) / f"{module}.py"


def source_digest(package: str, module: str) -> str:
    """SHA-256 of a hot module's compiled source in this tree."""
    return hashlib.sha256(source_path(package, module).read_bytes()).hexdigest()


def why_pure(package: str) -> str | None:
    """Why ``package``'s hot modules cannot run compiled now; None when they can."""
    if os.environ.get(PURE_ENV) == "1":
        return f"{PURE_ENV}=1"
    try:
        manifest = json.loads(MANIFEST.read_text())
    except (OSError, ValueError):
        return "no compiled build (make builds it; see docs/architecture.md)"
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    for module in HOT_MODULES[package]:
        if manifest.get(f"{package}.{module}") != source_digest(package, module):
            return f"the compiled build of {package}.{module} is stale: rebuild with make"
        if not (folder(BUILD, package) / f"{module}{suffix}").exists():
            return f"no compiled {package}.{module} for this Python"
    return None


def use_compiled(package: str, path: list[str]) -> None:
    """Put the compiled build first on ``package``'s ``__path__`` when usable
    (see the module docstring); call before the package imports a hot module."""
    why = why_pure(package)
    if why is None:
        path.insert(0, str(folder(BUILD, package)))
        return
    stale = "stale" in why
    logger.log(logging.WARNING if stale else logging.INFO, "%s runs pure Python: %s", package, why)


def compiled_modules() -> list[str]:
    """The hot modules imported so far that run compiled (C extensions)."""
    out = []
    for package, modules in HOT_MODULES.items():
        for module in modules:
            loaded = sys.modules.get(f"{package}.{module}")
            if loaded is not None and str(loaded.__file__).endswith(".so"):
                out.append(f"{package}.{module}")
    return out


def describe() -> str:
    """One line: which hot path this process runs (imports the hot modules)."""
    for package, modules in HOT_MODULES.items():  # by name: no import of a package above
        for module in modules:
            importlib.import_module(f"{package}.{module}")
    compiled = compiled_modules()
    if not compiled:
        why = next(filter(None, map(why_pure, HOT_MODULES)), None)
        return f"pure Python ({why})"
    return "compiled (Cython): " + ", ".join(compiled)
