"""The optional mooncake backend against a real mooncake_master and holder on 127.0.0.1.

Skipped, with the reason, where mooncake does not import (``pip install
'.[mooncake]'`` and Debian's libibverbs1 make it import).
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import socket
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

from storage_backends import StorageBackend, StorageConfig, StorageOpenError, create
from storage_backends.mooncake.client import parse_endpoint
from storage_backends.mooncake.local import LocalMooncake
from tests.hicache.engine.helpers import (
    assert_same,
    chat,
    config,
    engine,
    push_to_storage,
    reference,
    tokens,
)
from tests.polling import wait_until

if TYPE_CHECKING:
    from conftest import MakeBackend, Pages

SIZE = 8192
LEASE_WAIT_S = 10.0  # bound on waiting for the master to expire read leases


def _config(store: LocalMooncake, request: pytest.FixtureRequest) -> StorageConfig:
    # A fingerprint per test keeps the tests' pages apart in the shared store.
    fingerprint = hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:16]
    return StorageConfig(
        backend="mooncake", endpoint=store.endpoint, fingerprint=fingerprint, timeout_s=5.0
    )


@pytest.fixture
def store(
    mooncake: LocalMooncake, request: pytest.FixtureRequest, make_backend: MakeBackend
) -> StorageBackend:
    return make_backend(_config(mooncake, request))


def test_round_trip_exists_put_once_delete(store: StorageBackend, pages: Pages) -> None:
    keys = pages.keys(range(6))
    assert store.put(keys[:4], pages.payloads(range(4), SIZE)) == [True] * 4
    assert store.put(keys[:2] + keys[:1], pages.payloads([7, 8, 9], SIZE)) == [True] * 3
    assert store.exists(keys) == 4
    assert store.contains([keys[5], *keys[:4]]) == [False] + [True] * 4
    dst = pages.buffers(6, SIZE)
    assert store.get(keys, dst) == [True] * 4 + [False] * 2
    assert [bytes(d) for d in dst[:4]] == [pages.payload(i, SIZE) for i in range(4)]
    assert bytes(dst[4]) == b"\xab" * SIZE
    small = pages.buffers(1, SIZE - 1)
    assert store.get(keys[:1], small) == [False] and bytes(small[0]) == b"\xab" * (SIZE - 1)
    stats = store.stats()
    assert (stats.hits, stats.misses, stats.puts, stats.corrupt) == (4, 3, 4, 0)
    # Deleted once the reads' leases expire.
    assert wait_until(lambda: store.delete(keys[:1]) == 1, LEASE_WAIT_S)
    assert store.exists(keys) == 0 and store.take_removed() == keys[:1]


@pytest.fixture
def raw(mooncake: LocalMooncake) -> Iterator[object]:
    from mooncake.store import MooncakeDistributedStore

    client = MooncakeDistributedStore()
    master = parse_endpoint(mooncake.endpoint).master
    assert client.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", master) == 0
    yield client
    client.close()


def test_damaged_value_is_never_loaded(
    mooncake: LocalMooncake,
    request: pytest.FixtureRequest,
    make_backend: MakeBackend,
    pages: Pages,
    raw: object,
) -> None:
    cfg = _config(mooncake, request)
    store = make_backend(cfg)
    keys = pages.keys(range(2))
    assert store.put(keys, pages.payloads(range(2), SIZE)) == [True, True]
    name = f"{cfg.key_prefix}:{cfg.fingerprint}:{keys[1].hex()}"
    good = bytes(raw.get(name))  # type: ignore[attr-defined]
    flipped = good[:-1] + bytes([good[-1] ^ 0x01])
    assert wait_until(lambda: raw.remove(name) == 0, LEASE_WAIT_S)  # type: ignore[attr-defined]
    assert raw.put(name, flipped) == 0  # type: ignore[attr-defined]
    dst = pages.buffers(2, SIZE)
    assert store.get(keys, dst) == [True, False]
    assert bytes(dst[1]) == b"\xab" * SIZE
    assert store.stats().corrupt == 1
    # Removed once the read's lease is over; then the page can be stored afresh.
    again = pages.payloads([1], SIZE)
    assert wait_until(lambda: store.put(keys[1:], again) == [True], LEASE_WAIT_S)
    assert store.get(keys[1:], dst[1:]) == [True] and bytes(dst[1]) == pages.payload(1, SIZE)


def test_killed_holder_is_misses_and_failed_puts(
    own_mooncake: Callable[[], LocalMooncake],
    request: pytest.FixtureRequest,
    make_backend: MakeBackend,
    pages: Pages,
) -> None:
    local = own_mooncake()
    store = make_backend(_config(local, request))
    keys = pages.keys(range(4))
    assert store.put(keys, pages.payloads(range(4), SIZE)) == [True] * 4
    local.kill_holder()
    dst = pages.buffers(4, SIZE)
    assert store.get(keys, dst) == [False] * 4
    assert all(bytes(d) == b"\xab" * SIZE for d in dst)
    assert store.put(pages.keys(range(4, 6)), pages.payloads(range(4, 6), SIZE)) == [False] * 2
    stats = store.stats()
    assert (stats.misses, stats.put_failures) == (4, 2)


def test_unreachable_master_fails_to_open_at_once() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    endpoint = f"mooncake://127.0.0.1:{port}"
    with pytest.raises(StorageOpenError, match="unreachable"):
        create("mooncake", StorageConfig(backend="mooncake", endpoint=endpoint, timeout_s=1.0))


@pytest.mark.parametrize(
    "endpoint",
    ["mooncake://h", "redis://h:1", "mooncake://h:1?x=1", "mooncake://h:1?segment_bytes=a"],
)
def test_malformed_endpoint(endpoint: str) -> None:
    with pytest.raises(ValueError, match=r"storage\.endpoint"):
        parse_endpoint(endpoint)


def test_engine_outputs_through_mooncake_equal_the_reference(mooncake: LocalMooncake) -> None:
    storage = StorageConfig(backend="mooncake", endpoint=mooncake.endpoint, max_bytes=64 << 20)
    cfg = dataclasses.replace(config(16, 1024, host=True), storage=storage)
    rng = random.Random(41)
    turns = [tokens(rng, n) for n in (40, 21, 33, 18)]
    want = chat(reference(), turns)
    eng = engine(cfg)
    got = chat(eng, turns, between=push_to_storage)
    assert_same(got, want)
    assert all(out.hits.storage > 0 for out in got[1:])
    eng.cache.close()
