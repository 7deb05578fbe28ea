"""The stand-ins SGLang 0.5.23's ``UnifiedRadixCache`` and its linker factory take
on a CPU test machine, in one place (``test_linker.py`` checks that each is still
needed; none of them replaces SGLang's logic):

1. ``enter_sglang()``: the ``sglang`` package without its ``__init__`` (which loads
   the client front-end), as every SGLang test here does (conftest).
2. Empty modules for ``triton``, ``tvm_ffi`` and ``torchvision`` while SGLang's tree
   modules are imported (GPU kernels, CUDA all-reduce, image models):
   ``hicache.bench.tree.sglang_trees.unused_imports_stubbed``, through ``SglangModules``.
3. Server args through SGLang's own ``get_context().override_server_args(...)``,
   kept installed for a server's life (``UnifiedServer``).
4. ``TpWorker``: what ``registry.create_unified_radix_cache`` asks of a tp worker
   (``model_runner.forward_stream``, ``register_hicache_layer_transfer_counter``).

The driver itself (``hicache.bench.sglang.linker``) is shared with the bench.
On CPU SGLang's ``get_device_module()`` is ``torch.cpu``, whose events are no-ops.

Not a stand-in: SGLang hashes pages with a C++ extension it compiles on first use
(``cpp_utils/native_hash.py``, torch's JIT build: ~20-60 s on two cores) into
torch's extension cache under ``$XDG_CACHE_HOME``, which the suite points at a
fresh temporary directory per test (tests/conftest.py). ``sglang_modules`` keeps
that build in ``build/torch_extensions`` of the checkout instead (unless
``TORCH_EXTENSIONS_DIR`` is set): built once per checkout.
"""

from __future__ import annotations

import os
from pathlib import Path

from hicache.bench.sglang.linker import SglangModules, TpWorker, UnifiedServer

__all__ = ["STOOD_IN", "SglangModules", "TpWorker", "UnifiedServer", "sglang_modules"]

STOOD_IN = ("triton", "tvm_ffi", "torchvision")
EXTENSIONS_DIR = Path(__file__).resolve().parents[4] / "build" / "torch_extensions"


def sglang_modules() -> SglangModules:
    """SGLang's tree modules, imported once per process (the slow part)."""
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(EXTENSIONS_DIR))
    return SglangModules()
