"""A structural check of ``data.mdb`` read as plain bytes: what a write transaction would touch.

A read-only LMDB traversal never looks at the free list nor at a page's own
page number, yet a write does: ``mdb_page_touch`` aborts the process
(``Assertion 'mp->mp_pgno != pgno'``) when the free list hands out a page that
is still in a tree. So before the store is mapped, the child of
``storage_backends.lmdb.check`` walks the file itself (LMDB 0.9 on-disk format,
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

import numpy as np

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


# Pages whose nodes are checked in one vectorised step: bounds the arrays (a few MB).
_CHUNK_PAGES = 4096


class _Level(NamedTuple):
    """The nodes of some pages, one entry a node (numpy arrays of the same length)."""

    flags: np.ndarray
    data_at: np.ndarray
    size: np.ndarray


class _Walker:
    """Walks trees a level at a time, each level's pages and nodes checked with numpy
    (a store of millions of pages has millions of nodes)."""

    def __init__(self, buf: bytes | memoryview, psize: int, last_pg: int) -> None:
        self._buf = buf
        self._bytes = np.frombuffer(buf, dtype=np.uint8)
        self._psize = psize
        self._last = last_pg
        self._used = np.zeros(last_pg + 1, dtype=bool)

    def _u16(self, at: np.ndarray) -> np.ndarray:
        b = self._bytes
        return b[at].astype(np.int64) | b[at + 1].astype(np.int64) << 8

    def _mark(self, pgnos: np.ndarray) -> None:
        """Check that each page is inside the file and reached once; mark them used."""
        outside = (pgnos < 2) | (pgnos > self._last)
        if outside.any():
            pgno = int(pgnos[outside.argmax()])
            raise _Damage(f"page {pgno} is outside pages 2..{self._last}")
        unique, counts = np.unique(pgnos, return_counts=True)
        twice = self._used[unique] | (counts > 1)
        if twice.any():
            raise _Damage(f"page {int(unique[twice.argmax()])} is reached twice")
        self._used[pgnos] = True

    def _pages(self, pgnos: np.ndarray, kinds: int) -> np.ndarray:
        """File offsets of pages ``pgnos`` after checking numbers, kinds and first visits."""
        self._mark(pgnos)
        at = pgnos * self._psize
        own = np.zeros(len(at), dtype=np.int64)
        for i in range(8):
            own |= self._bytes[at + i].astype(np.int64) << (8 * i)
        wrong = own != pgnos
        if wrong.any():
            i = int(wrong.argmax())
            raise _Damage(f"page {int(pgnos[i])} says it is page {int(own[i]) & (2**64 - 1)}")
        flags = self._u16(at + 10)
        bad = (flags & kinds) == 0
        if bad.any():
            i = int(bad.argmax())
            raise _Damage(f"page {int(pgnos[i])} has flags {int(flags[i]):#x}, expected {kinds:#x}")
        return at

    def _page(self, pgno: int, kinds: int) -> int:
        """``_pages`` for one page (an overflow run's first), without numpy's per-call cost."""
        if not 2 <= pgno <= self._last:
            raise _Damage(f"page {pgno} is outside pages 2..{self._last}")
        if self._used[pgno]:
            raise _Damage(f"page {pgno} is reached twice")
        self._used[pgno] = True
        at = pgno * self._psize
        own, _, flags = struct.unpack_from("<QHH", self._buf, at)
        if own != pgno:
            raise _Damage(f"page {pgno} says it is page {own}")
        if not flags & kinds:
            raise _Damage(f"page {pgno} has flags {flags:#x}, expected {kinds:#x}")
        return at

    def _nodes(self, at: np.ndarray, leaf: np.ndarray) -> _Level:
        """Every node of the pages at ``at`` (``leaf``: per page), bounds checked."""
        lower, upper = self._u16(at + 12), self._u16(at + 14)
        bad = (lower < _HDR) | (lower > upper) | (upper > self._psize) | (lower % 2 == 1)
        if bad.any():
            i = int(bad.argmax())
            raise _Damage(f"page at {int(at[i])} has bounds {int(lower[i])}..{int(upper[i])}")
        counts = (lower - _HDR) // 2
        first = np.repeat(np.cumsum(counts) - counts, counts)
        page_at = np.repeat(at, counts)
        slot = np.arange(int(counts.sum()), dtype=np.int64) - first
        offset = self._u16(page_at + _HDR + 2 * slot)
        top = np.repeat(upper, counts)
        outside = (offset < top) | (offset > self._psize - 8)
        if outside.any():
            raise _Damage(
                f"a node of the page at {int(page_at[outside.argmax()])} starts outside it"
            )
        node = page_at + offset
        lo, hi, flags, ksize = (self._u16(node + 2 * k) for k in range(4))
        data_at = node + 8 + ksize
        is_leaf = np.repeat(leaf, counts)
        size = np.where(is_leaf, lo | hi << 16, lo | hi << 16 | flags << 32)
        end = np.where(is_leaf, data_at + np.where(flags & _F_BIGDATA, 8, size), data_at)
        past = end > page_at + self._psize
        if past.any():
            raise _Damage(f"a node of the page at {int(page_at[past.argmax()])} runs past the page")
        return _Level(np.where(is_leaf, flags, -1), data_at, size)

    def tree(self, root: int, wanted: int | None = None) -> Iterator[_Node]:
        """The leaf nodes of the tree at ``root`` (pages checked on the way): all of them,
        or only those whose flags share a bit with ``wanted``."""
        if root == _P_INVALID:
            return
        level = np.array([root], dtype=np.int64)
        for _depth in range(_MAX_DEPTH + 1):
            children = []
            for start in range(0, len(level), _CHUNK_PAGES):
                pgnos = level[start : start + _CHUNK_PAGES]
                at = self._pages(pgnos, _P_BRANCH | _P_LEAF)
                nodes = self._nodes(at, (self._u16(at + 10) & _P_BRANCH) == 0)
                branch = nodes.flags < 0
                children.append(nodes.size[branch])
                keep = ~branch if wanted is None else (nodes.flags & wanted) != 0
                keep &= ~branch
                kept = zip(nodes.flags[keep], nodes.data_at[keep], nodes.size[keep], strict=True)
                for f, d, z in kept:
                    yield _Node(int(f), int(d), int(z))
            level = np.concatenate(children) if children else level[:0]
            if not len(level):
                return
        raise _Damage("a tree is deeper than any LMDB tree")

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
        self._used[first + 1 : first + count] = True
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
            if self._used[entry.pgno]:
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
        for node in walker.tree(main_root, _F_SUBDATA | _F_BIGDATA):
            if node.flags & _F_SUBDATA:  # a named database: its MDB_db record
                record = walker.data(node)
                if len(record) != _DB.size:
                    raise _Damage(f"a database record at {node.data_at} has {len(record)} bytes")
                for sub in walker.tree(_DB.unpack_from(record)[-1], _F_BIGDATA):
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
