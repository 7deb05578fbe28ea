"""hicache's stores directly under SGLang's own tree: ``HicacheLinker``.

SGLang 0.5.23's ``UnifiedRadixCache`` keeps its tree on the device and links
its device pools straight to an external KV store through a
``UnifiedCacheLinker``; a server loads this one with no change to SGLang::

    --enable-unified-cache-external-linker --unified-cache-external-linker-backend dynamic
    --unified-cache-external-linker-config '{"linker_module_path":
        "hicache.integrations.sglang_linker", "linker": "HicacheLinker",
        "linker_extra_config": {"hicache_config": "remote"}}'

``linker_extra_config`` is read as the L3 adapter's extra config is
(``hicache.integrations.sglang``): ``hicache_config`` names a shipped config
or a TOML path, every other key overrides a ``[storage]`` field, except
``layout`` (``page_first``, the default, or ``layer_first``: the host layout
whose flat pages are stored, so that an L3 adapter launched with the same
``--hicache-mem-layout`` shares the pages) and ``prefill_tokens_per_s`` (the
model's prefill speed: ``lookup`` then reports only the prefix worth loading,
``load_deadline``). An unknown key is one ValueError at construction.

Keys and values are the L3 adapter's: SGLang's 64-hex chained page hashes
under the same namespace (model, attention kind, dtype, layout, page bytes,
ranks; MLA ranks share, only TP rank 0 stores), each page in our checksummed
format. A damaged page is a failed load (SGLang aborts the loading requests,
whose slots no other request reads) and the backend drops it.

Threads. SGLang calls every method on its scheduler thread, and its forward
pass waits there, layer by layer, on ``layer_done_counter``. No backend call
runs on that thread: ``lookup`` waits at most ``timeout_s`` for a worker's
answer (a dead daemon is a miss, then its breaker answers at once); loads run
on the loader thread (the backend read bounded by ``timeout_s``, then one
device copy per layer, completing each layer of the counter, or failing all
of them); offloads run on the offload thread, after the events
``record_offload_ready`` recorded, skipping pages already stored. No method
raises into SGLang after construction: failures are counted (``stats()``)
and logged rate-limited.

Not supported yet: SWA and Mamba components (refused at construction),
hybrid or DSA pools, MLA rank-0 load broadcast (every rank reads).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as wait_futures
from typing import NamedTuple

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig, PoolName, PoolTransfer
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_cache.unified_cache_linker import (
    LayerWiseLoadCounter,
    UnifiedCacheLinker,
)

from hicache.integrations.common import (
    DEFAULT_HICACHE_CONFIG,
    FailureLog,
    Keyer,
    Namespace,
    backend_errors,
    open_backend,
    resolve_storage_config,
)
from hicache.integrations.load_deadline import LoadBounds, prefill_speed
from hicache.integrations.sglang import (
    AdapterStats,
    PageGeometry,
    _byte_view,
    engine_key,
    namespace_fields,
)
from hicache.integrations.sglang_linker_pages import LAYOUTS, DevicePages
from storage_backends.base import StorageBackend
from storage_backends.config import StorageConfig

logger = logging.getLogger(__name__)

# Keys of linker_extra_config that are the linker's own (not [storage] overrides).
LINKER_KEYS = frozenset({"hicache_config", "layout", "prefill_tokens_per_s"})
_SOURCE = "hicache SGLang linker (--unified-cache-external-linker-config linker_extra_config)"


class LinkerRanks(NamedTuple):
    """This worker's place among SGLang's ranks, as the namespace needs it."""

    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    attn_cp_rank: int
    attn_cp_size: int


class _Load(NamedTuple):
    keys: list[bytes]
    page_ids: torch.Tensor


def refuse_unsupported(components: object) -> None:
    """ValueError unless ``components`` is SGLang's plain FULL attention."""
    names = sorted(getattr(c, "name", str(c)) for c in components)  # type: ignore[attr-defined]
    if set(components) != {ComponentType.FULL}:  # type: ignore[call-overload]
        raise ValueError(
            f"the hicache linker supports full-attention models only (MHA, MLA); this model's "
            f"cache has components {names} (SWA and Mamba are not supported yet: use the "
            "hicache L3 adapter, docs/sglang.md)"
        )


def worker_ranks(params: object) -> LinkerRanks:
    """TP rank and size of the attention group (as SGLang's linkers read them), PP and CP."""
    rank, size = 0, 1
    group = getattr(params, "attn_tp_cache_group", None) or getattr(params, "tp_cache_group", None)
    if (
        group is not None
        and torch.distributed.is_available()
        and torch.distributed.is_initialized()
    ):
        rank = torch.distributed.get_rank(group=group)
        size = torch.distributed.get_world_size(group=group)
    return LinkerRanks(
        rank,
        size,
        int(getattr(params, "pp_rank", 0)),
        int(getattr(params, "pp_size", 1)),
        int(getattr(params, "attn_cp_rank", 0)),
        int(getattr(params, "attn_cp_size", 1)),
    )


def served_model_name(server_args: object) -> str:
    """The model name SGLang's L3 path keys pages on (its served model name, as
    SGLang's own pool assembler reads it), else the model path."""
    from sglang.srt.runtime_context import get_model, get_serving

    try:
        name = get_serving().served_model_name or get_model().model_path
    except ValueError:  # no published config (a linker built outside a server)
        name = getattr(server_args, "served_model_name", None) or getattr(
            server_args, "model_path", ""
        )
    return str(name or "")


def _linker_config(extra: Mapping[str, object]) -> tuple[str, StorageConfig]:
    """The stored layout and the storage config of ``linker_extra_config``; ValueError
    for a bad layout or an unknown or bad key."""
    layout = str(extra.get("layout", "page_first"))
    if layout not in LAYOUTS:
        raise ValueError(f"{_SOURCE}: layout must be one of {LAYOUTS}, got {layout!r}")
    config = resolve_storage_config(
        str(extra.get("hicache_config", DEFAULT_HICACHE_CONFIG)), extra, LINKER_KEYS, _SOURCE
    )
    return layout, config


def _workers() -> tuple[ThreadPoolExecutor, ...]:
    """Lookup, loader, store-read and offload threads (see the module doc)."""
    return (
        ThreadPoolExecutor(2, thread_name_prefix="hicache-linker-lookup"),
        ThreadPoolExecutor(1, thread_name_prefix="hicache-linker-load"),
        ThreadPoolExecutor(2, thread_name_prefix="hicache-linker-read"),
        ThreadPoolExecutor(1, thread_name_prefix="hicache-linker-offload"),
    )


class HicacheLinker(UnifiedCacheLinker):  # type: ignore[misc]
    """SGLang's ``UnifiedCacheLinker`` over a hicache store (see the module doc).

    Constructed by SGLang's linker factory; raises ValueError for an unsupported
    model (SWA/Mamba components, a pool other than MHA/MLA), an unknown or bad
    extra-config key, and what the backend raises when its store cannot be opened.
    """

    def __init__(
        self,
        server_args: object,
        params: object,
        *,
        components: object,
        extra_config: Mapping[str, object] | None = None,
        forward_stream: torch.cuda.Stream | None = None,
    ) -> None:
        refuse_unsupported(components)
        extra = dict(extra_config or {})
        layout, config = _linker_config(extra)
        page_size = int(params.page_size)  # type: ignore[attr-defined]
        # Held is what is worth loading: measured reads against the prefill speed.
        self.bounds = LoadBounds(page_size, prefill_speed(extra), config.backend)
        kvcache = params.token_to_kv_pool_allocator.get_kvcache()  # type: ignore[attr-defined]
        self.device_pages = DevicePages(kvcache, page_size, layout)
        ranks = worker_ranks(params)
        self.forward_stream = forward_stream
        self.timeout_s = config.timeout_s
        self.pools = {PoolName.KV: kvcache}
        self.layer_done_counter = LayerWiseLoadCounter(self.device_pages.shape.layers)
        self.namespace = self._namespace(server_args, ranks)
        self._keyer: Keyer = self.namespace.keyer()
        # MLA ranks hold the same latent cache: rank 0 stores, every rank reads.
        self._writer = self.device_pages.kind == "mha" or ranks.tp_rank == 0
        self._pin = self.device_pages.device.type == "cuda"
        self._streams = threading.local()
        self._staging = _StagingBuffers(self.device_pages, self._pin)
        self._log = FailureLog(logger)
        self._lock = threading.Lock()
        self._queued: dict[str, _Load] = {}
        self._loading: dict[int, _LoadJob] = {}
        self._offloads: deque[Future[bool]] = deque()
        self._backend: StorageBackend = open_backend(config)
        self._lookups, self._loader, self._reads, self._offloader = _workers()
        logger.info(
            "hicache linker for SGLang: backend %s, namespace %s",
            config.backend,
            self.namespace.describe(),
        )

    def _namespace(self, server_args: object, ranks: LinkerRanks) -> Namespace:
        shape = self.device_pages.shape
        storage_config = HiCacheStorageConfig(
            tp_rank=ranks.tp_rank,
            tp_size=ranks.tp_size,
            pp_rank=ranks.pp_rank,
            pp_size=ranks.pp_size,
            attn_cp_rank=ranks.attn_cp_rank,
            attn_cp_size=ranks.attn_cp_size,
            is_mla_model=shape.kind == "mla",
            enable_storage_metrics=False,
            is_page_first_layout=shape.layout == "page_first",
            model_name=served_model_name(server_args),
            extra_config=None,
        )
        geometry = PageGeometry(
            page_size=shape.page_size,
            indices=shape.page_size,
            elements=shape.elements,
            nbytes=shape.nbytes,
            dtype=shape.dtype,
            layout=shape.layout,
            zero_copy=False,
        )
        return Namespace.of(namespace_fields(storage_config, geometry))

    def _keys(self, hashes: Sequence[str]) -> list[bytes]:
        return self._keyer.keys([engine_key(h) for h in hashes])

    # --- lookup ---------------------------------------------------------------------

    def lookup(self, rid: str, transfers: list[PoolTransfer]) -> list[int]:
        """Every restorable prefix length in pages (1..n for n leading stored pages
        worth loading: with ``prefill_tokens_per_s`` and the store's measured reads,
        those that arrive before prefill would recompute them): one ``exists``
        round trip on a worker, waited for at most ``timeout_s``."""
        try:
            keys = self._keys(self._kv_transfer(transfers).keys or [])
            found = self._lookups.submit(self._backend.exists, keys).result(self.timeout_s)
        except FutureTimeout as exc:
            self._log.failure("lookup timed out", exc)
            return []
        except Exception as exc:
            self._log.failure("lookup failed", exc)
            return []
        worth = self.bounds.plan(min(int(found), len(keys)), self.device_pages.shape.nbytes).pages
        return list(range(1, worth + 1))

    @staticmethod
    def _kv_transfer(transfers: Sequence[PoolTransfer]) -> PoolTransfer:
        kv = [t for t in transfers if t.name == PoolName.KV]
        if len(kv) != 1 or len(transfers) != 1:
            names = [str(t.name) for t in transfers]
            raise ValueError(f"the hicache linker moves one KV transfer, got {names}")
        return kv[0]

    # --- load -----------------------------------------------------------------------

    def load(self, rid: str, transfers: list[PoolTransfer]) -> bool:
        """Queue ``rid``'s pages for the next ``start_layer_wise_loading``; False
        (nothing queued) for transfers this linker cannot move."""
        try:
            transfer = self._kv_transfer(transfers)
            hashes = list(transfer.keys or [])
            if transfer.device_indices is None or not hashes:
                raise ValueError("a load needs keys and device indices")
            ids = self.device_pages.page_ids(transfer.device_indices, len(hashes))
            load = _Load(self._keys(hashes), ids)
        except Exception as exc:
            self._log.failure("load refused", exc)
            return False
        with self._lock:
            self._queued[rid] = load
        return True

    def cancel_queued_load(self, rid: str) -> bool:
        with self._lock:
            return self._queued.pop(rid, None) is not None

    def start_layer_wise_loading(self) -> int:
        """Start the queued loads as one batch on the loader thread; its counter
        index, or -1 when nothing is queued."""
        with self._lock:
            batch, self._queued = list(self._queued.values()), {}
        if not batch:
            return -1
        index: int = self.layer_done_counter.update_producer()
        keys = [key for load in batch for key in load.keys]
        ids = torch.cat([load.page_ids for load in batch])
        job = _LoadJob(index, keys, ids)
        self._loading[index] = job
        job.future = self._loader.submit(self._run_load, job)
        return index

    def _run_load(self, job: _LoadJob) -> bool:
        try:
            staging = self._staging.take("load", len(job.keys))
            views = _page_views(staging, self.device_pages.shape.nbytes)
            clock = self.bounds.rates.clock
            start = clock()
            read = self._reads.submit(self._backend.get, job.keys, views)
            try:
                hits = read.result(self.timeout_s)
            except FutureTimeout:
                self._staging.drop("load")  # a late read may still write into it
                raise
            self.bounds.rates.record_s2h(sum(hits) * len(views[0]), clock() - start)
            if not all(hits):
                missing = len(hits) - sum(hits)
                raise LookupError(f"{missing} of {len(hits)} pages missing or damaged in the store")
            self._copy_in(job, staging)
            return True
        except Exception as exc:
            self._log.failure("load failed", exc)
            job.fail(self.layer_done_counter, exc)
            return False

    def _copy_in(self, job: _LoadJob, staging: torch.Tensor) -> None:
        """Write each layer into the device slots, then complete it on the counter
        (on a GPU: on our copy stream, after that layer's copy has finished)."""
        pages = self.device_pages
        stream = self._copy_stream()
        with _on_stream(stream):
            staged = staging.to(pages.device, non_blocking=True)
            for layer in range(pages.shape.layers):
                if job.aborted:
                    raise TimeoutError("load abandoned: finish_layer_wise_loading timed out")
                pages.write_layer(layer, job.page_ids, staged)
                if stream is not None:
                    stream.synchronize()
                job.complete(self.layer_done_counter, layer)

    def _copy_stream(self) -> torch.cuda.Stream | None:
        """This thread's copy stream on a GPU (the loader's and the offloader's), None on CPU."""
        device = self.device_pages.device
        if device.type != "cuda":
            return None
        stream: torch.cuda.Stream | None = getattr(self._streams, "stream", None)
        if stream is None:
            stream = torch.cuda.Stream(device)
            self._streams.stream = stream
        return stream

    def finish_layer_wise_loading(self, counter_index: int) -> bool:
        """Wait (bounded) until batch ``counter_index`` no longer writes device
        memory; True when every layer landed."""
        job = self._loading.pop(counter_index, None)
        if job is None or job.future is None:
            return False
        try:
            landed = job.future.result(self._job_bound())
        except FutureTimeout as exc:
            self._log.failure("load timed out", exc)
            job.abandon(self.layer_done_counter, exc)
            landed = False
        counted: bool = self.layer_done_counter.finish(counter_index)
        return bool(landed) and counted

    def _job_bound(self) -> float:
        """How long a finished batch or offload may take: its backend call's
        bound, the copies, and one job queued ahead of it."""
        return 2 * self.timeout_s + 10.0

    # --- offload --------------------------------------------------------------------

    def offload(self, transfers: list[PoolTransfer], session_id: str | None = None) -> bool:
        """Queue the pages for the offload thread, gated by ``record_offload_ready``'s
        events; False (nothing queued) for transfers this linker cannot move."""
        try:
            transfer = self._kv_transfer(transfers)
            hashes = list(transfer.keys or [])
            if transfer.device_indices is None or not hashes:
                raise ValueError("an offload needs keys and device indices")
            ids = self.device_pages.page_ids(transfer.device_indices, len(hashes))
            keys = self._keys(hashes)
            events = self.record_offload_ready()
        except Exception as exc:
            self._log.failure("offload refused", exc)
            return False
        if self._writer:
            future = self._offloader.submit(self._run_offload, keys, ids, events)
        else:  # an MLA rank other than 0: rank 0 stores the same pages
            future = Future()
            future.set_result(True)
        with self._lock:
            self._offloads.append(future)
        return True

    def _run_offload(self, keys: list[bytes], ids: torch.Tensor, events: list[object]) -> bool:
        try:
            for event in events:
                event.synchronize()  # type: ignore[attr-defined]
            # An offload is one node's pages in chain order: a stored prefix is skipped
            # (in 0.5.23 a loaded tail is offloaded again when its request inserts it).
            present = self._backend.exists(keys)
            todo = list(range(present, len(keys)))
            if not todo:
                return True
            staging = self._copy_out(ids[todo])
            views = _page_views(staging, self.device_pages.shape.nbytes)
            done = self._backend.put([keys[i] for i in todo], views)
            if not all(done):
                raise OSError(f"{len(done) - sum(done)} of {len(done)} pages not stored")
            return True
        except Exception as exc:
            self._log.failure("offload failed", exc)
            return False

    def _copy_out(self, ids: torch.Tensor) -> torch.Tensor:
        pages = self.device_pages
        staging = self._staging.take("offload", len(ids))
        stream = self._copy_stream()
        with _on_stream(stream):
            for layer in range(pages.shape.layers):
                pages.read_layer(layer, ids, staging)
            if stream is not None:
                stream.synchronize()
        return staging

    def num_completed_offloads(self) -> int:
        """Offloads finished, counted from the oldest up to the first still running."""
        with self._lock:
            done = 0
            for future in self._offloads:
                if not future.done():
                    break
                done += 1
            return done

    def pop_completed_offload(self) -> bool:
        """The oldest offload's result (False when none is queued or it does not
        finish within its bound)."""
        with self._lock:
            future = self._offloads.popleft() if self._offloads else None
        if future is None:
            return False
        try:
            return bool(future.result(self._job_bound()))
        except FutureTimeout as exc:
            self._log.failure("offload timed out", exc)
            return False

    # --- lifecycle ------------------------------------------------------------------

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until every started load and offload has finished; False when some
        are still running after ``timeout_s``. Changes nothing."""
        with self._lock:
            futures = [*self._offloads]
        futures += [job.future for job in self._loading.values() if job.future is not None]
        # One bound for all of them; a job that failed has finished too.
        return not wait_futures(futures, timeout=timeout_s).not_done

    def reset(self) -> None:
        """Wait (bounded) for transfers in flight, then drop every queued load,
        batch and offload result."""
        if not self.wait_idle(self._job_bound()):
            self._log.failure("reset", TimeoutError("transfers still running at reset"))
        for job in self._loading.values():
            job.abandon(self.layer_done_counter, RuntimeError("linker reset"))
        with self._lock:
            self._queued.clear()
            self._offloads.clear()
        self._loading.clear()
        self.layer_done_counter.reset()

    def close(self) -> None:
        """``reset``, stop the worker threads and close the backend; idempotent."""
        self.reset()
        for pool in (self._lookups, self._loader, self._reads, self._offloader):
            pool.shutdown(wait=False, cancel_futures=True)
        self._log.call("close failed", self._backend.close, None)

    def stats(self) -> AdapterStats:
        """The backend's counters and this linker's failures by kind (never raises)."""
        storage = self._log.call("stats failed", self._backend.stats, None)
        errors = backend_errors(self._backend)
        return AdapterStats(storage, self._log.counts(), self.namespace.describe(), errors)


class _LoadJob:
    """One started batch: its pages, and the counter updates it may still make
    (none after ``abandon``: a late layer never lands in slots SGLang frees)."""

    def __init__(self, index: int, keys: list[bytes], page_ids: torch.Tensor) -> None:
        self.index, self.keys, self.page_ids = index, keys, page_ids
        self.future: Future[bool] | None = None
        self.aborted = False
        self._lock = threading.Lock()

    def complete(self, counter: LayerWiseLoadCounter, layer: int) -> None:
        with self._lock:
            if self.aborted:
                raise TimeoutError("load abandoned")
            counter.complete(self.index, layer)

    def fail(self, counter: LayerWiseLoadCounter, exc: BaseException) -> None:
        with self._lock:
            counter.fail(self.index, exc)

    def abandon(self, counter: LayerWiseLoadCounter, exc: BaseException) -> None:
        with self._lock:
            self.aborted = True
            counter.fail(self.index, exc)


class _StagingBuffers:
    """One reused staging tensor per use ("load": the loader thread, "offload": the
    offload thread), grown on demand: fresh memory costs a page fault per 4 KiB
    on the first touch, the store's read or write of a whole batch. Each use is
    one thread's; ``drop`` forgets a buffer that a late read may still fill."""

    def __init__(self, pages: DevicePages, pin: bool) -> None:
        self._pages, self._pin = pages, pin
        self._buffers: dict[str, torch.Tensor] = {}
        self._lock = threading.Lock()

    def take(self, use: str, count: int) -> torch.Tensor:
        """``count`` pages of the ``use``'s buffer (as ``(count, *page shape)``)."""
        with self._lock:
            buf = self._buffers.get(use)
            if buf is None or buf.shape[0] < count:
                buf = self._pages.staging(count, self._pin)
                self._buffers[use] = buf
        return buf[:count]

    def drop(self, use: str) -> None:
        with self._lock:
            self._buffers.pop(use, None)


def _page_views(staging: torch.Tensor, nbytes: int) -> list[memoryview]:
    whole = _byte_view(staging)
    return [whole[i * nbytes : (i + 1) * nbytes] for i in range(staging.shape[0])]


def _on_stream(stream: torch.cuda.Stream | None) -> contextlib.AbstractContextManager[object]:
    return contextlib.nullcontext() if stream is None else torch.cuda.stream(stream)
