"""The disk backend's read path: a batch's index lookup, the record reads and checks,
dropping pages found damaged and queueing recency touches.

A get looks the batch up in one read transaction, reads each record with ``preadv``
straight into the caller's buffers and checks the header's key and the xxh3
checksum; a mismatch (a slot reused by another process meanwhile, a torn or damaged
record) is a miss, and the key is dropped once a second read confirms the damage.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import lmdb

from storage_backends.batch import byte_view, check_batch, check_keys
from storage_backends.disk.dest import Dest
from storage_backends.disk.index import IndexWriter
from storage_backends.disk.layout import LOCATION_STRUCT, Location
from storage_backends.disk.parts import DiskParts
from storage_backends.disk.read_plan import GAP_MAX, IOV_MAX, ReadPlan, ReadRun, plan_reads
from storage_backends.disk.records import check_read, check_run, checksums
from storage_backends.page_format import HEADER_BYTES, Verdict, header_for, runs_checksum
from storage_backends.recency import FLUSH_AT
from storage_backends.trusted_records import check_record_buffers

logger = logging.getLogger(__name__)


# A batch smaller than this per I/O thread is read on the calling thread (a pool hop
# costs tens of microseconds: more than reading a few small pages).
SPLIT_BYTES = 1 << 20
# A run reads at most about this many bytes: its pages are checked right after the
# read, while they are still in cache (measured, CPU over raw preadv: 64 KiB pages
# 0.55-0.67x with 1 MiB runs, 0.44-0.59x with 256 KiB, 0.38-0.50x with 128 KiB; 16
# pages of 1 MiB in one run 0.54-0.66x, one a run 0.64-0.75x).
RUN_BYTES = 1 << 20
# A hit moves its page to the young end of the LRU order unless the page is among the
# newest 1/YOUNG_SHARE of the store already: fewer than ``entries / YOUNG_SHARE``
# stamps were handed out since its own (by puts and touches). Each touch rewrites the
# page's index entries (about 6 us of CPU, more than reading a 64 KiB page); pages read
# soon after they were stored, or read again and again, cost none. The order among
# the young pages is left as it is; they are far from eviction, and a read once they
# have aged touches them.
YOUNG_SHARE = 4
_GAP = memoryview(bytearray(GAP_MAX))  # where the gaps between records are read to


class DiskReads:
    """``get`` and ``get_scatter`` of one DiskBackend (which checks it is open first).

    Thread-safe: reads share nothing but the index (LMDB read transactions), the
    segment files (positional reads) and the thread-safe counters and touch queue;
    index writes (dropping damaged pages, flushing touches) take ``write_lock``.
    Mutates the caller's buffers (a damaged page's may be partly written), the
    counters, the touch queue and, for damage, the index. Raises ValueError for
    malformed arguments before any read.
    """

    def __init__(self, ctx: DiskParts) -> None:
        self._ctx = ctx

    def get(self, keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        views = check_batch(keys, dst, writable=True)
        return self._read(keys, Dest.flat(views), list(map(len, views)))

    def get_records(self, keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        """Read each key's whole record (header + payload) into ``dst[i]``, whose length
        must be the record's (``HEADER_BYTES`` + the stored payload length, else a miss).
        Checked as ``get`` checks; a hit's header is the stored one (the store's key)."""
        views = check_record_buffers(keys, dst)
        payloads = [view[HEADER_BYTES:] for view in views]
        heads = [view[:HEADER_BYTES] for view in views]
        return self._read(keys, Dest.flat(payloads), list(map(len, payloads)), heads)

    def get_scatter(self, keys: Sequence[bytes], dst: list[Sequence[memoryview]]) -> list[bool]:
        """Read each key's payload into the runs ``dst[i]``, in order (their lengths must
        add up to the stored payload length, else a miss). As ``get`` otherwise."""
        if len(keys) != len(dst):
            raise ValueError(f"got {len(keys)} keys but {len(dst)} destinations")
        check_keys(keys)
        runs = [[byte_view(run, writable=True) for run in runs] for runs in dst]
        return self._read(keys, Dest.scatter(runs), [sum(map(len, page)) for page in runs])

    def _read(
        self,
        keys: Sequence[bytes],
        dest: Dest,
        lengths: list[int],
        heads: list[memoryview] | None = None,
    ) -> list[bool]:
        """The batch's hits; ``heads``: where each hit's header is copied (None: nowhere)."""
        if len(keys) < 2:
            if not keys:
                return []
            head = heads[0] if heads is not None else None
            return [self._read_page(keys[0], dest.pages()[0], lengths[0], head)]
        ctx = self._ctx
        located = ctx.index.raw_locations(keys)
        threads, total = ctx.pool.threads, sum(lengths)
        parts = 1 if threads == 1 else max(1, min(threads, total // SPLIT_BYTES))
        per_run = RUN_BYTES * len(keys) // total if total else len(keys)  # by mean page size
        max_run = min(IOV_MAX // (dest.width + 2), -(-len(keys) // parts), per_run)
        young_from = located.newest_stamp + 1 - located.entries // YOUNG_SHARE
        plan = plan_reads(located.values, lengths, max(1, max_run), young_from)
        outcomes = ctx.pool.map(
            lambda run: self._read_run(run, keys, dest, heads), plan.runs, parts
        )
        hits, damaged = self._tally(keys, located.values, plan, outcomes)
        corrupt = self._drop_damaged(damaged) if damaged else 0
        n_hits = hits.count(True)
        ctx.counters.record_get(n_hits, len(keys) - n_hits, corrupt)
        if plan.aging:
            self._touch([keys[pos] for pos in plan.aging if hits[pos]])
        return hits

    def _read_page(
        self, key: bytes, runs: list[memoryview], length: int, head: memoryview | None
    ) -> bool:
        """``_read`` of a batch of one page, with the same outcomes (hit, miss, damage,
        touch) in fewer steps: no plan, no run, no pool (they were about a third of a
        one-page get's CPU)."""
        ctx = self._ctx
        located = ctx.index.raw_locations((key,))
        raw, ok, corrupt = located.values[0], False, 0
        if raw is not None and len(raw) != LOCATION_STRUCT.size:
            corrupt = self._drop_damaged([(key, None)])
        elif raw is not None:
            segment, offset, _stride, _align, payload_len, stamp = LOCATION_STRUCT.unpack(raw)
            if payload_len == length:
                ok = self._read_record(key, segment, offset, runs, head)
                if not ok:
                    corrupt = self._drop_damaged([(key, Location.unpack(raw))])
                elif stamp < located.newest_stamp + 1 - located.entries // YOUNG_SHARE:
                    self._touch([key])
        ctx.counters.record_get(int(ok), int(not ok), corrupt)
        return ok

    def _read_record(
        self,
        key: bytes,
        segment: int,
        offset: int,
        runs: list[memoryview],
        head: memoryview | None = None,
    ) -> bool:
        """Whether the record at ``offset`` was read whole into ``runs`` and is intact
        (its header then copied to ``head``, when given)."""
        header = bytearray(HEADER_BYTES)
        try:
            got = self._ctx.segments.read(segment, offset, [header, *runs])
        except OSError as exc:
            self._ctx.log.failure("disk store read failed; reported as a damaged page", exc)
            return False
        length = got - HEADER_BYTES
        if length != sum(map(len, runs)):
            return False  # the file ends inside the record
        intact = header == header_for(key, length, runs_checksum(runs))
        if intact and head is not None:
            head[:] = header
        return intact

    @staticmethod
    def _tally(
        keys: Sequence[bytes], raws: list[bytes | None], plan: ReadPlan, outcomes: list[list[bool]]
    ) -> tuple[list[bool], list[tuple[bytes, Location | None]]]:
        """Each position's hit, and the pages found damaged (with where they were read)."""
        hits = [False] * len(keys)
        damaged: list[tuple[bytes, Location | None]] = [(keys[p], None) for p in plan.damaged]
        for run, intact in zip(plan.runs, outcomes, strict=True):
            if run.uniform:
                hits[run.positions[0] : run.positions[-1] + 1] = intact
            else:
                for pos, ok in zip(run.positions, intact, strict=True):
                    hits[pos] = ok
            if False in intact:
                for pos, ok in zip(run.positions, intact, strict=True):
                    if not ok:
                        damaged.append((keys[pos], Location.unpack(raws[pos] or b"")))
        return hits, damaged

    def _read_run(
        self, run: ReadRun, keys: Sequence[bytes], dest: Dest, to: list[memoryview] | None
    ) -> list[bool]:
        """Read a run's records with one ``preadv``; whether each is intact (an intact
        record's header copied to ``to``, when given)."""
        m = len(run.positions)
        if m == 1:  # large pages: a run each
            pos = run.positions[0]
            head = to[pos] if to is not None else None
            return [self._read_record(keys[pos], run.segment, run.offset, dest.page(pos), head)]
        headers, heads = _scratch(m)
        columns: list[list[memoryview]] | None = None
        pages: list[list[memoryview]] = []
        if run.uniform and dest.columns:  # laid out by slicing
            start = run.positions[0]
            columns = dest.span(start, start + m)
            iov = _interleave(heads[:m], columns, run.gaps[0] if run.gaps else 0)
            run_keys = keys[start : start + m]
        else:
            every = dest.pages()
            pages = [every[pos] for pos in run.positions]
            iov = _chain(heads, pages, run.gaps)
            run_keys = [keys[pos] for pos in run.positions]
        want = HEADER_BYTES * m + sum(run.payload_lens) + sum(run.gaps)
        try:
            got = self._ctx.segments.read(run.segment, run.offset, iov)
        except OSError as exc:
            self._ctx.log.failure("disk store read failed; reported as a damaged page", exc)
            return [False] * m
        if got != want:  # the file ends inside the run: each record on its own
            return self._read_each(run, keys, dest, to)
        sums = checksums(columns) if columns is not None else list(map(runs_checksum, pages))
        intact = check_run(headers, run_keys, run.payload_lens, sums)
        if to is not None:
            for k, (pos, ok) in enumerate(zip(run.positions, intact, strict=True)):
                if ok:
                    to[pos][:] = heads[k]
        return intact

    def _read_each(
        self, run: ReadRun, keys: Sequence[bytes], dest: Dest, to: list[memoryview] | None
    ) -> list[bool]:
        """A run's records read and checked one by one."""
        out: list[bool] = []
        offset, pages = run.offset, dest.pages()
        for k, pos in enumerate(run.positions):
            head = to[pos] if to is not None else None
            verdict = self._read_one(keys[pos], run.segment, offset, pages[pos], head)
            out.append(verdict is Verdict.OK)
            offset += HEADER_BYTES + run.payload_lens[k] + (run.gaps[k] if k < len(run.gaps) else 0)
        return out

    def _read_one(
        self,
        key: bytes,
        segment: int,
        offset: int,
        runs: Sequence[memoryview],
        head: memoryview | None = None,
    ) -> Verdict:
        header = bytearray(HEADER_BYTES)
        try:
            got = self._ctx.segments.read(segment, offset, [header, *runs])
        except OSError as exc:
            self._ctx.log.failure("disk store read failed; reported as a damaged page", exc)
            return Verdict.TRUNCATED
        verdict = check_read(header, key, got, runs)
        if verdict is Verdict.OK and head is not None:
            head[:] = header
        return verdict

    def _drop_damaged(self, damaged: list[tuple[bytes, Location | None]]) -> int:
        """Delete pages found damaged whose entry still points where they were read and
        whose record fails a second read (a slot reused meanwhile is not damage)."""
        ctx = self._ctx
        try:
            with ctx.write_lock, ctx.index.writing() as writer:
                dropped = sum(self._drop_one(writer, key, loc) for key, loc in damaged)
        except lmdb.Error:
            logger.exception("could not delete %d damaged pages", len(damaged))
            return 0
        ctx.counters.note_removed(writer.removed)
        if dropped:
            logger.warning("deleted %d damaged pages from %s", dropped, ctx.root)
        return dropped

    def _drop_one(self, writer: IndexWriter, key: bytes, seen: Location | None) -> bool:
        current = writer.location(key)
        if seen is not None:
            if current is None or current._replace(stamp=0) != seen._replace(stamp=0):
                return False
            scratch = memoryview(bytearray(seen.payload_len))
            if self._read_one(key, seen.segment, seen.offset, [scratch]) is Verdict.OK:
                return False
        return writer.remove(key)

    def _touch(self, keys: list[bytes]) -> None:
        """Queue recency updates; flush them now only if many are pending and no write runs."""
        if not keys:
            return
        ctx = self._ctx
        if ctx.touches.add(keys) >= FLUSH_AT and ctx.write_lock.acquire(blocking=False):
            try:
                with ctx.index.writing() as writer:
                    writer.touch_many(ctx.touches.take())
            except lmdb.Error:
                logger.exception("dropped recency updates")
            finally:
                ctx.write_lock.release()


_local = threading.local()  # each thread's header buffers (a run's headers are read there)


def _scratch(members: int) -> tuple[bytearray, list[memoryview]]:
    """This thread's header buffer and views of its ``HEADER_BYTES`` parts, at least
    ``members`` of them (kept: a run's header views cost a slice each to make)."""
    kept: tuple[bytearray, list[memoryview]] | None = getattr(_local, "headers", None)
    if kept is not None and len(kept[1]) >= members:
        return kept
    count = max(members, 64)
    headers = bytearray(HEADER_BYTES * count)
    whole = memoryview(headers)
    heads = [whole[k * HEADER_BYTES : (k + 1) * HEADER_BYTES] for k in range(count)]
    _local.headers = (headers, heads)
    return headers, heads


def _interleave(
    heads: list[memoryview], columns: list[list[memoryview]], gap: int
) -> list[memoryview]:
    """The iovec of a uniform run: per member its header, its runs (``columns[j][k]``)
    and, but after the last, ``gap`` bytes of skipped file; built by slice assignment."""
    members = len(heads)
    step = len(columns) + 1 + (1 if gap else 0)
    iov = [_GAP] * (step * members)
    iov[0::step] = heads
    for j, column in enumerate(columns, 1):
        iov[j::step] = column
    if gap:
        iov[step - 1 :: step] = [_GAP[:gap]] * members
        iov.pop()
    return iov


def _chain(
    heads: list[memoryview], pages: list[list[memoryview]], gaps: list[int]
) -> list[memoryview]:
    """The iovec of any run: member k's header, its runs, then ``gaps[k]`` skipped bytes."""
    iov: list[memoryview] = []
    for k, runs in enumerate(pages):
        iov.append(heads[k])
        iov += runs
        if k < len(gaps) and gaps[k]:
            iov.append(_GAP[: gaps[k]])
    return iov
