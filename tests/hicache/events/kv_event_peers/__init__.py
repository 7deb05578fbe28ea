"""The KV event Structs of the engines hicache publishes for, imported from their
released wheels (``requirements/engines.txt``, installed by ``make test``), so that
decoding with them proves a router of that release reads what hicache publishes.

Each engine's event module is executed from the wheel as it ships. Only the
imports its publisher code needs (configs, loggers, networking: deep import
chains into the engine) are stubbed; the Structs, and every type they name, are
the release's own. ``load("vllm==0.33.0")`` skips the calling test where that
wheel is not installed and fails where another version is.
"""

from __future__ import annotations

import ast
import enum
import functools
import importlib.metadata
import importlib.util
import logging
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest

VLLM = "vllm==0.33.0"
SGLANG = "sglang==0.5.23"


@dataclass(frozen=True)
class PeerStructs:
    """What a router of one release decodes batches with, and the media it knows."""

    release: str
    KVEventBatch: type
    BlockStored: type
    BlockRemoved: type
    AllBlocksCleared: type
    MEDIA: frozenset[str]


class _PublisherOnly(types.ModuleType):
    """A stub for an engine module the event Structs do not use: any name imported
    from it is a placeholder class (annotations may name it) that refuses to be
    called or instantiated."""

    def __getattr__(self, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        qualified = f"{self.__name__}.{name}"

        def unavailable(*_args: object, **_kwargs: object) -> None:
            raise RuntimeError(f"{qualified} is stubbed: the tests use only the event Structs")

        return type(name, (), {"__new__": unavailable, "__module__": self.__name__})


def _stubs(names: list[str], real: dict[str, dict[str, object]]) -> dict[str, types.ModuleType]:
    """Stub modules for ``names`` and every package above them; ``real`` gives names
    some of them must hold for real (read from the wheel)."""
    stubs: dict[str, types.ModuleType] = {}
    for name in names:
        parts = name.split(".")
        for depth in range(1, len(parts) + 1):
            dotted = ".".join(parts[:depth])
            module = stubs.setdefault(dotted, _PublisherOnly(dotted))
            if depth < len(parts):
                module.__path__ = []
    for name, attrs in real.items():
        stubs[name].__dict__.update(attrs)
    return stubs


def _wheel_file(release: str, relpath: str) -> Path:
    dist, version = release.split("==")
    try:
        installed = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{release} is not installed (make .venv/.engines-installed)")
    assert installed == version, f"the tests name {release}; {dist} {installed} is installed"
    return Path(str(importlib.metadata.distribution(dist).locate_file(relpath)))


def _exec_module(
    release: str, relpath: str, stubs: dict[str, types.ModuleType]
) -> types.ModuleType:
    path = _wheel_file(release, relpath)
    name = f"_hicache_peer_{release.replace('==', '_').replace('.', '_')}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with mock.patch.dict(sys.modules, stubs):
        spec.loader.exec_module(module)
    sys.modules[name] = module  # msgspec resolves the Structs' annotations through it
    return module


def _type_alias(release: str, relpath: str, alias: str) -> object:
    """The value of ``alias: TypeAlias = ...`` in a wheel's file, evaluated as declared."""
    tree = ast.parse(_wheel_file(release, relpath).read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == alias:
            assert node.value is not None
            return eval(compile(ast.Expression(node.value), relpath, "eval"), {})
    raise AssertionError(f"{alias} is not declared in {release}'s {relpath}")


def _vllm() -> PeerStructs:
    block_hash = _type_alias(VLLM, "vllm/v1/core/kv_cache_utils.py", "ExternalBlockHash")
    stubs = _stubs(
        [
            "vllm.config.kv_events",
            "vllm.logger",
            "vllm.utils.network_utils",
            "vllm.v1.core.kv_cache_utils",
        ],
        {
            "vllm.logger": {"init_logger": logging.getLogger},
            "vllm.v1.core.kv_cache_utils": {"ExternalBlockHash": block_hash},
        },
    )
    module = _exec_module(VLLM, "vllm/distributed/kv_events.py", stubs)
    media = frozenset({module.MEDIUM_GPU, module.MEDIUM_CPU, module.MEDIUM_STORAGE})
    return _structs(VLLM, module, media)


def _sglang() -> PeerStructs:
    stubs = _stubs(["sglang.srt.runtime_context", "sglang.srt.utils.network"], {})
    module = _exec_module(SGLANG, "sglang/srt/disaggregation/kv_events.py", stubs)
    medium: type[enum.Enum] = module.StorageMedium
    return _structs(SGLANG, module, frozenset(m.value for m in medium))


def _structs(release: str, module: types.ModuleType, media: frozenset[str]) -> PeerStructs:
    return PeerStructs(
        release,
        module.KVEventBatch,
        module.BlockStored,
        module.BlockRemoved,
        module.AllBlocksCleared,
        media,
    )


@functools.cache
def _load(release: str) -> PeerStructs:
    loaders = {VLLM: _vllm, SGLANG: _sglang}
    return loaders[release]()


def load(release: str) -> PeerStructs:
    """The event Structs of ``release`` (``VLLM`` or ``SGLANG``)."""
    return _load(release)
