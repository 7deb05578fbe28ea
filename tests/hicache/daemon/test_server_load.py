"""16 concurrent clients × mixed operations: no acknowledged page is lost or mixed up."""

from __future__ import annotations

import random
import threading
from pathlib import Path

from storage_backends.remote.protocol import ExistsReply, Op

from .conftest import daemon_toml, page_key, page_record

CLIENTS = 16
OPS_PER_CLIENT = 500
OWN_KEYS = 48
SHARED_KEYS = 32


def _record(key: bytes) -> bytes:
    # One record per key, whoever writes it, so a page served under another key shows.
    return page_record(key, 0, size=1024)


class _Worker:
    """One client's random mix of PUT, GET, EXISTS and DELETE, checked as it goes."""

    def __init__(self, client, index: int) -> None:
        self.client = client
        self.rng = random.Random(index)
        self.own = [page_key(j, f"client{index}-") for j in range(OWN_KEYS)]
        self.shared = [page_key(j, "shared-") for j in range(SHARED_KEYS)]
        self.acked: set[bytes] = set()  # stored and not deleted since (by this client)
        self.ops = 0

    def run(self) -> None:
        for _ in range(OPS_PER_CLIENT):
            getattr(self, self.rng.choice(("put", "put", "get", "get", "exists", "delete")))()
            self.ops += 1

    def _sample(self, n: int) -> list[bytes]:
        return self.rng.sample(self.own, n // 2 + 1) + self.rng.sample(self.shared, n // 2)

    def put(self) -> None:
        keys = self._sample(self.rng.randint(1, 8))
        stored = self.client.put(keys, [_record(key) for key in keys])
        assert all(stored)
        self.acked.update(keys)

    def get(self) -> None:
        keys = self._sample(self.rng.randint(1, 16))
        for key, page in zip(keys, self.client.get(keys), strict=True):
            if page is not None:
                assert page == _record(key), "a page came back under the wrong key"
            elif key in self.acked:
                raise AssertionError("an acknowledged page was lost")

    def exists(self) -> None:
        key = self.rng.choice(sorted(self.acked)) if self.acked else self.own[0]
        reply = self.client.call(Op.EXISTS, [key])
        assert isinstance(reply, ExistsReply)
        assert reply.count == (1 if key in self.acked else 0)

    def delete(self) -> None:
        key = self.rng.choice(self.own)
        reply = self.client.call(Op.DELETE, [key])
        assert reply is not None and reply.deleted == (1 if key in self.acked else 0)
        self.acked.discard(key)


def test_concurrent_clients_lose_and_mix_nothing(start_daemon, connect, tmp_path: Path) -> None:
    daemon = start_daemon(daemon_toml(tmp_path / "store", memory_bytes=256 << 10, sync=False))
    workers = [_Worker(connect(daemon.endpoint), i) for i in range(CLIENTS)]
    daemon.wait_ping(workers[0].client)
    errors: list[BaseException] = []

    def run(worker: _Worker) -> None:
        try:
            worker.run()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=240)
    assert not errors, errors[0]
    assert sum(w.ops for w in workers) == CLIENTS * OPS_PER_CLIENT
    # Every page still acknowledged by its client is there, bit for bit.
    checker = workers[0].client
    for worker in workers:
        keys = sorted(worker.acked)
        assert checker.get(keys) == [_record(key) for key in keys]
    stats = checker.call(Op.STATS).stats
    assert stats['hicache_daemon_evictions_total{tier="store"}'] == 0  # nothing could vanish
    assert stats['hicache_daemon_lookups_total{result="hit",tier="store"}'] > 0
    assert stats['hicache_daemon_errors_total{code="INTERNAL"}'] == 0
    print(
        f"{stats['hicache_daemon_committed_put_requests_total']:.0f} PUT requests in "
        f"{stats['hicache_daemon_commits_total']:.0f} commits"
    )
