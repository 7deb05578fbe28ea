"""RemoteBackend.put_gather against a real daemon, over frames and over its shared memory
(``storage.shm``): records built straight from each page's runs (no staging page), read
back bit-exact; a bad batch is refused before anything is sent."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from hicache.bench.common.processes import ServerProcess, start_daemon
from storage_backends import StorageConfig, create
from storage_backends.base import GatherPut
from storage_backends.guard import GuardedBackend
from storage_backends.remote.client import REQUEST_BYTES, RemoteBackend
from storage_backends.scatter import put_gather

DAEMON_CONFIG = Path(__file__).resolve().parents[3] / "configs" / "daemon.toml"
PAGE = 8192
# Each page's runs: K and V halves, one run, uneven runs, a page's layers.
SPLITS = ([PAGE // 2] * 2, [PAGE], [1, 2, 3, PAGE - 6], [PAGE // 16] * 16)


def key(i: int) -> bytes:
    return hashlib.sha256(f"gather-{i}".encode()).digest()


def payload(i: int, size: int = PAGE) -> bytes:
    seed = hashlib.sha256(f"payload-{i}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def runs_of(data: bytes, splits: Sequence[int]) -> list[memoryview]:
    out, offset = [], 0
    for n in splits:
        out.append(memoryview(bytearray(data[offset : offset + n])))
        offset += n
    return out


def read_back(backend: RemoteBackend, ids: list[int], size: int = PAGE) -> list[bytes | None]:
    dst = [memoryview(bytearray(size)) for _ in ids]
    hits = backend.get([key(i) for i in ids], dst)
    return [bytes(d) if hit else None for d, hit in zip(dst, hits, strict=True)]


def remote(endpoint: str, max_page_bytes: int = 64 << 20) -> RemoteBackend:
    config = StorageConfig(
        backend="remote",
        endpoint=endpoint,
        max_page_bytes=max_page_bytes,
        shm=endpoint.startswith("ipc://"),
    )
    client = create("remote", config)
    assert isinstance(client, RemoteBackend)
    return client


@pytest.fixture(params=["frames", "shm"])
def daemon(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    """A daemon on tcp (pages as frames) or on ipc with a shared-memory slab (the client
    writes its records into its lease's put area)."""
    endpoint, extra = "tcp://127.0.0.1:0", []
    if request.param == "shm":
        endpoint = f"ipc://{tmp_path / 'd.sock'}"
        extra = ["--set", f"server.endpoint={endpoint}", "--set", f"server.shm_bytes={64 << 20}"]
    server = start_daemon(
        DAEMON_CONFIG, tmp_path / "store", endpoint, tmp_path / "daemon.log", extra=extra
    )
    yield server
    server.stop()


@pytest.fixture
def backend(daemon: ServerProcess) -> Iterator[RemoteBackend]:
    client = remote(daemon.endpoint)
    yield client
    client.close()


def test_multi_run_pages_over_several_requests_read_back_bit_exact(
    backend: RemoteBackend,
) -> None:
    assert isinstance(backend, GatherPut)
    ids = list(range(4 * (REQUEST_BYTES // PAGE)))  # 4 MiB: several requests in flight
    src = [runs_of(payload(i), SPLITS[i % len(SPLITS)]) for i in ids]
    assert backend.put_gather([key(i) for i in ids], src) == [True] * len(ids)
    assert read_back(backend, ids) == [payload(i) for i in ids]
    # Through the guard and the module function too (the engine adapters' path).
    more = [1000 + i for i in range(len(SPLITS))]
    src = [runs_of(payload(i), s) for i, s in zip(more, SPLITS, strict=True)]
    guarded = GuardedBackend(backend)
    assert put_gather(guarded, [key(i) for i in more], src) == [True] * len(more)  # type: ignore[arg-type]
    assert read_back(backend, more) == [payload(i) for i in more]
    assert backend.stats().puts == len(ids) + len(more)


def test_a_page_over_the_cap_fails_alone(daemon: ServerProcess, backend: RemoteBackend) -> None:
    src = [runs_of(payload(0), [PAGE]), runs_of(payload(1, 3 * PAGE), [PAGE] * 3)]
    small_cap = remote(daemon.endpoint, max_page_bytes=2 * PAGE)
    try:
        assert small_cap.put_gather([key(0), key(1)], src) == [True, False]
    finally:
        small_cap.close()
    assert read_back(backend, [0]) == [payload(0)]
    assert backend.contains([key(1)]) == [False]


@pytest.mark.parametrize("case", ["lengths", "no runs", "bad key", "strided run"])
def test_bad_batches_are_refused_before_anything_is_sent(backend: RemoteBackend, case: str) -> None:
    good = runs_of(payload(0), [100, PAGE - 100])
    keys, src = {
        "lengths": ([key(0), key(1)], [good]),
        "no runs": ([key(0), key(1)], [good, []]),
        "bad key": ([key(0), b"short"], [good, good]),
        "strided run": ([key(0), key(1)], [good, [memoryview(bytearray(2 * PAGE))[::2]]]),
    }[case]
    sent = backend.link_stats().requests
    with pytest.raises(ValueError):
        backend.put_gather(keys, src)  # type: ignore[arg-type]
    assert backend.link_stats().requests == sent
    assert backend.contains([key(0), key(1)]) == [False, False]
