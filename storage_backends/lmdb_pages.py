"""A structural check of ``data.mdb`` read as plain bytes: what a write transaction would touch.

A read-only LMDB traversal never looks at the free list nor at a page's own
page number, yet a write does: ``mdb_page_touch`` aborts the process
(``Assertion 'mp->mp_pgno != pgno'``) when the free list hands out a page that
is still in a tree. So before the store is mapped, the child of
``storage_backends.lmdb_check`` walks the file itself (LMDB 0.9 on-disk format,
64-bit): the newer meta page, every branch, leaf and overflow page of every
tree, and the free list. Damage is a page outside the file, a page whose header
names another page number or the wrong kind, a page reached twice, node offsets
outside their page, and a free page that is also in use (or listed twice).

Layout (``mdb.c``): a page header is ``pgno u64, pad u16, flags u16,
lower u16, upper u16`` (an overflow page keeps its page count in place of
lower/upper), then ``u16`` node offsets; a node is ``lo u16, hi u16, flags u16,
ksize u16``, the key, then the data. Pure functions of the bytes given.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterator
from typing import NamedTuple

_MAGIC = 0xBEEFC0DE
_HDR = 16
_P_BRANCH, _P_LEAF, _P_OVERFLOW = 0x01, 0x02, 0x04
_F_BIGDATA, _F_SUBDATA = 0x01, 0x02
_P_INVALID = (1 << 64) - 1
_NODE = struct.Struct("<HHHH")  # lo, hi, flags, key size
_DB = struct.Struct("<IHHQQQQQ")  # MDB_db: pad (page size in a meta), flags, depth, ..., root
_META_DBS = 40  # offset of mm_dbs[FREE], mm_dbs[MAIN] in a meta page
_META_LAST = _META_DBS + 2 * _DB.size  # mm_last_pg, then mm_txnid
_MAX_DEPTH = 64


class FreeEntry(NamedTuple):
    """One page number in the free list and where in the file it is written."""

    pgno: int
    offset: int


class PageWalk(NamedTuple):
    """``damage`` is None for a sound file; ``main_root`` is the main tree's root page."""

    damage: str | None
    main_root: int
    free: tuple[FreeEntry, ...]


class _Damage(Exception):
    pass


class _Node(NamedTuple):
    flags: int
    data_at: int  # file offset of the node's data (after its key)
    size: int  # data size (leaf) or child page (branch)


class _Walker:
    def __init__(self, buf: bytes | memoryview, psize: int, last_pg: int) -> None:
        self._buf = buf
        self._psize = psize
        self._last = last_pg
        self._used: set[int] = set()

    def _page(self, pgno: int, kinds: int) -> int:
        """File offset of page ``pgno`` after checking its number, kind and first visit."""
        if not 2 <= pgno <= self._last:
            raise _Damage(f"page {pgno} is outside pages 2..{self._last}")
        if pgno in self._used:
            raise _Damage(f"page {pgno} is reached twice")
        self._used.add(pgno)
        at = pgno * self._psize
        own, _, flags = struct.unpack_from("<QHH", self._buf, at)
        if own != pgno:
            raise _Damage(f"page {pgno} says it is page {own}")
        if not flags & kinds:
            raise _Damage(f"page {pgno} has flags {flags:#x}, expected {kinds:#x}")
        return at

    def _nodes(self, at: int, leaf: bool) -> list[_Node]:
        lower, upper = struct.unpack_from("<HH", self._buf, at + 12)
        if not (_HDR <= lower <= upper <= self._psize and lower % 2 == 0):
            raise _Damage(f"page at {at} has bounds {lower}..{upper}")
        count = (lower - _HDR) // 2
        nodes = []
        for offset in struct.unpack_from(f"<{count}H", self._buf, at + _HDR):
            if not upper <= offset <= self._psize - 8:
                raise _Damage(f"a node of the page at {at} starts outside it")
            lo, hi, flags, ksize = _NODE.unpack_from(self._buf, at + offset)
            data_at = at + offset + 8 + ksize
            if leaf:
                size = lo | hi << 16
                end = data_at + (8 if flags & _F_BIGDATA else size)
            else:
                size, end = lo | hi << 16 | flags << 32, data_at
            if end > at + self._psize:
                raise _Damage(f"a node of the page at {at} runs past the page")
            nodes.append(_Node(flags, data_at, size))
        return nodes

    def tree(self, root: int, depth: int = 0) -> Iterator[_Node]:
        """Every leaf node of the tree at ``root`` (pages checked on the way)."""
        if root == _P_INVALID:
            return
        if depth > _MAX_DEPTH:
            raise _Damage("a tree is deeper than any LMDB tree")
        at = self._page(root, _P_BRANCH | _P_LEAF)
        (flags,) = struct.unpack_from("<H", self._buf, at + 10)
        if not flags & _P_BRANCH:
            yield from self._nodes(at, leaf=True)
            return
        for node in self._nodes(at, leaf=False):
            yield from self.tree(node.size, depth + 1)

    def data(self, node: _Node) -> memoryview:
        """A leaf node's data, following an overflow run (checked and marked used); its
        bounds within its page were checked with the page."""
        if not node.flags & _F_BIGDATA:
            return memoryview(self._buf)[node.data_at : node.data_at + node.size]
        (first,) = struct.unpack_from("<Q", self._buf, node.data_at)
        at = self._page(first, _P_OVERFLOW)
        (count,) = struct.unpack_from("<I", self._buf, at + 12)
        if count < 1 or first + count - 1 > self._last or count * self._psize < node.size:
            raise _Damage(f"overflow run at page {first} of {count} pages does not fit")
        self._used.update(range(first + 1, first + count))
        return memoryview(self._buf)[at + _HDR : at + _HDR + node.size]

    def free_list(self, root: int) -> list[FreeEntry]:
        free: list[FreeEntry] = []
        for node in self.tree(root):
            ids = self.data(node)
            base = node.data_at if not node.flags & _F_BIGDATA else None
            if len(ids) < 8 or len(ids) % 8:
                raise _Damage("a free-list record is not a list of page numbers")
            (count,) = struct.unpack_from("<Q", ids, 0)
            if (count + 1) * 8 > len(ids):
                raise _Damage(f"a free-list record claims {count} pages")
            first = base if base is not None else self._overflow_at(node)
            for i in range(1, count + 1):
                (pgno,) = struct.unpack_from("<Q", ids, 8 * i)
                free.append(FreeEntry(pgno, first + 8 * i))
        return free

    def _overflow_at(self, node: _Node) -> int:
        (first,) = struct.unpack_from("<Q", self._buf, node.data_at)
        return int(first) * self._psize + _HDR

    def check_free(self, free: list[FreeEntry]) -> None:
        seen: set[int] = set()
        for entry in free:
            if not 2 <= entry.pgno <= self._last:
                raise _Damage(f"free page {entry.pgno} is outside pages 2..{self._last}")
            if entry.pgno in self._used:
                raise _Damage(f"page {entry.pgno} is both free and in use")
            if entry.pgno in seen:
                raise _Damage(f"page {entry.pgno} is listed free twice")
            seen.add(entry.pgno)


def _meta(buf: bytes | memoryview, psize: int) -> tuple[int, int, int, int]:
    """(page size, free root, main root, last page) of the newer valid meta page."""
    best: tuple[int, int, int, int, int] | None = None
    for at in (0, psize):
        if len(buf) < at + _META_LAST + 16:
            continue
        magic, version = struct.unpack_from("<II", buf, at + _HDR)
        if magic != _MAGIC or version != 1:
            continue
        free_db = _DB.unpack_from(buf, at + _META_DBS)
        main_db = _DB.unpack_from(buf, at + _META_DBS + _DB.size)
        last, txnid = struct.unpack_from("<QQ", buf, at + _META_LAST)
        if best is None or txnid > best[0]:
            best = (txnid, free_db[0], free_db[-1], main_db[-1], last)
    if best is None:
        raise _Damage("no valid meta page")
    return best[1], best[2], best[3], best[4]


def _page_size(buf: bytes | memoryview) -> int:
    """The page size recorded in meta page 0 (the OS page size if that page is damaged)."""
    if len(buf) >= _META_DBS + 4 and struct.unpack_from("<I", buf, _HDR)[0] == _MAGIC:
        (psize,) = struct.unpack_from("<I", buf, _META_DBS)
        if psize >= 512 and psize & (psize - 1) == 0:
            return int(psize)
    return mmap.PAGESIZE


def walk_pages(buf: bytes | memoryview) -> PageWalk:
    """Check the LMDB file ``buf`` (all of ``data.mdb``; an mmap is fine)."""
    try:
        psize = _page_size(buf)
        stored_psize, free_root, main_root, last = _meta(buf, psize)
        if stored_psize != psize:
            raise _Damage(f"the meta pages disagree on the page size ({stored_psize}, {psize})")
        if len(buf) < (last + 1) * psize:
            raise _Damage(f"data.mdb is truncated: {len(buf)} bytes, pages up to {last}")
        walker = _Walker(buf, psize, last)
        for node in walker.tree(main_root):
            if node.flags & _F_SUBDATA:  # a named database: its MDB_db record
                record = walker.data(node)
                if len(record) != _DB.size:
                    raise _Damage(f"a database record at {node.data_at} has {len(record)} bytes")
                for sub in walker.tree(_DB.unpack_from(record)[-1]):
                    if sub.flags & _F_BIGDATA:
                        walker.data(sub)
            elif node.flags & _F_BIGDATA:
                walker.data(node)
        free = walker.free_list(free_root)
        walker.check_free(free)
    except _Damage as exc:
        return PageWalk(str(exc), -1, ())
    except struct.error:
        return PageWalk("a page runs past the end of data.mdb", -1, ())
    return PageWalk(None, main_root, tuple(free))
