"""A store whose damage only a write meets (the free list hands out a page still in use): the
daemon quarantines it at start instead of dying by SIGABRT in its first write transaction."""

from __future__ import annotations

import json
import mmap
import random
import struct
import subprocess
import sys
from pathlib import Path

from storage_backends.lmdb.pages import walk_pages
from storage_backends.remote.protocol import Op

from .conftest import daemon_toml

REPO = Path(__file__).resolve().parents[3]


def _lmdb_daemon(tmp_path: Path) -> str:  # these damage LMDB's own file layout
    return daemon_toml(tmp_path / "store", backend="lmdb")


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
    daemon = start_daemon(_lmdb_daemon(tmp_path))
    client = connect(daemon.endpoint)
    daemon.wait_ping(client)
    keys, records = pages(40, size=3000)
    assert client.put(keys, records) == (True,) * 40
    assert client.call(Op.DELETE, keys[20:]) is not None  # pages go to the free list
    assert daemon.terminate() == 0
    _free_a_page_in_use(tmp_path / "store" / "data.mdb")

    daemon = start_daemon(_lmdb_daemon(tmp_path))
    client = connect(daemon.endpoint)
    daemon.wait_ping(client)
    assert client.put(keys[:4], records[:4]) == (True,) * 4
    assert client.get(keys[:8]) == records[:4] + [None] * 4  # the damaged store was set aside
    assert daemon.wait_log("damaged")  # the log is copied by a thread
    assert list(tmp_path.glob("store.damaged-*"))


CHILD = """
import json, sys
from hicache.config.daemon import StoreConfig
from hicache.daemon.store import DaemonStore
from tests.hicache.daemon.conftest import page_key, page_record

keys = [page_key(i) for i in range(40)]
records = [page_record(key, i, 3000) for i, key in enumerate(keys)]
for path in sys.argv[1:]:
    config = StoreConfig(backend="lmdb", path=path, max_bytes=1 << 20, memory_bytes=0)
    store = DaemonStore(config, 1 << 20)
    got = store.get(keys, keys, 1 << 30).records
    wrong = sum(r is not None and bytes(r) != records[i] for i, r in enumerate(got))
    more = [page_key(i, "more") for i in range(20)]
    stored = store.put(more, [page_record(k, i, 3000) for i, k in enumerate(more)])
    store.delete(keys[::3])
    back = store.get(more, more, 1 << 30).records
    print(json.dumps(dict(wrong=wrong, stored=sum(stored), back=sum(r is not None for r in back))))
    store.close()
"""


def test_damaged_daemon_stores_take_writes_without_dying(tmp_path: Path) -> None:
    from hicache.config.daemon import StoreConfig
    from hicache.daemon.store import DaemonStore

    from .conftest import page_key, page_record

    pristine = tmp_path / "pristine"
    store = DaemonStore(
        StoreConfig(backend="lmdb", path=str(pristine), max_bytes=1 << 20, memory_bytes=0), 1 << 20
    )
    keys = [page_key(i) for i in range(48)]
    store.put(keys, [page_record(key, i, 3000) for i, key in enumerate(keys)])
    store.delete(keys[40:])  # the free list has entries
    store.close()
    data = (pristine / "data.mdb").read_bytes()
    free = walk_pages(data).free
    rng = random.Random(7)
    paths = []
    for case in range(12):
        buf = bytearray(data)
        for _ in range(rng.choice([1, 2, 4])):
            if case % 2:  # a free-list entry: a page a write would take
                offset = rng.choice(free).offset + rng.randrange(2)
            else:  # a page header: page number, flags, bounds
                offset = rng.randrange(len(buf) // mmap.PAGESIZE) * mmap.PAGESIZE + rng.randrange(
                    16
                )
            buf[offset] ^= 1 << rng.randrange(8)
        (tmp_path / f"case{case}").mkdir()
        (tmp_path / f"case{case}" / "data.mdb").write_bytes(bytes(buf))
        paths.append(str(tmp_path / f"case{case}"))
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *paths], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(results) == len(paths)
    assert all(r["wrong"] == 0 and r["stored"] == r["back"] == 20 for r in results), results


def test_damage_found_while_running_is_quarantined(start_daemon, connect, pages, tmp_path) -> None:
    daemon = start_daemon(_lmdb_daemon(tmp_path))
    client = connect(daemon.endpoint)
    daemon.wait_ping(client)
    keys, records = pages(24, size=3000)
    assert client.put(keys[:16], records[:16]) == (True,) * 16
    data_mdb = tmp_path / "store" / "data.mdb"
    root = walk_pages(data_mdb.read_bytes()).main_root
    with open(data_mdb, "r+b") as f:  # the main tree's root becomes an overflow page
        f.seek(root * mmap.PAGESIZE + 10)
        f.write(struct.pack("<H", 0x04))
    assert client.put(keys[16:], records[16:]) == (True,) * 8  # into a fresh store
    assert client.get(keys[16:]) == records[16:]
    assert daemon.alive() and daemon.wait_log("damaged")  # the log is copied by a thread
    assert list(tmp_path.glob("store.damaged-*"))


def test_disk_index_damage_found_while_running_is_quarantined(
    start_daemon, connect, pages, tmp_path
) -> None:
    """The same on the disk store: its LMDB index damaged under the running daemon."""
    daemon = start_daemon(daemon_toml(tmp_path / "store", backend="disk"))
    client = connect(daemon.endpoint)
    daemon.wait_ping(client)
    keys, records = pages(24, size=3000)
    assert client.put(keys[:16], records[:16]) == (True,) * 16
    index_mdb = tmp_path / "store" / "index" / "data.mdb"
    root = walk_pages(index_mdb.read_bytes()).main_root
    with open(index_mdb, "r+b") as f:  # the main tree's root becomes an overflow page
        f.seek(root * mmap.PAGESIZE + 10)
        f.write(struct.pack("<H", 0x04))
    assert client.put(keys[16:], records[16:]) == (True,) * 8  # into a fresh store
    assert client.get(keys[16:]) == records[16:]
    assert daemon.alive() and daemon.wait_log("damaged")  # the log is copied by a thread
    assert list(tmp_path.glob("store.damaged-*"))
