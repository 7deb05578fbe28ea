"""An acked DELETE holds while other clients read the same keys; a re-PUT serves new bytes."""

from __future__ import annotations

import threading

from storage_backends.remote.protocol import DeleteReply, Op

from .conftest import ON_EVERY_STORE, Client, daemon_toml, page_key, page_record

ROUNDS = 40
KEYS = [page_key(i, "del-") for i in range(8)]


def _read_forever(endpoint: str, stop: threading.Event, errors: list[str]) -> None:
    client = Client(endpoint)
    try:
        while not stop.is_set():
            if client.call(Op.GET, KEYS) is None:
                errors.append("a reader got no reply")
                return
    finally:
        client.close()


@ON_EVERY_STORE
def test_acked_delete_is_honoured_under_concurrent_reads(
    start_daemon, connect, tmp_path, daemon_backend: str
) -> None:
    # A tiny memory tier: GETs keep reading through from the store while the writer deletes.
    config = daemon_toml(
        tmp_path / "store", memory_bytes=1 << 20, sync=False, backend=daemon_backend
    )
    daemon = start_daemon(config)
    writer = connect(daemon.endpoint)
    daemon.wait_ping(writer)
    stop, errors = threading.Event(), []
    readers = [
        threading.Thread(target=_read_forever, args=(daemon.endpoint, stop, errors))
        for _ in range(2)
    ]
    for reader in readers:
        reader.start()
    served_after_delete = stale_after_reput = 0
    try:
        for round_ in range(ROUNDS):
            old = [page_record(key, 2 * round_, 4096) for key in KEYS]
            new = [page_record(key, 2 * round_ + 1, 4096) for key in KEYS]
            assert writer.put(KEYS, old) == (True,) * len(KEYS)
            deleted = writer.call(Op.DELETE, KEYS)
            assert isinstance(deleted, DeleteReply) and deleted.deleted == len(KEYS), deleted
            served_after_delete += sum(page is not None for page in writer.get(KEYS))
            assert writer.put(KEYS, new) == (True,) * len(KEYS)
            stale_after_reput += sum(
                page != rec for page, rec in zip(writer.get(KEYS), new, strict=True)
            )
            assert writer.call(Op.DELETE, KEYS) is not None
    finally:
        stop.set()
        for reader in readers:
            reader.join()
    assert not errors, errors
    assert served_after_delete == 0, f"{served_after_delete} deleted pages served"
    assert stale_after_reput == 0, f"{stale_after_reput} stale pages served after a re-PUT"
