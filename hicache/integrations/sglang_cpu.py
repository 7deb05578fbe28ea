"""SGLang's storage path on a CPU machine: for the adapter's tests and ``hicache bench sglang``.

Two problems stand between a CPU machine with SGLang's wheel (installed
``--no-deps``, as ``make test`` does) and SGLang's storage code:

- ``import sglang`` runs ``sglang/__init__.py``, which loads SGLang's client
  front-end (transformers, HF patches) that storage never uses;
  ``enter_sglang()`` enters the package without running it (every submodule
  still comes from the installed wheel, unchanged), and stands in an empty
  module for ``triton`` (a GPU compiler that ``srt/utils/common.py`` imports
  at module level and calls only inside GPU kernels) when it is missing.
- SGLang's host pools (``pool_host/mha.py``, ``mla.py``) and its cache
  controller (``managers/cache_controller.py``) import half of SGLang at
  module level (transformers, CUDA kernels). Their storage-facing methods are
  plain torch, though: ``init_kv_buffer``, ``get_data_page``,
  ``get_dummy_flat_data_page``, ``set_from_flat_data_page``,
  ``get_page_buffer_meta`` and the controller's ``_generic_page_get``,
  ``_page_get_zero_copy``, ``_generic_page_set``, ``_page_set_zero_copy``,
  ``_page_backup``, ``_storage_hit_query``. ``extract`` compiles exactly
  those definitions from the installed wheel's source files, so ``HostPool``
  and ``Controller`` run SGLang's real method bodies (a change in a new
  release shows up here), with the few module globals they use supplied (a
  CPU allocator, a page-hash function, a logger).

On a GPU machine with SGLang fully installed, a server uses neither: it
imports ``hicache.integrations.sglang`` itself.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import importlib.util
import logging
import sys
import threading
import time
import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch


def _enter_sglang_without_init() -> None:
    if "sglang" in sys.modules:
        return
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return  # not installed: importing it fails with a clear ImportError
    package = types.ModuleType("sglang")
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    package.__file__ = spec.origin
    sys.modules["sglang"] = package


@contextlib.contextmanager
def _empty_triton_when_missing() -> Iterator[None]:
    """SGLang's ``srt/utils/common.py`` (which SGLang's own ``HiCacheFile`` reaches
    through its LRU evictor) imports ``triton`` at module level and uses it only
    inside GPU kernels' functions. triton is a GPU compiler: without it, an empty
    module stands in for it while that module is imported, then leaves
    ``sys.modules`` again, so that torch (whose dynamo probes ``import triton``)
    and every later import still see no triton."""
    if "triton" in sys.modules or importlib.util.find_spec("triton") is not None:
        yield
        return
    triton = types.ModuleType("triton")
    triton.__path__ = []
    sys.modules["triton"] = triton
    try:
        yield
    finally:
        if sys.modules.get("triton") is triton:
            del sys.modules["triton"]


def enter_sglang() -> None:
    """Make ``import sglang.srt...`` work on a CPU machine with the pinned wheel."""
    _enter_sglang_without_init()
    if "sglang" not in sys.modules:
        return  # not installed: importing it fails with a clear ImportError
    with _empty_triton_when_missing():
        importlib.import_module("sglang.srt.utils.common")


logger = logging.getLogger("sglang-code")


def sglang_root() -> Path:
    """The installed ``sglang`` package's directory."""
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations)))


def extract(
    relpath: str, owner: str | None, names: Sequence[str], namespace: dict[str, Any]
) -> dict[str, Any]:
    """Compile the definitions ``names`` of class ``owner`` (None: module level)
    of SGLang's ``relpath`` into ``namespace``; return them by name."""
    path = sglang_root() / relpath
    tree = ast.parse(path.read_text(), str(path))
    body = tree.body
    if owner is not None:
        (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == owner]
        body = cls.body
    defs = [n for n in body if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name in names]
    missing = set(names) - {d.name for d in defs}
    if missing:
        raise ImportError(f"{relpath}: {owner}.{sorted(missing)} not in this SGLang release")
    future = ast.parse("from __future__ import annotations").body
    module = ast.Module(body=[*future, *defs], type_ignores=[])
    exec(compile(module, str(path), "exec"), namespace)
    return {name: namespace[name] for name in names}


def _alloc_cpu(dims, dtype, device, pin_memory, allocator=None, **_ignored):  # type: ignore[no-untyped-def]
    return torch.zeros(dims, dtype=dtype, device=device)


def _pool_namespace() -> dict[str, Any]:
    return {
        "torch": torch,
        "ALLOC_MEMORY_FUNCS": {"cpu": _alloc_cpu},
        "_is_npu": False,
        "logger": logger,
    }


POOL_METHODS = (
    "init_kv_buffer",
    "get_data_page",
    "get_dummy_flat_data_page",
    "set_from_flat_data_page",
    "get_page_buffer_meta",
)


@functools.cache
def _pool_class(kind: str) -> type:
    relpath, owner = {
        "mha": ("srt/mem_cache/pool_host/mha.py", "MHATokenToKVPoolHost"),
        "mla": ("srt/mem_cache/pool_host/mla.py", "MLATokenToKVPoolHost"),
    }[kind]
    names = POOL_METHODS + (("_storage_page_index",) if kind == "mla" else ())
    methods = extract(relpath, owner, names, _pool_namespace())
    base = extract(
        "srt/mem_cache/pool_host/base.py",
        "HostKVCache",
        ("logical_size", "logical_page_size"),
        _pool_namespace(),
    )
    return type(f"Sglang{kind.upper()}PoolMethods", (), {**methods, **base})


class HostPool:
    """A host pool made of SGLang's own storage-facing methods (see the module doc)."""

    def __init__(
        self,
        kind: str,
        layout: str,
        pages: int,
        page_size: int = 4,
        layers: int = 2,
        heads: int = 2,
        head_dim: int = 8,
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        methods = _pool_class(kind)
        self._methods = methods
        self.kind, self.layout, self.page_size, self.dtype = kind, layout, page_size, dtype
        self.layer_num, self.head_num, self.head_dim = layers, heads, head_dim
        self.v_head_dim = head_dim
        self.kv_cache_dim = heads * head_dim  # MLA: one latent row per token
        self.page_num = pages
        self.size = pages * page_size
        self.device, self.pin_memory, self.allocator = "cpu", False, None
        self.dcp_size, self.dcp_rank = 1, 0
        self._transfer_device = torch.device("cpu")
        self.kv_buffer: torch.Tensor = self.init_kv_buffer()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._methods, name)
        if isinstance(attr, property):
            return attr.fget(self)  # type: ignore[misc]
        return attr.__get__(self)

    def page_indices(self, pages: Sequence[int]) -> torch.Tensor:
        """Host indices (token slots) of whole pages, as SGLang's allocator hands them out."""
        starts = torch.tensor(list(pages), dtype=torch.int64) * self.page_size
        return (starts[:, None] + torch.arange(self.page_size)).reshape(-1)

    def fill(self, page: int, seed: int) -> None:
        """Deterministic content for one page (through SGLang's set_from_flat_data_page)."""
        dummy = self.get_dummy_flat_data_page()
        gen = torch.Generator().manual_seed(seed)
        values = torch.randn(dummy.numel(), generator=gen).to(self.dtype)
        self.set_from_flat_data_page(page * self.page_size, values)

    def page_bytes(self, page: int) -> bytes:
        data = self.get_data_page(page * self.page_size, flat=True).contiguous()
        return bytes(data.view(torch.uint8).numpy())


# --- the cache controller's storage paths ------------------------------------------

CONTROLLER_METHODS = (
    "_generic_page_get",
    "_page_get_zero_copy",
    "_generic_page_set",
    "_page_set_zero_copy",
    "_page_backup",
    "_storage_hit_query",
)


def chain_hashes(tokens: Sequence[int], prior: str | None = None, page_size: int = 4) -> list[str]:
    """Chained sha256 page hashes (64-hex), the shape of SGLang's storage keys."""
    out: list[str] = []
    for start in range(0, len(tokens) - len(tokens) % page_size, page_size):
        h = hashlib.sha256(bytes.fromhex(prior) if prior else b"")
        for token in tokens[start : start + page_size]:
            h.update(int(token).to_bytes(4, "little", signed=True))
        prior = h.hexdigest()
        out.append(prior)
    return out


@functools.cache
def _controller_class() -> tuple[type, type, type]:
    enter_sglang()
    from sglang.srt.mem_cache.hicache_storage import STORAGE_BATCH_SIZE, HiCacheStorageExtraInfo

    namespace: dict[str, Any] = {
        "torch": torch,
        "logger": logger,
        "threading": threading,
        "time": time,
        "STORAGE_BATCH_SIZE": STORAGE_BATCH_SIZE,
        "HiCacheStorageExtraInfo": HiCacheStorageExtraInfo,
        "get_storage_hash_str": lambda key, prior_hash=None, page_size=None: chain_hashes(
            key, prior_hash, page_size or 1
        ),
    }
    ops = extract(
        "srt/managers/cache_controller.py",
        None,
        ("StorageOperation", "PrefetchOperation"),
        namespace,
    )
    methods = extract(
        "srt/managers/cache_controller.py", "HiCacheController", CONTROLLER_METHODS, namespace
    )
    return (
        type("SglangControllerMethods", (), methods),
        ops["StorageOperation"],
        ops["PrefetchOperation"],
    )


class Controller:
    """The storage side of SGLang's HiCacheController, over one backend and host pool.

    ``v1`` selects the zero-copy functions, as SGLang does for a ``dynamic``
    backend with ``interface_v1`` set.
    """

    def __init__(self, backend: Any, pool: HostPool, v1: bool) -> None:
        methods, self.StorageOperation, self.PrefetchOperation = _controller_class()
        self._methods = methods
        self.storage_backend = backend
        self.storage_host_pool = self.mem_pool_host = pool
        self.page_size = pool.page_size
        self.page_get_func = self._page_get_zero_copy if v1 else self._generic_page_get
        self.page_set_func = self._page_set_zero_copy if v1 else self._generic_page_set

    def __getattr__(self, name: str) -> Any:
        return getattr(self._methods, name).__get__(self)

    def hit_query(self, tokens: Sequence[int]) -> tuple[list[str], int]:
        """SGLang's prefetch-thread lookup: batch_exists in chunks of 128."""
        op = self.PrefetchOperation("req", list(tokens), None, None)
        hashes, hit_tokens = self._storage_hit_query(op)
        return hashes, hit_tokens

    def backup(self, hashes: list[str], pages: Sequence[int]) -> int:
        """SGLang's backup thread: the pages' tokens stored in batches of 128."""
        op = self.StorageOperation(self.storage_host_pool.page_indices(pages), [], None, hashes)
        self._page_backup(op)
        completed: int = op.completed_tokens
        return completed

    def load(self, hashes: list[str], pages: Sequence[int]) -> int:
        """SGLang's prefetch-IO thread: pages read into the host pool; the hit prefix."""
        op = self.PrefetchOperation("req", [], None, None)
        indices = self.storage_host_pool.page_indices(pages)
        from sglang.srt.mem_cache.hicache_storage import HiCacheStorageExtraInfo

        extra = HiCacheStorageExtraInfo(prefix_keys=None)
        count: int = self.page_get_func(op, hashes, indices, extra)
        return count
