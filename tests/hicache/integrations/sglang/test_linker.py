"""``HicacheLinker`` under SGLang 0.5.23's own ``UnifiedRadixCache`` (both tree
cores, MHA and MLA), built by SGLang's ``registry.create_unified_radix_cache``
with the ``dynamic`` linker factory, SGLang's pools and ``Req`` objects on CPU.

SGLang's modules load once for this module (``sg``), the slow part (~10-25 s).
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from hicache.bench.sglang.linker import Fetched, Shape
from hicache.integrations.sglang_cpu import HostPool, sglang_root
from tests.hicache.integrations.sglang import stuck_store
from tests.hicache.integrations.sglang.conftest import StartDaemon
from tests.hicache.integrations.sglang.helpers import DYNAMIC, ours
from tests.hicache.integrations.sglang.linker_support import (
    STOOD_IN,
    SglangModules,
    UnifiedServer,
    sglang_modules,
)

RUST_CORE = "sglang.srt.mem_cache.rust_tree_core.mem_cache"
CORES = ["python", "rust"] if importlib.util.find_spec(RUST_CORE) is not None else ["python"]
TOKENS = list(range(100, 118))  # four whole pages and a partial one
MHA, MLA = Shape("mha", head_dim=8), Shape("mla", head_dim=16)
PAGE, LAYERS, MODEL = MHA.page_size, MHA.layers, "org/linker-model"


@pytest.fixture(scope="module")
def sg() -> SglangModules:
    return sglang_modules()


@pytest.fixture
def servers() -> Iterator[list[UnifiedServer]]:
    """Servers a test built, closed at teardown."""
    built: list[UnifiedServer] = []
    yield built
    for server in reversed(built):
        server.close()


def file_store(path: Path, **more: Any) -> dict[str, Any]:
    """A ``file`` store (several openers of one path may share it)."""
    return {"hicache_config": "default", "backend": "file", "path": str(path), **more}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.int16), b.view(torch.int16))


def file_server(
    sg: SglangModules,
    servers: list[UnifiedServer],
    path: Path,
    shape: Shape = MHA,
    core: str = "python",
) -> UnifiedServer:
    """A server on a ``file`` store at ``path``, closed at teardown."""
    server = UnifiedServer(sg, shape, core, file_store(path))
    servers.append(server)
    return server


def offloaded(server: UnifiedServer, tokens: list[int], seed: int) -> list[torch.Tensor]:
    """Compute ``tokens``' KV, wait for its offload, evict it from the device; the KV."""
    written = server.compute(tokens, seed=seed)
    server.settle()
    server.evict()
    return written


@pytest.mark.parametrize("kind", ["mha", "mla"])
@pytest.mark.parametrize("core", CORES)
def test_compute_offload_evict_then_load_layer_by_layer_is_bit_exact(
    sg: SglangModules, servers: list[UnifiedServer], tmp_path: Path, core: str, kind: str
) -> None:
    server = file_server(sg, servers, tmp_path / "store", MHA if kind == "mha" else MLA, core)
    written = offloaded(server, TOKENS, seed=1)
    got = server.fetch(TOKENS)
    assert (got.device_prefix, len(got.loaded_slots), got.aborted) == (0, 16, False)
    assert all(same_bits(w, g) for w, g in zip(written, got.kv, strict=True))
    assert server.linker.stats().failures == {}


def test_partial_prefixes_load_only_what_is_stored_past_the_device(
    sg: SglangModules, servers: list[UnifiedServer], tmp_path: Path
) -> None:
    server = file_server(sg, servers, tmp_path / "store")
    written = offloaded(server, TOKENS, seed=2)
    # Shares two pages, then diverges: only those two are restorable.
    other = [*TOKENS[:8], 7, 7, 7, 7, 7]
    got = server.fetch(other)
    assert (got.device_prefix, len(got.loaded_slots), got.aborted) == (0, 8, False)
    assert all(same_bits(w[:8], g) for w, g in zip(written, got.kv, strict=True))
    # Two pages back on the device (computed again): the tail's keys are chained
    # on the device prefix's, and only pages 2-3 are loaded.
    server.compute(TOKENS[:8], seed=3)
    server.settle()
    got = server.fetch(TOKENS)
    assert (got.device_prefix, len(got.loaded_slots), got.aborted) == (8, 8, False)
    assert all(same_bits(w[8:16], g) for w, g in zip(written, got.kv, strict=True))


def test_a_damaged_page_aborts_its_request_and_is_then_a_miss(
    sg: SglangModules, servers: list[UnifiedServer], tmp_path: Path
) -> None:
    server = file_server(sg, servers, tmp_path / "store")
    written = offloaded(server, TOKENS, seed=4)
    files = sorted(
        p for p in (tmp_path / "store").rglob("*") if p.is_file() and p.stat().st_size > 512
    )
    assert len(files) == 4
    raw = bytearray(files[0].read_bytes())
    raw[-1] ^= 0xFF
    files[0].write_bytes(bytes(raw))
    first = server.fetch(TOKENS)
    assert first.aborted  # SGLang aborts it: its slots are never inserted
    stats = server.linker.stats()
    assert stats.storage is not None and stats.storage.corrupt == 1
    assert stats.failures.get("load failed") == 1
    # The damaged page is gone: what is still stored below it loads, bit-exact.
    again = server.fetch(TOKENS)
    assert not again.aborted
    n = len(again.loaded_slots)
    assert n < 16
    assert all(same_bits(w[:n], g) for w, g in zip(written, again.kv, strict=True))


def test_a_killed_daemon_is_a_miss_and_a_failed_offload_never_an_error(
    sg: SglangModules, servers: list[UnifiedServer], daemon_factory: StartDaemon
) -> None:
    daemon = daemon_factory()
    extra = {"hicache_config": "remote", "endpoint": daemon.endpoint, "timeout_s": 1.0}
    server = UnifiedServer(sg, MHA, "python", extra)
    servers.append(server)
    written = offloaded(server, TOKENS, seed=5)
    assert all(same_bits(w, g) for w, g in zip(written, server.fetch(TOKENS).kv, strict=True))
    daemon.kill()
    got = server.fetch(TOKENS)
    assert (len(got.loaded_slots), got.aborted) == (0, False)
    offloaded(server, [9] * 8, seed=6)  # its offload fails; the tree takes the failure
    failures = server.linker.stats().failures
    assert failures.get("offload failed", 0) + failures.get("lookup failed", 0) >= 1


def test_the_linker_and_the_l3_adapter_read_each_others_pages(
    sg: SglangModules, servers: list[UnifiedServer], tmp_path: Path
) -> None:
    store = tmp_path / "store"
    server = file_server(sg, servers, store)
    host = HostPool("mha", "page_first", 8, PAGE, LAYERS, MHA.heads, MHA.head_dim, torch.bfloat16)
    l3 = ours(host, {**DYNAMIC, **file_store(store)}, model=MODEL)
    hashes = sg.utils.get_storage_hash_str
    # Linker -> L3: the L3 adapter reads the pages the linker offloaded.
    written = server.compute(TOKENS, seed=7)
    server.settle()
    keys = hashes(TOKENS[:16], None, page_size=PAGE)
    assert l3.stats().namespace == server.linker.stats().namespace
    assert l3.batch_get_v1(keys, host.page_indices(range(4))) == [True] * 4
    for page in range(4):
        flat = host.get_data_page(page * PAGE, flat=False)  # (2, page, layers, heads, dim)
        for layer in range(LAYERS):
            for part in range(2):
                want = written[layer * 2 + part][page * PAGE : (page + 1) * PAGE]
                assert same_bits(flat[part, :, layer], want)
    # L3 -> linker: pages the L3 adapter stored load into SGLang's device pool.
    other = list(range(500, 508))
    for page in range(2):
        host.fill(4 + page, seed=20 + page)
    assert l3.batch_set_v1(hashes(other, None, page_size=PAGE), host.page_indices([4, 5])) == [
        True,
        True,
    ]
    got = server.fetch(other)
    assert (len(got.loaded_slots), got.aborted) == (8, False)
    for layer in range(LAYERS):
        for part in range(2):
            want = torch.cat(
                [host.get_data_page((4 + p) * PAGE, flat=False)[part, :, layer] for p in range(2)]
            )
            assert same_bits(got.kv[layer * 2 + part], want)
    l3.close()


def test_unsupported_models_and_configs_are_refused_at_construction(sg: SglangModules) -> None:
    linker_module = sg.sglang_linker
    components = sg.component_type.ComponentType
    with pytest.raises(ValueError, match="SWA"):
        linker_module.HicacheLinker(
            None, None, components={components.FULL, components.SWA}, extra_config={}
        )
    full = {components.FULL}
    with pytest.raises(ValueError, match="unknown key 'endpont'"):
        linker_module.HicacheLinker(None, None, components=full, extra_config={"endpont": "x"})
    with pytest.raises(ValueError, match="layout"):
        linker_module.HicacheLinker(None, None, components=full, extra_config={"layout": "x"})


# --- the stand-ins (linker_support) are each still needed ---------------------------------

_MODULE_IMPORT = r"^(?:import|from) {}\b"


def _module_level_importers(name: str) -> list[str]:
    """SGLang's loaded modules whose source imports ``name`` at module level."""
    pattern = re.compile(_MODULE_IMPORT.format(re.escape(name)), re.MULTILINE)
    found = []
    for mod_name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if not (mod_name.startswith("sglang.") and path and path.endswith(".py")):
            continue
        if pattern.search(Path(path).read_text(encoding="utf-8", errors="replace")):
            found.append(mod_name)
    return found


def test_each_stand_in_is_still_needed(sg: SglangModules) -> None:
    for name in STOOD_IN:  # absent here, and imported at module level by SGLang's modules
        assert importlib.util.find_spec(name) is None, f"{name} is installed: drop its stand-in"
        assert _module_level_importers(name), f"SGLang no longer imports {name}: drop its stand-in"
    init = (sglang_root() / "__init__.py").read_text()
    assert re.search(r"^from sglang\.lang", init, re.MULTILINE), "sglang/__init__ got light"
    build = inspect.getsource(sg.registry.create_unified_radix_cache)
    assert "get_memory().enable_unified_cache_external_linker" in build  # server args
    assert "tp_worker.model_runner.forward_stream" in build  # the TpWorker stand-in
    assert "register_hicache_layer_transfer_counter" in build


def test_bench_rows_put_the_linker_against_the_l3_path(sg: SglangModules, tmp_path: Path) -> None:
    from hicache.bench.sglang import bench
    from hicache.bench.sglang import linker_rows as sglang_linker_rows

    tiny = bench.Geometry(pages=4, page_size=4, layers=2, heads=1, head_dim=8, layout="page_first")
    rows = sglang_linker_rows.measure(tiny, tmp_path, repeat=1)
    assert [(r.target, r.op) for r in rows] == [
        (sglang_linker_rows.TARGET, o) for o in ("set", "get")
    ]
    assert all(r.gbps > 0 and r.baseline_gbps > 0 for r in rows)


@pytest.mark.parametrize("stuck", ["StuckLookup", "StuckRead"])
def test_a_store_that_never_answers_is_a_miss_or_a_failed_load_within_its_timeout(
    sg: SglangModules, servers: list[UnifiedServer], stuck: str
) -> None:
    backend = f"tests.hicache.integrations.sglang.stuck_store:{stuck}"
    extra = {"hicache_config": "remote", "backend": backend, "timeout_s": 0.2}
    server = UnifiedServer(sg, MHA, "python", extra)
    servers.append(server)
    stuck_store.RELEASE.clear()
    fetched: list[Fetched] = []
    # SGLang's scheduler thread: its waits must end (bounded) while the store hangs.
    scheduler = threading.Thread(target=lambda: fetched.append(server.fetch(TOKENS)))
    scheduler.start()
    scheduler.join(60)
    stuck_store.RELEASE.set()
    assert not scheduler.is_alive() and len(fetched) == 1
    got = fetched[0]
    failures = server.linker.stats().failures
    if stuck == "StuckLookup":  # a miss: nothing to load
        assert (len(got.loaded_slots), got.aborted) == (0, False)
        assert failures == {"lookup timed out": 1}
    else:  # found, then the read never answers: SGLang aborts the request
        assert (len(got.loaded_slots), got.aborted) == (16, True)
        assert failures == {"load failed": 1}


def test_a_linker_server_reads_what_another_process_stored_through_one_daemon(
    sg: SglangModules, servers: list[UnifiedServer], daemon_factory: StartDaemon
) -> None:
    """The other "server" is the L3 adapter in its own process (share_worker: it
    needs no SGLang tree, so it starts in seconds), on the linker's page geometry."""
    endpoint = daemon_factory().endpoint
    worker = [sys.executable, "-m", "tests.hicache.integrations.sglang.share_worker", endpoint]
    out = subprocess.run(
        [*worker, "m2", "0", "300", "4", "1"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "4"
    shape = Shape("mha", layers=2, heads=2, head_dim=8)  # share_worker's HostPool geometry
    server = UnifiedServer(sg, shape, "python", {"endpoint": endpoint}, model="m2")
    servers.append(server)
    got = server.fetch(list(range(300, 316)))
    assert (len(got.loaded_slots), got.aborted) == (16, False)
    source = HostPool("mha", "page_first", 4)
    for page in range(4):
        source.fill(page, 300 + page)  # what the other process wrote
    for layer in range(2):
        for part in range(2):
            pages = [source.get_data_page(p * PAGE, flat=False) for p in range(4)]
            want = torch.cat([page[part, :, layer] for page in pages])
            assert same_bits(got.kv[layer * 2 + part], want)


def test_the_linker_reports_as_held_only_the_prefix_worth_loading(
    sg: SglangModules, servers: list[UnifiedServer], tmp_path: Path
) -> None:
    """With ``prefill_tokens_per_s``: a store measured too slow holds nothing worth
    loading (SGLang computes the prompt), a fast one all of its pages."""
    server = UnifiedServer(sg, MHA, "python", file_store(tmp_path / "s", prefill_tokens_per_s=1e4))
    servers.append(server)
    written = offloaded(server, TOKENS, seed=7)
    rates = server.linker.bounds.rates
    for _ in range(3):  # 1 kB/s: 16 tokens' page in seconds, recomputed in 1.6 ms
        rates.record_s2h(1000, 1.0)
    assert len(server.fetch(TOKENS).loaded_slots) == 0
    for _ in range(30):
        rates.record_s2h(1 << 30, 0.1)
    got = server.fetch(TOKENS)
    assert (len(got.loaded_slots), got.aborted) == (16, False)
    assert all(same_bits(w, g) for w, g in zip(written, got.kv, strict=True))
    assert rates.snapshot().s2h is not None
