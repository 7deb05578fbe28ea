"""The store directory deleted under a running daemon: noticed at the next commit, logged, and
every PUT acknowledged after that survives a restart."""

from __future__ import annotations

import shutil

from .conftest import ON_EVERY_STORE


@ON_EVERY_STORE
def test_writes_after_the_store_was_deleted_survive_a_restart(
    start_daemon, connect, pages, tmp_path
) -> None:
    daemon = start_daemon()
    client = connect(daemon.endpoint)
    daemon.wait_ping(client)
    keys, records = pages(16, size=4096)
    assert client.put(keys[:8], records[:8]) == (True,) * 8
    shutil.rmtree(tmp_path / "store")
    assert client.put(keys[8:], records[8:]) == (True,) * 8  # acknowledged: must be on disk
    assert daemon.terminate() == 0
    assert daemon.wait_log("deleted or replaced")

    daemon = start_daemon()
    client = connect(daemon.endpoint)
    daemon.wait_ping(client)
    assert client.get(keys[8:]) == records[8:]
