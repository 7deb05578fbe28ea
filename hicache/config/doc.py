"""The configuration tables (the cache's, the daemon's), generated from the config
dataclasses and the shipped files: the documentation site's reference pages
(``docs/hooks/pages.py`` builds them at build time from ``table_rows``), so a
table can never disagree with the code or with ``configs/default.toml`` /
``configs/daemon.toml``. ``python -m hicache.config.doc`` prints them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import NamedTuple

from hicache.config.cache import CacheConfig, choice_fields
from hicache.config.loader import keys_of
from hicache.config.shipped import resolve_config

MEANINGS: dict[str, str] = {
    "model.model_id": "names the model; part of the page-key fingerprint",
    "model.num_layers": "KV geometry: layers",
    "model.kv_heads": "KV geometry: KV heads (MHA)",
    "model.head_dim": "KV geometry: head dimension (MHA)",
    "model.dtype": "`float32`, `float16` or `bfloat16`",
    "model.attention": "`mha`, or `mla` (one latent buffer per layer)",
    "model.kv_lora_rank": "MLA latent width",
    "model.rope_dim": "MLA rotary part width",
    "model.tp_rank": "tensor-parallel rank; part of the fingerprint",
    "model.tp_size": "tensor-parallel size; part of the fingerprint",
    "device.device": "`auto` (cuda if available, else cpu), `cpu`, `cuda[:N]`",
    "device.page_size": "tokens per page, in every tier",
    "device.num_tokens": "device pool size in tokens (wins over `size_gb`)",
    "device.size_gb": "device pool size in GB, when `num_tokens` is 0",
    "host.enabled": "the host tier (needed by storage)",
    "host.ratio": "host pool size as a multiple of the device pool",
    "host.size_gb": "host pool size in GB (wins over `ratio`)",
    "host.layout": "`layer_first`, or `page_first` (a page contiguous across layers)",
    "host.reserve_gb": "host memory left to the rest of the machine",
    "storage.backend": "`none` (off), an entry-point name, `pkg.mod:Class`, or a built-in",
    "storage.path": "store directory (disk, lmdb, file); empty: the per-user cache directory",
    "storage.max_bytes": "store capacity; least recently used pages go first",
    "storage.map_size": "LMDB map size; 0: `max_bytes` plus headroom",
    "storage.timeout_s": (
        "longest wait on storage or transfer work (`drain`, `reset`, `close`, `wait_prefetch`,"
        " a network request); work that overruns lands later"
    ),
    "storage.max_page_bytes": "largest page a backend accepts",
    "storage.fingerprint": "set by the cache (the model fingerprint); leave empty",
    "storage.allow_fingerprint_mismatch": "open a store written for another model anyway",
    "storage.sync": (
        "durability, what a crash may cost (no level serves a wrong byte; a process crash"
        " never loses an acknowledged page): `none` (no fsync; an OS crash may lose recent"
        " pages, or the whole store when it leaves the index damaged), `index` (each batch's"
        " index commit fsynced, page data left to the OS: an OS crash may lose the last"
        " pages, as misses), `full` (data, then index, fsynced: nothing acknowledged is lost);"
        " `true`/`false` mean `full`/`none`; lmdb and file: `index` is `full`"
    ),
    "storage.endpoint": (
        "network store: `redis://host:port[,…]`, `mooncake://host:port`, "
        "or the daemon's `tcp://HOST:PORT` / `ipc://PATH` (`remote`)"
    ),
    "storage.key_prefix": "redis, mooncake: first part of every key (fleets sharing a store)",
    "storage.curve_client_key": "`remote` with CURVE: this engine's `.key_secret` file",
    "storage.curve_server_key": "`remote` with CURVE: the daemon's public key file",
    "storage.breaker_failures": (
        "`remote`: BUSY/INTERNAL replies in a row before calls fail fast "
        "(a timeout opens the breaker at once)"
    ),
    "storage.breaker_cooldown_s": "`remote`: fail-fast period; then one PING probes the daemon",
    "storage.shm": (
        "`remote` over `ipc://`: move pages through the daemon's shared-memory slab"
        " (`server.shm_bytes`); frames when the daemon has none"
    ),
    "storage.io_threads": "`disk`: threads reading/writing one batch's pages (bytes in flight)",
    "storage.segment_bytes": "`disk`: size of one segment file (fixed when the store is created)",
    "storage.direct_io": "`disk`: O_DIRECT, bypassing the page cache (refused where unsupported)",
    "policy.eviction": "which unlocked device leaf goes first",
    "policy.write_policy": "when device pages are backed up to host",
    "policy.write_through_threshold": "hits before a selective backup",
    "policy.load_back_threshold": "smallest host hit worth loading back (tokens)",
    "policy.prefetch_threshold": "smallest storage hit worth prefetching (tokens)",
    "policy.prefetch_policy": (
        "how much of a storage or host hit to load and how long to wait for it"
    ),
    "policy.prefetch_timeout_base_s": "`timeout` policy: fixed part of the budget",
    "policy.prefetch_timeout_per_1k_s": "`timeout` policy: budget per 1k prefetched tokens",
    "policy.cost_margin": (
        "`cost` policy: a load must take at most 1/margin of recomputing its tokens"
    ),
    "policy.cost_probe_s": (
        "`cost` policy: a store judged too slow is read a little again after this long"
    ),
    "policy.prefill_tokens_per_s": (
        "`cost` policy: prefill speed until the engine has reported one (0: none)"
    ),
    "policy.io_workers": "storage I/O threads",
    "transfer.backend": "`auto`, `cpu` (threads) or `cuda` (streams)",
    "transfer.io_backend": "`direct`, or `kernel` (cupy gather/scatter, CUDA only)",
    "transfer.workers": "CPU copy threads",
    "events.endpoint": "ZeroMQ endpoint for KV events (`tcp://127.0.0.1:*`: any port); empty: off",
    "events.topic": "topic frame of each published batch",
    "events.format": "wire schema the router decodes: `vllm` or `sglang`",
    "events.replay_endpoint": "ROUTER endpoint serving missed batches by sequence; empty: off",
    "events.replay_buffer": "batches kept for replay",
    "metrics.port": "Prometheus metrics over HTTP; 0: off",
    "metrics.host": "address the metrics server binds",
}


DAEMON_MEANINGS: dict[str, str] = {
    "server.endpoint": "`tcp://HOST:PORT` (port 0: OS-picked) or `ipc://PATH` to listen on",
    "server.allow_remote": "bind beyond loopback without CURVE (logged as a warning)",
    "server.max_inflight_requests": (
        "writes waiting for their commit, and reads waiting for a reader; more are answered BUSY"
    ),
    "server.max_inflight_bytes": "bytes of those writes; more are answered BUSY",
    "server.ready_file": "JSON `{endpoint, metrics_port, pid}` written once bound; empty: none",
    "server.shutdown_timeout_s": "on SIGTERM, longest wait for in-flight writes to commit",
    "server.max_queued_reply_bytes_per_peer": "GET replies one client has not read; over it, BUSY",
    "server.max_queued_reply_bytes": "GET replies not read yet, all clients; over it, BUSY",
    "server.max_peers": (
        "connections at once (kept under the fd limit); a new one over it takes the slot of "
        "the connection longest without traffic if that one was silent for 2 heartbeats, "
        "else it is refused"
    ),
    "server.readers": "threads answering GET and EXISTS; one client's reads at a time, in turn",
    "server.heartbeat_s": "ZMTP heartbeat; a peer silent for 3 intervals is dropped; 0: off",
    "server.handshake_timeout_s": "a connection that has not handshaken by then is dropped",
    "server.io_threads": (
        "ZeroMQ I/O threads; each connection is served by one, so while one copies a client's "
        "bulk frames another client's small ones go through another"
    ),
    "server.background_nice": (
        "added to the nice value of the writer and reader threads (Linux; 0..19, 0: off): on "
        "busy cores the socket thread runs first, so small requests wait less behind bulk ones"
    ),
    "server.shm_bytes": (
        "shared-memory slab for same-host clients (`ipc://` only, not with CURVE; clients opt"
        " in with `storage.shm`): pages cross it instead of the socket; 0: off"
    ),
    "store.backend": (
        "the page store: `disk` (segment files + an LMDB index; the default), or `lmdb`; a"
        " directory that already holds a store of the other kind is opened as it is (logged),"
        " never emptied"
    ),
    "store.path": "store directory; empty: `daemon-store` in the per-user cache directory",
    "store.max_bytes": "store capacity; least recently used pages go first",
    "store.memory_bytes": (
        "memory LRU in front of the store: pages read from the store a second time (verified"
        " there; a PUT does not fill it), answered on the socket thread without a store read"
    ),
    "store.sync": (
        "durability as `storage.sync`: `none` (the default), `index`, `full` (`true`/`false`"
        " mean `full`/`none`; lmdb: `index` is `full`); a PUT is acknowledged once its bytes"
        " are written and its index entry committed, so an acknowledged page survives"
        " `kill -9` of the daemon at every level; `index` and `full` add fsyncs for an OS crash"
    ),
    "limits.max_batch_keys": "keys in one request",
    "limits.max_key_bytes": "bytes of one key",
    "limits.max_page_bytes": "bytes of one page",
    "limits.max_request_bytes": "bytes of one request, all frames",
    "metrics.host": "address the metrics server binds",
    "metrics.port": "Prometheus metrics over HTTP; -1: off, 0: OS-picked",
    "auth.curve": "CURVE encryption and client keys; each key is a tenant",
    "auth.server_secret_key": "the daemon's `.key_secret` file (`hicache keygen`)",
    "auth.tenants": (
        "`[[auth.tenants]]` tables: `name`, `public_key` (z85, or a `.key` file),"
        " `max_store_bytes` (0: the shared store; > 0: a store of its own, its older pages in"
        " the shared store stay readable until evicted there), `admin` (STATS of the whole"
        " daemon)"
    ),
}


class Table(NamedTuple):
    """One generated table: the config it documents, with the meaning of each key."""

    cls: type
    shipped: str  # the shipped config of the "--config" column
    meanings: dict[str, str]


def tables() -> tuple[Table, Table]:
    from hicache.config.daemon import DaemonConfig

    return (
        Table(CacheConfig, "default", MEANINGS),
        Table(DaemonConfig, "daemon", DAEMON_MEANINGS),
    )


class FieldDoc(NamedTuple):
    key: str
    unset: object  # the dataclass default: what a key left out of a file gets
    shipped: object  # its value in configs/default.toml (``--config default``)
    meaning: str


def config_keys(cls: type = CacheConfig) -> Iterator[str]:
    """Every ``section.key``, in declaration order (as the loader knows them)."""
    return keys_of(cls)


def _value(config: object, key: str) -> object:
    section, _, name = key.partition(".")
    return getattr(getattr(config, section), name)


def field_docs(table: Table | None = None) -> list[FieldDoc]:
    t = table or tables()[0]
    shipped = t.cls.from_toml(resolve_config(t.shipped))  # type: ignore[attr-defined]
    unset = t.cls()
    return [
        FieldDoc(k, _value(unset, k), _value(shipped, k), _meaning(k, t.meanings))
        for k in config_keys(t.cls)
    ]


def _meaning(key: str, meanings: dict[str, str]) -> str:
    """The key's meaning; registry-backed keys list the registry's names."""
    meaning = meanings.get(key, "")
    names = choice_fields().get(key) if meanings is MEANINGS else None
    if names:
        meaning += ": " + ", ".join(f"`{n}`" for n in names)
    return meaning


def _show(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, tuple):
        return "none" if not value else f"{len(value)} entries"
    if isinstance(value, int) and value >= 1 << 20 and value % (1 << 20) == 0:
        return f"{value >> 20} MiB" if value < 1 << 30 else f"{value >> 30} GiB"
    return str(value)


def table_head(table: Table | None = None) -> str:
    """The header lines of a generated table (the documentation site repeats them per section)."""
    t = table or tables()[0]
    return f"| key | `--config {t.shipped}` | left out | meaning |\n| --- | --- | --- | --- |"


def table_rows(table: Table | None = None) -> list[tuple[str, str]]:
    """``(key, Markdown row)`` for each key of ``table``, in declaration order."""
    out = []
    for d in field_docs(table or tables()[0]):
        shipped, unset = _show(d.shipped), _show(d.unset)
        left_out = "same" if unset == shipped else unset
        out.append((d.key, f"| `{d.key}` | {shipped} | {left_out} | {d.meaning} |"))
    return out


def markdown_table(table: Table | None = None) -> str:
    return "\n".join([table_head(table), *(row for _, row in table_rows(table))])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hicache.config.doc", description=__doc__)
    parser.parse_args(argv)
    print("\n\n".join(markdown_table(t) for t in tables()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
