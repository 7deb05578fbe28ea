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


def _big_values(root: Path) -> bytes:
    env = lmdb.open(str(root), map_size=64 << 20, max_dbs=2)
    db = env.open_db(b"pages")
    with env.begin(write=True) as txn:
        for i in range(40):
            txn.put(b"%04d" % i, bytes([i]) * (20_000 + 100 * i), db=db)
    env.close()
    return (root / "data.mdb").read_bytes()


def _leaf_node_data(data: bytes, pgno: int) -> int:
    """File offset of the data of the first node of leaf page ``pgno``."""
    return _nodes(data, pgno)[0][1]


def _nodes(data: bytes, pgno: int) -> list[tuple[int, int]]:
    """(flags, file offset of its data) of each node of leaf page ``pgno``."""
    at = pgno * mmap.PAGESIZE
    lower = struct.unpack_from("<H", data, at + 12)[0]
    out = []
    for slot in range(16, lower, 2):
        node = at + struct.unpack_from("<H", data, at + slot)[0]
        _lo, _hi, flags, ksize = struct.unpack_from("<HHHH", data, node)
        out.append((flags, node + 8 + ksize))
    return out


def _big_nodes(data: bytes) -> list[int]:
    """The data offsets of every leaf node that points at an overflow run."""
    psize = mmap.PAGESIZE
    leaves = [
        p
        for p in range(2, len(data) // psize)
        if struct.unpack_from("<QHH", data, p * psize)[::2] == (p, 0x02)
    ]
    return [at for p in leaves for flags, at in _nodes(data, p) if flags & 0x01]


def test_a_large_value_is_placed_from_its_node_and_checked_against_the_file(
    tmp_path: Path,
) -> None:
    """A value's pages are found from its leaf node (first page, size) without reading
    them: one that would run past the file, or into another value, is damage."""
    data = _big_values(tmp_path / "store")
    walk = walk_pages(data)
    assert walk.damage is None and walk.overflow_runs == 40 and walk.runs is not None
    big = _big_nodes(data)
    assert len(big) == 40
    last = len(data) // mmap.PAGESIZE - 1
    past = bytearray(data)
    struct.pack_into("<Q", past, big[0], last)  # its run would end past the file's last page
    assert "is outside pages" in str(walk_pages(bytes(past)).damage)
    twice = bytearray(data)
    (own,) = struct.unpack_from("<Q", data, big[0])
    others = [int(f) for f in walk.runs[0] if int(f) != own]
    struct.pack_into("<Q", twice, big[0], others[0] + 1)  # inside another value's run
    assert "reached twice" in str(walk_pages(bytes(twice)).damage)


def test_a_database_record_must_count_what_its_tree_holds(tmp_path: Path) -> None:
    data = _big_values(tmp_path / "store")
    walk = walk_pages(data)
    assert walk.damage is None
    at = _leaf_node_data(data, walk.main_root)  # the main tree's first record: "pages"
    (entries,) = struct.unpack_from("<Q", data, at + 32)  # MDB_db: ..., md_entries, md_root
    assert entries == 40
    wrong = bytearray(data)
    struct.pack_into("<Q", wrong, at + 32, entries - 1)
    assert "counts (depth, branch, leaf, overflow pages, entries)" in str(
        walk_pages(bytes(wrong)).damage
    )
