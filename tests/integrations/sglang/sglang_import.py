"""Importing SGLang's storage modules without its client front-end (see conftest.py).

Used by the tests' conftest and by the worker processes the tests start.
"""

from __future__ import annotations

import importlib.util
import sys
import types


def _enter_sglang_without_init() -> None:
    if "sglang" in sys.modules:
        return
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return  # not installed: the tests importing it fail with a clear ImportError
    package = types.ModuleType("sglang")
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    package.__file__ = spec.origin
    sys.modules["sglang"] = package


def _empty_triton_when_missing() -> None:
    """SGLang's ``srt/utils/common.py`` (which SGLang's own ``HiCacheFile`` reaches
    through its LRU evictor) imports ``triton`` at module level and uses it only
    inside GPU kernels' functions. triton is a GPU compiler: without it, an empty
    module stands in for it, so the import succeeds and nothing calls into it."""
    if "triton" not in sys.modules and importlib.util.find_spec("triton") is None:
        triton = types.ModuleType("triton")
        triton.__path__ = []
        sys.modules["triton"] = triton


def enter_sglang() -> None:
    """Make ``import sglang.srt...`` work on a CPU machine with the pinned wheel."""
    _enter_sglang_without_init()
    _empty_triton_when_missing()
