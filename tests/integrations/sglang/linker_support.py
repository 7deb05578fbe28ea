"""What SGLang 0.5.23's ``UnifiedRadixCache`` and its linker factory need on a CPU
test machine, none of it replacing SGLang's logic (``test_linker_support`` checks
that each is still needed):

1. ``enter_sglang()``: the ``sglang`` package without its ``__init__`` (which loads
   the client front-end), as every SGLang test here does (conftest).
2. Empty modules for ``triton``, ``tvm_ffi`` and ``torchvision`` while SGLang's tree
   modules are imported (GPU kernels, CUDA all-reduce, image models), through the
   tree bench's loader (``hicache.bench.sglang_trees.unused_imports_stubbed``).
3. Server args through SGLang's own ``get_context().override_server_args(...)``.
4. ``TpWorker``: the two things ``registry.create_unified_radix_cache`` asks of its
   ``tp_worker`` (``model_runner.forward_stream``, ``register_hicache_layer_transfer_counter``).

On CPU SGLang's ``get_device_module()`` is ``torch.cpu``, whose events are no-ops.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from hicache.bench.sglang_trees import unused_imports_stubbed
from hicache.integrations.sglang_cpu import enter_sglang

STOOD_IN = ("triton", "tvm_ffi", "torchvision")
# SGLang's modules the linker tests use; all imported once, under the stand-ins.
MODULES = (
    "sglang.srt.mem_cache.registry",
    "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.mem_cache.allocator.paged",
    "sglang.srt.managers.schedule_batch",
    "sglang.srt.sampling.sampling_params",
    "sglang.srt.runtime_context",
    "sglang.srt.mem_cache.cache_init_params",
    "sglang.srt.mem_cache.base_prefix_cache",
    "sglang.srt.mem_cache.radix_cache",
    "sglang.srt.mem_cache.unified_radix_cache",
    "sglang.srt.mem_cache.unified_cache.linker_factory",
    "sglang.srt.mem_cache.utils",
    "sglang.srt.mem_cache.unified_cache.component_type",
    "hicache.integrations.sglang_linker",
)


class SglangModules:
    """SGLang's modules by their last name (``registry``, ``memory_pool``, ...),
    and which stand-ins their import used."""

    def __init__(self) -> None:
        enter_sglang()
        with unused_imports_stubbed() as finder:
            self.by_name: dict[str, ModuleType] = {
                name.rsplit(".", 1)[-1]: importlib.import_module(name) for name in MODULES
            }
        self.stood_in = frozenset(finder.used)

    def __getattr__(self, name: str) -> ModuleType:
        try:
            return self.by_name[name]
        except KeyError:
            raise AttributeError(name) from None


class _ModelRunner:
    forward_stream = None  # CPU: the current stream is the pages' only writer


class TpWorker:
    """The tp_worker ``create_unified_radix_cache`` reads: its model runner's forward
    stream, and where the layer counter is registered (kept for the test)."""

    def __init__(self) -> None:
        self.model_runner = _ModelRunner()
        self.counter: object = None

    def register_hicache_layer_transfer_counter(self, counter: object) -> None:
        self.counter = counter
