"""The tier set-ups a trace replay runs: sizes in tokens, sweeps as lists.

For each device size: device only; for each host size, device + host; for
each storage size, device + host + storage. Every set-up keeps the config's
policies, transfer settings and storage backend (the store the config names,
in a fresh directory per set-up), and replaces what the flags size: the page
size, the pools' geometry (``trace.models.REPLAY_MODEL``) and each tier's
capacity. Sizes are rounded down to whole pages, and the storage tier holds
exactly that many pages: its ``max_bytes`` is pages × (record header + page).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

from hicache.bench.tiering.stores import NETWORK_BACKENDS, storage_setup
from hicache.bench.tiering.trace.models import REPLAY_MODEL, replay_bytes_per_token
from hicache.config.cache import CacheConfig, HostConfig
from storage_backends import StorageConfig
from storage_backends.page_format import HEADER_BYTES

_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([kmg]?)$")
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}
# Config keys the trace flags set: a --set of one would be silently replaced.
REPLACED_KEYS = {
    "model.": "--model (the report's model; the pools use a tiny geometry)",
    "device.page_size": "--page-size",
    "device.num_tokens": "--device-tokens",
    "device.size_gb": "--device-tokens",
    "host.enabled": "--host-tokens (none: no host rows)",
    "host.ratio": "--host-tokens",
    "host.size_gb": "--host-tokens",
    "storage.max_bytes": "--storage-tokens",
    "storage.map_size": "--storage-tokens",
}


def parse_token_list(text: str, flag: str, allow_none: bool = False) -> tuple[int, ...]:
    """``1M,3M`` / ``500k`` / ``2000000`` as token counts (k, M, G: powers of ten);
    ``none`` (when allowed) is the empty list. ValueError naming ``flag``."""
    if allow_none and text.strip().lower() in ("none", "0", ""):
        return ()
    out = []
    for part in text.split(","):
        match = _SIZE.match(part.strip().lower())
        if match is None:
            hint = ", or none" if allow_none else ""
            raise ValueError(f"{flag} {text!r}: expected token counts such as 1M,3M or 500k{hint}")
        value = int(float(match.group(1)) * _UNITS[match.group(2)])
        if value < 1:
            raise ValueError(f"{flag}: {part.strip()!r} is not a positive number of tokens")
        out.append(value)
    return tuple(out)


def human_tokens(n: int) -> str:
    """1000000 -> 1M, 2500000 -> 2.5M, 500000 -> 500k, 999936 -> 999,936."""
    for unit, scale in (("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if n >= scale and (n * 10) % scale == 0:
            return f"{n / scale:g}{unit}"
    return f"{n:,}"


@dataclass(frozen=True)
class TierSizes:
    """Tokens asked for per tier (0: the tier is off) and the page they round to."""

    device: int
    host: int
    storage: int
    page_size: int

    def tokens(self, tier: str) -> int:
        """The tier's capacity in tokens: the size asked for, rounded down to pages."""
        asked = {"device": self.device, "host": self.host, "storage": self.storage}[tier]
        return asked // self.page_size * self.page_size

    @property
    def label(self) -> str:
        parts = [f"device {human_tokens(self.device)}"]
        parts += [f"host {human_tokens(self.host)}"] if self.host else []
        parts += [f"storage {human_tokens(self.storage)}"] if self.storage else []
        return " + ".join(parts)


class TraceSetup(NamedTuple):
    sizes: TierSizes
    config: CacheConfig

    @property
    def name(self) -> str:
        return self.sizes.label


def sweep(
    devices: tuple[int, ...], hosts: tuple[int, ...], stores: tuple[int, ...], page_size: int
) -> list[TierSizes]:
    """Device only per device size, then + host per host size, then + storage per storage
    size (storage needs the host tier, so no host sizes means no storage rows)."""
    out: list[TierSizes] = []
    for d in devices:
        out.append(TierSizes(d, 0, 0, page_size))
        for h in hosts:
            out.append(TierSizes(d, h, 0, page_size))
            out += [TierSizes(d, h, s, page_size) for s in stores]
    return out


def check_sizes(sizes: Sequence[TierSizes], longest_prompt: int) -> None:
    """ValueError, before anything runs, for a tier under one page or a device pool
    that cannot hold the trace's longest prompt."""
    for s in sizes:
        for tier in ("device", "host", "storage"):
            asked = getattr(s, tier)
            if asked and s.tokens(tier) < s.page_size:
                raise ValueError(
                    f"{tier} size {asked:,} tokens is under one page of {s.page_size} tokens"
                )
        if s.tokens("device") < longest_prompt:
            raise ValueError(
                f"--device-tokens {s.device:,}: the device pool must hold the trace's longest "
                f"prompt ({longest_prompt:,} tokens, as an engine's would)"
            )


def build_setup(config: CacheConfig, sizes: TierSizes, store_dir: Path) -> TraceSetup:
    """``config`` with its pools sized by ``sizes`` (see the module docstring)."""
    device = replace(
        config.device, page_size=sizes.page_size, num_tokens=sizes.tokens("device"), size_gb=0.0
    )
    base = replace(config, model=REPLAY_MODEL, device=device)
    if not sizes.host:
        return TraceSetup(
            sizes, replace(base, host=replace(base.host, enabled=False), storage=StorageConfig())
        )
    # The pool takes int(device × ratio) rounded down to pages: half a token above keeps
    # float rounding from losing a page.
    ratio = (sizes.tokens("host") + 0.5) / sizes.tokens("device")
    host_base = config.host if config.host.enabled else HostConfig()
    host = replace(host_base, enabled=True, ratio=ratio, size_gb=0.0)
    if not sizes.storage:
        return TraceSetup(sizes, replace(base, host=host, storage=StorageConfig()))
    return TraceSetup(
        sizes, replace(base, host=host, storage=sized_store(config, sizes, store_dir))
    )


def check_store(storage: StorageConfig) -> None:
    """ValueError for a network store, whose capacity its server sets."""
    if storage.backend in (*NETWORK_BACKENDS, "remote"):
        raise ValueError(
            f"--storage-tokens: the config's store is {storage.backend!r}, whose capacity its "
            f"server sets; a trace replay sizes the storage tier itself: use a local store "
            f"(--set storage.backend=disk, lmdb, file or memory), and --disk-gbps for the "
            f"server's bandwidth"
        )


def sized_store(config: CacheConfig, sizes: TierSizes, store_dir: Path) -> StorageConfig:
    """The config's store (a fresh directory for a path store) holding exactly
    ``sizes.tokens("storage")`` tokens of pages. ValueError for a network store,
    whose capacity its server sets."""
    storage = storage_setup(config, store_dir)
    check_store(storage)
    page_bytes = sizes.page_size * replay_bytes_per_token()
    pages = sizes.tokens("storage") // sizes.page_size
    max_bytes = pages * (HEADER_BYTES + page_bytes)
    # LMDB keeps a value over ~2 KiB in whole 4 KiB overflow pages: the replay's records
    # take twice what max_bytes counts, and its default map (max_bytes + a quarter) would
    # fill before the LRU starts evicting.
    map_size = 3 * max_bytes + (64 << 20) if storage.backend == "lmdb" else 0
    # Durability costs the replay time and changes no figure: the store is scratch.
    return replace(storage, max_bytes=max_bytes, map_size=map_size, sync="none")
