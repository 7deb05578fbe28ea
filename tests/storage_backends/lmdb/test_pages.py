"""lmdb.pages: a churned healthy store is sound; a wrong page number or a used free page is not."""

from __future__ import annotations

import hashlib
import mmap
import random
import struct
from pathlib import Path

import lmdb

from storage_backends import StorageConfig, create
from storage_backends.lmdb.pages import walk_pages


def _churned_store(root: Path) -> bytes:
    config = StorageConfig(backend="lmdb", path=str(root), max_bytes=8 << 20, sync=False)
    rng = random.Random(0)
    for round_ in range(3):  # reopened between rounds, as a daemon restarting
        store = create("lmdb", config)
        keys = [hashlib.sha256(f"{round_}-{i}".encode()).digest() for i in range(300)]
        sizes = [rng.choice([100, 1500, 5000]) for _ in keys]
        assert all(store.put(keys, [memoryview(b"x" * size) for size in sizes]))
        store.delete(keys[::3])
        store.close()
    return (root / "data.mdb").read_bytes()


def test_healthy_store_is_sound_and_damage_is_named(tmp_path: Path) -> None:
    data = _churned_store(tmp_path / "store")
    walk = walk_pages(data)
    assert walk.damage is None and walk.free
    wrong_number = bytearray(data)
    psize = mmap.PAGESIZE  # LMDB pages are OS pages
    struct.pack_into("<Q", wrong_number, walk.main_root * psize, walk.main_root + 1)
    assert "says it is page" in str(walk_pages(bytes(wrong_number)).damage)
    in_use = bytearray(data)
    struct.pack_into("<Q", in_use, walk.free[0].offset, walk.main_root)
    assert "both free and in use" in str(walk_pages(bytes(in_use)).damage)
    assert "truncated" in str(walk_pages(data[: len(data) // 2]).damage)


def test_damage_on_the_deepest_level_of_a_deep_tree_is_found(tmp_path: Path) -> None:
    env = lmdb.open(str(tmp_path), map_size=64 << 20, max_dbs=2)
    db = env.open_db(b"pages")
    with env.begin(write=True) as txn:
        for i in range(30_000):  # several levels: the root, branches, leaves
            txn.put(hashlib.sha256(b"%d" % i).digest(), b"%08d" % i, db=db)
    depth = env.stat()["depth"]
    with env.begin() as txn:
        depth = max(depth, txn.stat(db)["depth"])
    env.close()
    assert depth >= 3
    data = (tmp_path / "data.mdb").read_bytes()
    walk = walk_pages(data)
    assert walk.damage is None
    psize, free = mmap.PAGESIZE, {entry.pgno for entry in walk.free}
    leaves = [
        pgno
        for pgno in range(2, len(data) // psize)
        if pgno not in free
        and struct.unpack_from("<QHH", data, pgno * psize)[::2] == (pgno, 0x02)  # a leaf
    ]
    assert len(leaves) > 100
    for pgno in leaves[:: len(leaves) // 5]:
        broken = bytearray(data)
        struct.pack_into("<H", broken, pgno * psize + 14, psize + 2)  # upper bound past the page
        assert "has bounds" in str(walk_pages(bytes(broken)).damage)
