"""A store whose damage only a write meets (the free list hands out a page still in use): the
daemon quarantines it at start instead of dying by SIGABRT in its first write transaction."""

from __future__ import annotations

import struct
from pathlib import Path

from hicache.daemon.protocol import Op
from storage_backends.lmdb_pages import walk_pages


def _free_a_page_in_use(data_mdb: Path) -> None:
    """Rewrite every free-list entry to name the main tree's root page."""
    buf = bytearray(data_mdb.read_bytes())
    walk = walk_pages(bytes(buf))
    assert walk.damage is None and walk.free, "the store needs a free list to damage"
    for entry in walk.free:
        struct.pack_into("<Q", buf, entry.offset, walk.main_root)
    data_mdb.write_bytes(bytes(buf))
    assert walk_pages(bytes(buf)).damage is not None


def test_damage_a_write_would_meet_is_quarantined(start_daemon, connect, pages, tmp_path) -> None:
    daemon = start_daemon()
    client = connect(daemon.endpoint)
    daemon.wait_ping(client)
    keys, records = pages(40, size=3000)
    assert client.put(keys, records) == (True,) * 40
    assert client.call(Op.DELETE, keys[20:]) is not None  # pages go to the free list
    assert daemon.terminate() == 0
    _free_a_page_in_use(tmp_path / "store" / "data.mdb")

    daemon = start_daemon()
    client = connect(daemon.endpoint)
    daemon.wait_ping(client)
    assert client.put(keys[:4], records[:4]) == (True,) * 4
    assert client.get(keys[:8]) == records[:4] + [None] * 4  # the damaged store was set aside
    assert "damaged" in daemon.log()
    assert list(tmp_path.glob("store.damaged-*"))
