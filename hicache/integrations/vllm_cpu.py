"""vLLM's offloading modules on a CPU machine: for the tier's tests and ``hicache bench vllm``.

``make test`` installs vLLM's wheel ``--no-deps`` plus the light packages its
offloading modules import (requirements/engine-deps.txt). Two of those
imports are grammar engines for structured output, compiled packages that
the offloading path never calls: ``vllm.config`` reaches ``xgrammar`` and
``llguidance`` at module level through its structured-output imports.
``enter_vllm()`` stands in an empty module for each of them *only when it is
not installed*, so ``import vllm.v1.kv_offload.tiering...`` works; every
vLLM module still comes from the installed wheel, unchanged. On a vLLM server
(vLLM fully installed) nothing is stood in.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types

# Grammar engines vLLM imports at module level and the offloading path never uses.
STAND_INS = ("xgrammar", "llguidance")


class _StandIn(types.ModuleType):
    """An empty package whose every attribute is an empty placeholder class, so
    that ``from xgrammar.structural_tag import StructuralTag`` imports (vLLM
    even builds a few such objects at module level)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__path__: list[str] = []

    def __getattr__(self, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {"__module__": self.__name__})


class _StandInFinder:
    """Serves the stand-in's submodules (``xgrammar.structural_tag``)."""

    def __init__(self, roots: tuple[str, ...]) -> None:
        self._roots = roots

    def find_spec(
        self, name: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name.split(".")[0] not in self._roots:
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _StandIn(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def enter_vllm() -> tuple[str, ...]:
    """Stand in for the missing grammar engines; return the names stood in for."""
    missing = tuple(
        name
        for name in STAND_INS
        if name not in sys.modules and importlib.util.find_spec(name) is None
    )
    if missing and not any(isinstance(f, _StandInFinder) for f in sys.meta_path):
        sys.meta_path.append(_StandInFinder(missing))
    return missing
