"""SGLang's own radix trees as the tree bench's peers (``--against sglang``).

Two peers, driven as SGLang's scheduler drives them: its pure-Python
``RadixCache`` and its ``UnifiedRadixCache`` on the compiled Rust TreeCore
(``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=rust``), each with SGLang's own
slot allocator on the CPU. Keys are ``array('q')`` as SGLang's ``Req``
keeps them, extended by each turn's new ids only.

SGLang's wheel is installed ``--no-deps`` (``make .venv/.engines-installed``);
the light packages its modules import are in requirements/engine-deps.txt.
Two imports on its import path are GPU or image-model only and unused by the
trees: ``tvm_ffi`` (CUDA all-reduce kernels) and ``torchvision`` (multimodal
configs). Where they are not installed, this loader, and only this loader,
gives them empty stand-in modules while SGLang is imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from array import array
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import NamedTuple, Protocol

import torch

BACKEND_ENV = "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"
RUST_CORE = "sglang.srt.mem_cache.rust_tree_core.mem_cache"
_UNUSED_IMPORTS = ("tvm_ffi", "torchvision", "triton")


class SglangUnavailable(Exception):
    """SGLang (or one of its trees) cannot be loaded here; the message says why."""


class PeerTree(Protocol):
    """One SGLang tree with its allocator, behind the calls an engine makes."""

    name: str

    def match(self, key: array) -> tuple[int, object]: ...
    def lock(self, node: object) -> object: ...
    def unlock(self, node: object, lock: object) -> None: ...
    def prefix(self, node: object, length: int) -> torch.Tensor: ...
    def alloc(self, num_tokens: int) -> torch.Tensor | None: ...
    def finish(self, key: array, slots: torch.Tensor, prefix_len: int) -> None: ...


class Peers(NamedTuple):
    """Factories of fresh peer trees (``page_size``, ``capacity``) by name,
    and why a peer is missing (e.g. no Rust core in the wheel)."""

    factories: dict[str, Callable[[int, int], PeerTree]]
    missing: dict[str, str]


class _Stub(types.ModuleType):
    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()


class _Anything:
    def __init__(self, *args: object, **kw: object) -> None:
        pass

    def __call__(self, *args: object, **kw: object) -> _Anything:
        return _Anything()

    def __getattr__(self, name: str) -> _Anything:
        return _Anything()

    def __mro_entries__(self, bases: tuple[object, ...]) -> tuple[type, ...]:
        return (object,)


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Empty modules for ``roots`` and their submodules: no ``__file__`` and
    no version, so libraries that probe for them (transformers) see them absent."""

    def __init__(self, roots: Sequence[str]) -> None:
        self.roots = set(roots)
        self.used: set[str] = set()  # the roots something imported while stood in for

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        self.used.add(spec.name.split(".")[0])  # imported, not just probed for
        return _Stub(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []
        setattr(module, "__version__", "0")  # noqa: B010 (a module type has no such field)


@contextmanager
def unused_imports_stubbed() -> Iterator[_StubFinder]:
    """Empty stand-ins for SGLang's GPU/image-only imports (``tvm_ffi``, ``torchvision``,
    ``triton``) that are not installed, while SGLang's modules are imported; the
    finder yielded records which of them were imported (``used``)."""
    missing = [m for m in _UNUSED_IMPORTS if importlib.util.find_spec(m) is None]
    if "triton" in missing:
        _torch_sees_no_triton()
    finder = _StubFinder(missing)
    sys.meta_path.insert(0, finder)
    try:
        yield finder
    finally:
        sys.meta_path.remove(finder)
        # SGLang's modules keep their references; later imports (torch's
        # dynamo probes triton) must see these packages absent again.
        for name in [n for n in sys.modules if n.split(".")[0] in finder.roots]:
            if isinstance(sys.modules[name], _Stub):
                del sys.modules[name]


def _torch_sees_no_triton() -> None:
    """Let torch probe for triton before the stand-in exists: SGLang's modules
    call ``torch.compile`` at import, and torch would take the stand-in for a
    real triton. Both probes keep their answer (a cached function, a module)."""
    import torch._dynamo.repro.after_dynamo  # what torch.compile imports
    import torch._inductor.runtime.triton_compat
    import torch.utils._triton

    torch.utils._triton.has_triton_package()


def load() -> Peers:
    """Import SGLang's trees; SglangUnavailable when SGLang is not installed
    or does not import here."""
    if importlib.util.find_spec("sglang") is None:
        raise SglangUnavailable(
            "SGLang is not installed: `make .venv/.engines-installed` installs its wheel"
        )
    os.environ.setdefault(BACKEND_ENV, "rust")
    try:
        with unused_imports_stubbed():
            from hicache.bench.tree import sglang_drivers
    except ImportError as e:
        raise SglangUnavailable(f"SGLang does not import here: {e}") from None
    factories: dict[str, Callable[[int, int], PeerTree]] = {
        "sglang-radix": sglang_drivers.RadixDriver.build
    }
    missing = {}
    if os.environ[BACKEND_ENV] != "rust":
        missing["sglang-unified-rust"] = f"{BACKEND_ENV}={os.environ[BACKEND_ENV]} (not rust)"
    elif importlib.util.find_spec(RUST_CORE) is None:
        missing["sglang-unified-rust"] = "the Rust TreeCore is not in this SGLang wheel"
    else:
        factories["sglang-unified-rust"] = sglang_drivers.UnifiedDriver.build
    return Peers(factories, missing)
