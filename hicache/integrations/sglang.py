"""SGLang HiCache's storage tier (L3) over hicache's stores: ``HicacheStorage``.

A real SGLang server (0.5.x) loads it with no change to SGLang::

    --enable-hierarchical-cache --hicache-mem-layout page_first
    --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "hicache",
        "module_path": "hicache.integrations.sglang", "class_name": "HicacheStorage",
        "interface_v1": 1, "hicache_config": "remote"}'

``hicache_config`` names a shipped config or a TOML path whose ``[storage]``
section picks the backend (the daemon by default); any other key of the
extra config overrides one of its fields (``"endpoint"``, ``"path"``, ...),
except ``prefill_tokens_per_s`` (the model's prefill speed: reads then stop
at a deadline from the store's measured bandwidth, ``load_deadline``), and
an unknown key fails the construction with one error naming it.

Keys. SGLang's page keys are 64-hex chained sha256 hashes of the tokens and
carry no model, dtype, layout or rank. The namespace adds them: model name,
dtype, host layout, page geometry and bytes, attention kind, TP rank/size
(except MLA, whose ranks hold the same latent cache: only the writer stores,
every rank reads), PP, attention-CP and DCP ranks when present. Our page key
is ``sha256(namespace digest ‖ SGLang key)`` (``integrations.common``: why
not a store prefix or fingerprint): two TP ranks never see each other's
pages, MLA ranks share them, and the key is deterministic, so several
servers share pages through one daemon or one LMDB path.

Values. One stored page per SGLang page: the flat page ``get_data_page``
gives (all layers, K then V), in our checksummed page format; a damaged page
is a miss and is deleted by the backend. The generic calls (``get``,
``batch_get``, ``set``, ``batch_set``) and the v1 calls (``batch_get_v1``,
``batch_set_v1``, zero-copy through ``get_page_buffer_meta`` for the
``page_first`` and ``page_first_direct`` layouts) store the same bytes, so
either path reads what the other wrote; ``layer_first`` pools go through the
generic flat page in v1 too (a logged hint names ``--hicache-mem-layout
page_first``).

Failures. SGLang's prefetch and backup threads die on an exception, so no
method raises after construction: every failure is ``False`` / ``0`` /
``None``, counted by kind (``stats()``) and logged rate-limited. A daemon
that is down costs at most ``timeout_s`` per call, then its breaker fails
fast. Thread-safe: SGLang calls from its prefetch, prefetch-IO and backup
threads at once; the backends are thread-safe (the daemon client keeps a
socket per thread) and staging buffers are per thread.
"""

from __future__ import annotations

import hashlib
import logging
import operator
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
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
from hicache.integrations.load_deadline import LoadBounds, ReadPiece, prefill_speed
from storage_backends.base import StorageBackend, StorageStats
from storage_backends.scatter import get_scatter, put_gather

logger = logging.getLogger(__name__)

# Keys of SGLang's extra config that are SGLang's own (not overrides of our config).
ENGINE_KEYS = frozenset({"backend_name", "module_path", "class_name", "interface_v1"})
# Layouts whose get_page_buffer_meta chunks, concatenated, are the flat data page.
ZERO_COPY_LAYOUTS = frozenset({"page_first", "page_first_direct"})
_HEX = frozenset("0123456789abcdefABCDEF")


class PageGeometry(NamedTuple):
    """One SGLang page as stored: ``elements`` values of ``dtype``, ``nbytes`` bytes;
    ``indices`` host indices per page (the logical page size: with DCP a rank's
    physical page holds fewer tokens than the indices SGLang hands over)."""

    page_size: int
    indices: int
    elements: int
    nbytes: int
    dtype: torch.dtype
    layout: str
    zero_copy: bool


@dataclass(frozen=True)
class AdapterStats:
    """The backend's counters plus the adapter's own failures by kind.

    ``backend_errors``: backend calls that failed other than by a miss (no reply
    in time, the daemon down or refusing, an error reply, an exception); while
    it rises, misses mean an unreachable store, not evicted pages.
    """

    storage: StorageStats | None
    failures: dict[str, int]
    namespace: str
    backend_errors: int


def engine_key(text: str) -> bytes:
    """SGLang's 64-hex page hash as its 32 bytes; any other key text is hashed
    (a domain-separated sha256), so an unexpected key form is still a key."""
    if len(text) == 64 and _HEX.issuperset(text):
        return bytes.fromhex(text)
    return hashlib.sha256(b"sglang-key-text\0" + text.encode()).digest()


def namespace_fields(config: HiCacheStorageConfig, geometry: PageGeometry) -> dict[str, object]:
    """What SGLang's keys leave out; every config field is read with a default
    (``HiCacheStorageConfig`` gains fields between releases)."""

    def field(name: str, default: object) -> object:
        return getattr(config, name, default)

    mla = bool(field("is_mla_model", False))
    fields: dict[str, object] = {
        "engine": "sglang",
        "model": field("model_name", None) or "",
        "attention": "mla" if mla else "mha",
        "dtype": str(geometry.dtype).removeprefix("torch."),
        "layout": geometry.layout,
        "page_size": geometry.page_size,
        "page_bytes": geometry.nbytes,
    }
    if not mla:
        fields.update(tp_rank=field("tp_rank", 0), tp_size=field("tp_size", 1))
    for rank, size in (("pp_rank", "pp_size"), ("attn_cp_rank", "attn_cp_size")):
        if int(field(size, 1) or 1) > 1:  # type: ignore[call-overload]
            fields.update({rank: field(rank, 0), size: field(size, 1)})
    if int(field("dcp_size", 1) or 1) > 1:  # type: ignore[call-overload]
        fields.update(dcp_rank=field("dcp_rank", 0), dcp_size=field("dcp_size", 1))
        fields.update(tp_size=field("tp_size", 1))
    return fields


def _byte_view(tensor: torch.Tensor) -> memoryview:
    """A 1-D byte view of a contiguous CPU tensor's memory (no copy)."""
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        raise ValueError(f"need a contiguous CPU tensor, got {tensor.device} {tensor.shape}")
    view: memoryview = tensor.reshape(-1).view(torch.uint8).numpy().data
    return view


class _PageMeter:
    """Pages and GB/s per call, as SGLang's StorageMetrics wants (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lists: dict[str, list[float]] = {
            "prefetch_pgs": [],
            "backup_pgs": [],
            "prefetch_bandwidth": [],
            "backup_bandwidth": [],
        }

    def record(self, kind: str, pages: int, nbytes: int, seconds: float) -> None:
        with self._lock:
            self._lists[f"{kind}_pgs"].append(pages)
            self._lists[f"{kind}_bandwidth"].append(nbytes / max(seconds, 1e-9) / 1e9)

    def take(self) -> dict[str, list[float]]:
        with self._lock:
            taken = {name: list(values) for name, values in self._lists.items()}
            for values in self._lists.values():
                values.clear()
        return taken


class HicacheStorage(HiCacheStorage):  # type: ignore[misc]
    """SGLang's ``HiCacheStorage`` over a hicache store (see the module doc).

    Constructed by SGLang's ``StorageBackendFactory`` as ``cls(storage_config,
    kwargs)``; raises ValueError for an unknown extra-config key or a bad
    config, and what the backend raises when its store cannot be opened.
    Every other method returns SGLang's "miss"/"not stored" value on failure.
    """

    def __init__(
        self, storage_config: HiCacheStorageConfig, kwargs: dict[str, object] | None = None
    ) -> None:
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        config = resolve_storage_config(
            str(extra.get("hicache_config", DEFAULT_HICACHE_CONFIG)),
            extra,
            ignore=ENGINE_KEYS | {"hicache_config", "prefill_tokens_per_s"},
            source="hicache SGLang storage (--hicache-storage-backend-extra-config)",
        )
        # The engine's prefill speed: with it, a read is bounded by a deadline (load_deadline).
        self._prefill = prefill_speed(extra)
        self.bounds: LoadBounds | None = None
        self.storage_config = storage_config
        self.timeout_s = config.timeout_s
        self._log = FailureLog(logger)
        self._local = threading.local()
        self._meter = _PageMeter()
        self._metrics = bool(getattr(storage_config, "enable_storage_metrics", False))
        self._geometry: PageGeometry | None = None
        self._keyer: Keyer | None = None
        self._namespace = ""
        self._pool_view: tuple[torch.Tensor, int, memoryview] | None = None
        self._backend: StorageBackend = open_backend(config)
        self._backend_name = config.backend
        logger.info("hicache storage for SGLang: backend %s", config.backend)

    # --- set-up ---------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: object) -> None:
        """Take the host pool; the namespace needs its dtype, layout and page size."""
        super().register_mem_pool_host(mem_pool_host)
        try:
            self._register(mem_pool_host)
        except Exception as exc:  # a pool we cannot read: every call is then a miss
            self._log.failure("host pool not usable", exc)

    def _register(self, pool: object) -> None:
        dummy: torch.Tensor = pool.get_dummy_flat_data_page()  # type: ignore[attr-defined]
        layout = str(getattr(pool, "layout", "layer_first"))
        page_size = int(pool.page_size)  # type: ignore[attr-defined]
        geometry = PageGeometry(
            page_size=page_size,
            indices=int(getattr(pool, "logical_page_size", page_size)),
            elements=dummy.numel(),
            nbytes=dummy.numel() * dummy.element_size(),
            dtype=dummy.dtype,
            layout=layout,
            zero_copy=layout in ZERO_COPY_LAYOUTS,
        )
        namespace = Namespace.of(namespace_fields(self.storage_config, geometry))
        self._geometry, self._keyer = geometry, namespace.keyer()
        self.bounds = LoadBounds(geometry.indices, self._prefill, self._backend_name)
        self._namespace = namespace.describe()
        logger.info("hicache storage namespace: %s", self._namespace)
        if not geometry.zero_copy:
            logger.info(
                "hicache storage: host layout %r is copied through a flat page in "
                "batch_get_v1/batch_set_v1; --hicache-mem-layout page_first makes them zero-copy",
                layout,
            )

    def _ready(self) -> tuple[PageGeometry, Keyer]:
        if self._geometry is None or self._keyer is None:
            raise RuntimeError("no usable host pool registered (register_mem_pool_host)")
        return self._geometry, self._keyer

    def _keys(self, keys: Sequence[str]) -> list[bytes]:
        return self._ready()[1].keys([engine_key(k) for k in keys])

    # --- lookups --------------------------------------------------------------------

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_exists(
        self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> int:
        """Length of the hit prefix of ``keys``: one backend round trip."""
        return self._log.call(
            "batch_exists failed", lambda: self._backend.exists(self._keys(keys)), 0
        )

    # --- generic path (flat data pages) ---------------------------------------------

    def get(
        self,
        key: str,
        target_location: torch.Tensor | None = None,
        target_sizes: object = None,
    ) -> torch.Tensor | None:
        targets = None if target_location is None else [target_location]
        return self.batch_get([key], targets)[0]

    def batch_get(
        self,
        keys: list[str],
        target_locations: list[torch.Tensor] | None = None,
        target_sizes: object = None,
    ) -> list[torch.Tensor | None]:
        """Read each page into its flat target (a dummy page when none is given)."""
        return self._log.call(
            "batch_get failed", lambda: self._batch_get(keys, target_locations), [None] * len(keys)
        )

    def _batch_get(
        self, keys: list[str], targets: list[torch.Tensor] | None
    ) -> list[torch.Tensor | None]:
        if targets is None:
            pool = self.mem_pool_host
            targets = [pool.get_dummy_flat_data_page() for _ in keys]
        start = time.perf_counter()
        keyed, views = self._keys(keys), [_byte_view(t) for t in targets]
        hits = self._read(len(keys), lambda lo, hi: self._backend.get(keyed[lo:hi], views[lo:hi]))
        self._measure("prefetch", hits, start)
        return [t if hit else None for t, hit in zip(targets, hits, strict=True)]

    def set(
        self,
        key: str,
        value: torch.Tensor | None = None,
        target_location: object = None,
        target_sizes: object = None,
    ) -> bool:
        return self.batch_set([key], None if value is None else [value])

    def batch_set(
        self,
        keys: list[str],
        values: list[torch.Tensor] | None = None,
        target_locations: object = None,
        target_sizes: object = None,
    ) -> bool:
        """Store each flat page; True only when every page is stored."""
        return self._log.call("batch_set failed", lambda: all(self._batch_set(keys, values)), False)

    def _batch_set(self, keys: list[str], values: list[torch.Tensor] | None) -> list[bool]:
        if values is None or len(values) != len(keys):
            raise ValueError(
                f"batch_set needs one value per key, got {keys!r:.80} / {values!r:.80}"
            )
        views = [_byte_view(v if v.is_contiguous() else v.contiguous()) for v in values]
        start = time.perf_counter()
        stored = self._backend.put(self._keys(keys), views)
        self._measure("backup", stored, start)
        return stored

    # --- v1 path (host pool pages by index) -----------------------------------------

    def batch_get_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        """Read pages straight into the host pool at ``host_indices`` (one page
        per ``page_size`` indices); per-page hits."""
        return self._log.call(
            "batch_get_v1 failed", lambda: self._get_v1(keys, host_indices), [False] * len(keys)
        )

    def batch_set_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        """Store the host pool's pages at ``host_indices``; per-page success."""
        return self._log.call(
            "batch_set_v1 failed", lambda: self._set_v1(keys, host_indices), [False] * len(keys)
        )

    def _check_indices(self, keys: Sequence[str], host_indices: torch.Tensor) -> PageGeometry:
        geometry = self._ready()[0]
        if host_indices.numel() != len(keys) * geometry.indices:
            raise ValueError(
                f"{len(keys)} keys need {len(keys) * geometry.indices} host indices, "
                f"got {host_indices.numel()}"
            )
        return geometry

    def _get_v1(self, keys: list[str], host_indices: torch.Tensor) -> list[bool]:
        geometry = self._check_indices(keys, host_indices)
        start, keyed = time.perf_counter(), self._keys(keys)
        if geometry.zero_copy:  # straight into each page's runs (an MHA page: K and V)
            chunks: list[Sequence[memoryview]] = list(self._pool_chunks(host_indices, len(keys)))
            hits = self._read(
                len(keys), lambda lo, hi: get_scatter(self._backend, keyed[lo:hi], chunks[lo:hi])
            )
            self._measure("prefetch", hits, start)
            return hits
        views = self._staging(len(keys))
        hits = self._read(len(keys), lambda lo, hi: self._backend.get(keyed[lo:hi], views[lo:hi]))
        self._measure("prefetch", hits, start)
        starts: list[int] = host_indices[:: geometry.indices].tolist()
        for i, hit in enumerate(hits):
            if hit:
                flat = torch.frombuffer(views[i], dtype=torch.uint8).view(geometry.dtype)
                self.mem_pool_host.set_from_flat_data_page(starts[i], flat)
        return hits

    def _set_v1(self, keys: list[str], host_indices: torch.Tensor) -> list[bool]:
        geometry = self._check_indices(keys, host_indices)
        if geometry.zero_copy:  # straight from each page's runs (an MHA page: K and V)
            chunks = self._pool_chunks(host_indices, len(keys))
            start = time.perf_counter()
            stored = put_gather(self._backend, self._keys(keys), list(chunks))
            self._measure("backup", stored, start)
            return stored
        pool = self.mem_pool_host
        starts: list[int] = host_indices[:: geometry.indices].tolist()
        views = [_byte_view(pool.get_data_page(s, flat=True).contiguous()) for s in starts]
        start = time.perf_counter()
        stored = self._backend.put(self._keys(keys), views)
        self._measure("backup", stored, start)
        return stored

    def _pool_chunks(self, host_indices: torch.Tensor, pages: int) -> list[list[memoryview]]:
        """Each page's runs of host memory, from SGLang's ``get_page_buffer_meta``,
        as slices of the pool buffer's bytes, checked to lie inside it and to add
        up to one flat page."""
        pool, geometry = self.mem_pool_host, self._ready()[0]
        ptrs, sizes = pool.get_page_buffer_meta(host_indices)
        if not ptrs or len(ptrs) != len(sizes) or len(ptrs) % pages:
            raise ValueError(f"get_page_buffer_meta gave {len(ptrs)} pointers for {pages} pages")
        base, whole = self._pool_bytes()
        per_page = len(ptrs) // pages
        offsets = [ptr - base for ptr in ptrs]
        if min(offsets) < 0 or max(map(operator.add, offsets, sizes)) > len(whole):
            raise ValueError("get_page_buffer_meta points outside the host pool's buffer")
        runs = [whole[offset : offset + size] for offset, size in zip(offsets, sizes, strict=True)]
        out = [runs[p * per_page : (p + 1) * per_page] for p in range(pages)]
        if any(sum(map(len, page)) != geometry.nbytes for page in out):
            raise ValueError("get_page_buffer_meta's runs do not add up to one flat page")
        return out

    def _pool_bytes(self) -> tuple[int, memoryview]:
        """The host pool buffer's address and a byte view of all of it (cached)."""
        buffer: torch.Tensor = self.mem_pool_host.kv_buffer
        cached = self._pool_view
        if cached is None or cached[0] is not buffer:
            cached = (buffer, buffer.data_ptr(), _byte_view(buffer))
            self._pool_view = cached
        return cached[1], cached[2]

    def _staging(self, pages: int) -> list[memoryview]:
        """This thread's flat pages (grown on demand, reused across calls)."""
        nbytes = self._ready()[0].nbytes
        buf: memoryview | None = getattr(self._local, "staging", None)
        if buf is None or len(buf) < pages * nbytes:
            buf = memoryview(bytearray(pages * nbytes))
            self._local.staging = buf
        return [buf[i * nbytes : (i + 1) * nbytes] for i in range(pages)]

    # --- what SGLang asks besides I/O -----------------------------------------------

    def batch_exists_v2(
        self, keys: list[str], pool_transfers: object = None, extra_info: object = None
    ) -> object:
        """Hybrid pools (Mamba, SWA, DSA sidecars) are not supported: no hit."""
        from sglang.srt.mem_cache.hicache_storage import PoolTransferResult

        self._log.failure("v2 pool API not supported", NotImplementedError("batch_exists_v2"))
        return PoolTransferResult.empty()

    def batch_get_v2(
        self, transfers: list[object], extra_info: object = None
    ) -> dict[str, list[bool]]:
        self._log.failure("v2 pool API not supported", NotImplementedError("batch_get_v2"))
        return {str(t.name): [False] * len(t.keys or []) for t in transfers}  # type: ignore[attr-defined]

    def batch_set_v2(
        self, transfers: list[object], extra_info: object = None
    ) -> dict[str, list[bool]]:
        self._log.failure("v2 pool API not supported", NotImplementedError("batch_set_v2"))
        return {str(t.name): [False] * len(t.keys or []) for t in transfers}  # type: ignore[attr-defined]

    def clear(self) -> bool:
        """Not supported: the store is shared (other servers, ranks, tenants) and
        cannot be listed by namespace. Logs why and returns False."""
        logger.warning(
            "hicache storage: clear() deletes nothing; the store is shared with other "
            "servers and ranks. Pages age out by LRU; to empty a store, stop its users "
            "and remove it (see docs/sglang.md)"
        )
        return False

    def get_stats(self) -> object:
        """SGLang's StorageMetrics (pages and GB/s per call since the last call)
        when storage metrics are enabled, else None."""
        if not self._metrics:
            return None
        taken = self._meter.take()

        def build() -> object:
            from sglang.srt.observability.metrics_collector import StorageMetrics

            return StorageMetrics(**taken)

        return self._log.call("storage metrics unavailable", build, None)

    def stats(self) -> AdapterStats:
        """The backend's counters and this adapter's failures (never raises)."""
        storage = self._log.call("stats failed", self._backend.stats, None)
        errors = backend_errors(self._backend)
        return AdapterStats(storage, self._log.counts(), self._namespace, errors)

    def close(self) -> None:
        """Close the backend; idempotent. Calls after it are misses."""
        self._log.call("close failed", self._backend.close, None)

    # --- helpers --------------------------------------------------------------------

    def _read(self, pages: int, piece: ReadPiece) -> list[bool]:
        """Read ``pages`` pages, bounded by the load deadline once rates are known."""
        if self.bounds is None or self._geometry is None:
            return piece(0, pages)
        return self.bounds.read(pages, self._geometry.nbytes, piece)

    def _measure(self, kind: str, done: list[bool], start: float) -> None:
        if self._metrics and self._geometry is not None:
            pages = sum(done)
            self._meter.record(
                kind, pages, pages * self._geometry.nbytes, time.perf_counter() - start
            )
