"""The storage contract on batches larger than one wire request, for every backend.

The remote backend splits a batch into requests of at most ``REQUEST_KEYS`` keys and
``REQUEST_BYTES`` page bytes, all in flight at once, and stitches the replies back
together; every other backend takes the batch whole. Whatever a backend does inside,
the caller sees one answer per key at that key's position:

- a hit brings exactly its own page, a miss leaves its buffer untouched, at every
  position of the batch (both sides of every request boundary), whatever its neighbours;
- ``exists`` counts the leading hits across boundaries, ``delete`` counts every request's;
- a page whose stored PAYLOAD is damaged (first byte, middle, last byte) is a miss,
  counted as corrupt, deleted, and can be stored afresh; the pages beside it are hits.

Backends are taken from the registry: a new one (``disk``) runs here once registered
and given a damage helper below.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from redis.cluster import RedisCluster

from hicache.bench.common.processes import ServerProcess, start_daemon
from storage_backends import StorageBackend, StorageConfig, create
from storage_backends.builtins import BUILTIN_BACKENDS
from storage_backends.redis.backend import key_prefix
from storage_backends.remote import REQUEST_BYTES, REQUEST_KEYS

if TYPE_CHECKING:
    from conftest import Pages

DAEMON_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "daemon.toml"
SIZE = 64 << 10  # REQUEST_BYTES // SIZE pages per request
PER_REQUEST = REQUEST_BYTES // SIZE
BIG = 2 * PER_REQUEST + 3  # three requests: full, full, partial
TINY = 32  # pages small enough that the key count splits the batch
MANY = REQUEST_KEYS + 6
FILL = 0xAB
# Every backend the registry ships that runs without optional services (mooncake has its
# own tests): a new one joins by being registered.
NAMES = tuple(n for n in BUILTIN_BACKENDS if n != "mooncake")
Damage = Callable[[bytes], bytes]


def _boundaries(per_request: int, total: int) -> list[int]:
    """Positions on both sides of every request boundary, and the ends."""
    out = {0, 1, total - 2, total - 1}
    for edge in range(per_request, total, per_request):
        out |= {edge - 1, edge, edge + 1}
    return sorted(p for p in out if 0 <= p < total)


@dataclass
class Store:
    """A backend under test that can be closed, damaged at rest and opened again."""

    name: str
    config: StorageConfig
    backend: StorageBackend
    daemon: ServerProcess | None
    tmp: Path

    def damage_at_rest(self, payloads: dict[bytes, Damage]) -> None:
        """Damage each stored copy of the payloads (keys of ``payloads``) in place, with the
        backend closed (and its daemon stopped); then open it again. Every store keeps a
        page's payload in one piece: a file store in some file under its directory."""
        self.backend.close()
        if self.daemon is not None:
            self.daemon.stop()
        if self.name == "redis":
            hit = _damage_redis(self.config.endpoint, key_prefix(self.config), payloads)
        elif self.name == "memory":
            pytest.skip("the memory backend keeps no bytes beyond the process")
        else:
            root = self.tmp / "daemon-store" if self.daemon is not None else self.config.path
            hit = _damage_files(Path(root), payloads)
        assert hit == len(payloads), "damaged fewer stored pages than asked"
        if self.daemon is not None:
            self.daemon = start_daemon(DAEMON_CONFIG, self.tmp / "daemon-store")
            self.config = _remote(self.daemon)
        self.backend = create(self.name, self.config)


def _remote(daemon: ServerProcess) -> StorageConfig:
    return StorageConfig(backend="remote", endpoint=daemon.endpoint, timeout_s=10.0)


def _damage_files(root: Path, payloads: dict[bytes, Damage]) -> int:
    """Apply ``payloads[p]`` to the stored copy of payload ``p`` wherever it lies in the
    files under ``root``; return how many copies were damaged."""
    hit = 0
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        data = bytearray(file.read_bytes())
        found = 0
        for payload, damage in payloads.items():
            at = data.find(payload)
            while at >= 0:
                data[at : at + SIZE] = damage(bytes(data[at : at + SIZE]))
                found += 1
                at = data.find(payload, at + 1)
        if found:
            file.write_bytes(bytes(data))
            hit += found
    return hit


def _damage_redis(endpoint: str, prefix: bytes, payloads: dict[bytes, Damage]) -> int:
    client = RedisCluster.from_url(endpoint.split(",")[0])
    hit = 0
    try:
        for name in client.scan_iter(match=prefix + b"*", target_nodes=RedisCluster.ALL_NODES):
            value = client.get(name)
            if isinstance(value, bytes) and value[-SIZE:] in payloads:
                client.set(name, payloads[value[-SIZE:]](value))
                hit += 1
    finally:
        client.close()
    return hit


def _flip(offset_from_payload_end: int) -> Damage:
    """Flip one bit of a payload, counted from its end (SIZE: the first byte, 1: the last)."""

    def damage(value: bytes) -> bytes:
        data = bytearray(value)
        data[len(data) - offset_from_payload_end] ^= 0x01
        return bytes(data)

    return damage


@pytest.fixture(params=NAMES)
def store(request: pytest.FixtureRequest, tmp_path: Path, store_config) -> Iterator[Store]:
    name = str(request.param)
    daemon = None
    if name == "remote":
        daemon = start_daemon(DAEMON_CONFIG, tmp_path / "daemon-store")
        config = _remote(daemon)
    else:
        # Durability is not what this suite checks: no fsync per page file.
        config = replace(store_config(name, 256 << 20), sync=False)
    made = Store(name, config, create(name, config), daemon, tmp_path)
    yield made
    made.backend.close()
    if made.daemon is not None:
        made.daemon.stop()


def _get(
    backend: StorageBackend,
    pages: Pages,
    keys: list[bytes],
    size: int,
    damaged: frozenset[int] = frozenset(),
) -> list[bytes]:
    """The bytes each buffer holds after one GET of ``keys`` (untouched: FILL bytes).

    A miss for an absent key must not touch its buffer; a miss at a ``damaged``
    position may leave anything there (StorageBackend.get: never to be used), so
    it reads as FILL bytes here once it is seen to be a miss.
    """
    dst = pages.buffers(len(keys), size, FILL)
    hits = backend.get(keys, dst)
    out = [bytes(d) for d in dst]
    for pos, (hit, data) in enumerate(zip(hits, out, strict=True)):
        if pos in damaged and not hit:
            out[pos] = bytes([FILL]) * size
            continue
        assert hit == (data != bytes([FILL]) * size), "a hit must fill, a miss must not touch"
    return out


def _expect(pages: Pages, ids: list[int], stored: set[int], size: int) -> list[bytes]:
    return [pages.payload(i, size) if i in stored else bytes([FILL]) * size for i in ids]


def test_hits_and_misses_at_every_position_of_a_split_batch(store: Store, pages: Pages) -> None:
    ids = list(range(BIG))
    stored = set(ids[::2])
    assert store.backend.put(pages.keys(sorted(stored)), pages.payloads(sorted(stored), SIZE))
    # Hit, miss, hit, ... then the same keys shifted by one: every position of a batch of
    # three requests is a hit once and a miss once, next to both kinds of neighbour.
    for batch in (ids, ids[1:] + ids[:1]):
        got = _get(store.backend, pages, pages.keys(batch), SIZE)
        assert got == _expect(pages, batch, stored, SIZE)
    present = sorted(stored)
    for p in _boundaries(PER_REQUEST, len(present)):  # one miss among hits, at each boundary
        batch = [*present[:p], 10_000 + p, *present[p:]]
        assert _get(store.backend, pages, pages.keys(batch), SIZE) == _expect(
            pages, batch, stored, SIZE
        )
        assert store.backend.exists(pages.keys(batch)) == p
    assert store.backend.exists(pages.keys(present)) == len(present)


def test_batches_over_the_key_limit_count_across_requests(store: Store, pages: Pages) -> None:
    ids = list(range(MANY))
    assert store.backend.put(pages.keys(ids), pages.payloads(ids, TINY)) == [True] * MANY
    keys = pages.keys(ids)
    for p in _boundaries(REQUEST_KEYS, MANY):  # the first miss on either side of a boundary
        batch = [*keys[:p], pages.key(20_000 + p), *keys[p:]]
        assert store.backend.exists(batch) == p
        got = _get(store.backend, pages, batch, TINY)
        assert got[p] == bytes([FILL]) * TINY
        assert got[:p] + got[p + 1 :] == [pages.payload(i, TINY) for i in ids]
    doomed = [*keys[: REQUEST_KEYS + 3], pages.key(30_000)]
    assert store.backend.delete(doomed) == REQUEST_KEYS + 3
    assert store.backend.exists(keys[REQUEST_KEYS + 3 :]) == MANY - REQUEST_KEYS - 3
    assert store.backend.exists(keys) == 0


def test_damaged_payloads_in_a_split_batch_are_counted_misses(store: Store, pages: Pages) -> None:
    ids = list(range(BIG))
    assert store.backend.put(pages.keys(ids), pages.payloads(ids, SIZE)) == [True] * BIG
    # Damage the payload (its header stays intact) at the first byte, the middle and the
    # last byte, on pages on both sides of the first request boundary and at the ends.
    damaged = {0: _flip(SIZE), PER_REQUEST - 1: _flip(1), PER_REQUEST: _flip(SIZE // 2)}
    damaged[BIG - 1] = _flip(1)
    store.damage_at_rest({pages.payload(i, SIZE): d for i, d in damaged.items()})
    intact = set(ids) - set(damaged)
    got = _get(store.backend, pages, pages.keys(ids), SIZE, frozenset(damaged))
    assert got == _expect(pages, ids, intact, SIZE)
    if store.name != "remote":  # the daemon counts what its own store found damaged
        assert store.backend.stats().corrupt == len(damaged)
    for i in damaged:  # deleted, so it can be stored again
        assert store.backend.exists(pages.keys([i])) == 0
    assert store.backend.put(pages.keys(list(damaged)), pages.payloads(list(damaged), SIZE))
    assert _get(store.backend, pages, pages.keys(ids), SIZE) == _expect(pages, ids, set(ids), SIZE)
