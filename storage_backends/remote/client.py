"""RemoteBackend: the StorageBackend of a shared cache daemon (``hicache serve``) over ZeroMQ.

Every call is bounded: a daemon that is down, slow or restarting turns lookups
into misses and puts into failures after at most ``storage.timeout_s``. The
first request left unanswered (or a socket error) opens the breaker, as do
``storage.breaker_failures`` BUSY/INTERNAL replies in a row; while it is open
calls fail fast until a probe gets through again (``storage_backends.breaker``): every
``storage.breaker_cooldown_s`` one caller first sends a PING, and its answer
closes the breaker, so hits come back within one cool-down of the daemon.

The link (channels, breaker, counters) is ``link.DaemonLink``; this module turns
batches of pages into requests, through frames or a shared-memory lease, and
replies into verified hits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Sequence
from typing import NamedTuple

import zmq

from storage_backends.base import StorageStats
from storage_backends.batch import check_batch, check_keys
from storage_backends.breaker import BreakerState
from storage_backends.config import StorageConfig
from storage_backends.counters import StatCounters
from storage_backends.errors import StorageClosedError, StorageOpenError
from storage_backends.page_format import HEADER_BYTES, Verdict
from storage_backends.record_arena import RecordArena
from storage_backends.remote.channel import Channel, CurveKeys
from storage_backends.remote.link import DaemonLink, RemoteLinkStats
from storage_backends.remote.protocol import (
    ContainsReply,
    DeleteReply,
    ErrorCode,
    ErrorReply,
    ExistsReply,
    GetReply,
    Op,
    PingReply,
    PutReply,
    Reply,
    Request,
    ShmAttachReply,
    StatsReply,
)
from storage_backends.remote.put_frames import PutFramer
from storage_backends.remote.shm_lease import ClientLease
from storage_backends.scatter import (
    Runs,
    check_gather,
    check_scatter,
    copy_verified_runs,
    total,
)

logger = logging.getLogger(__name__)

# One request carries at most this many keys / page bytes (a page over the cap travels
# alone); a bigger batch is split into requests that are all in flight at once, so
# the daemon answers one while the client verifies and copies the previous one.
REQUEST_KEYS = 1024
REQUEST_BYTES = 1 << 20
# The put area a shared-memory lease asks for (the daemon grants up to a quarter of its
# slab): the records of a put go through it in rounds of this many bytes.
SHM_PUT_BYTES = 64 << 20


# The daemon's STATS names for entries, bytes_used, capacity_bytes and the pages it found
# damaged (the whole store, as the daemon reports it).
DAEMON_SIZE_STATS = (
    "hicache_daemon_store_pages",
    "hicache_daemon_store_used_bytes",
    "hicache_daemon_store_capacity_bytes",
    "hicache_daemon_corrupt_pages_total",
)


class _Size(NamedTuple):
    entries: int
    bytes_used: int
    capacity_bytes: int
    corrupt: int  # pages the daemon found damaged (never sent, so not counted here)


class _Chunk(NamedTuple):
    start: int
    stop: int


class _Answers:
    """What one exchange through a shared-memory lease learnt about the lease: replies
    seen (an unanswered GET may hold slots; an unanswered PUT, its put area), whether
    the daemon no longer knew it, or a free could not be sent."""

    def __init__(self, lease: ClientLease | None) -> None:
        self.lease = lease
        self.started = time.monotonic()
        self.seen = 0
        self.lost = False  # NO_LEASE, or slots that could not be freed
        self.refused = False  # BAD_OP to SHM_ATTACH: the daemon has no shared memory

    def note(self, position: int, reply: Reply) -> None:
        self.seen += 1
        if isinstance(reply, ErrorReply):
            self.lost |= reply.code is ErrorCode.NO_LEASE
            self.refused |= reply.code is ErrorCode.BAD_OP


def load_curve_keys(config: StorageConfig) -> CurveKeys | None:
    """The CURVE keys named by ``config`` (None: CURVE off); StorageOpenError if unreadable."""
    if not config.curve_client_key:
        return None
    from storage_backends.remote.keys import load_key_pair, load_public_key

    try:
        pair = load_key_pair(config.curve_client_key)
        server = load_public_key(config.curve_server_key)
    except ValueError as e:
        raise StorageOpenError(f"cannot load CURVE keys: {e}") from None
    return CurveKeys(pair.public, pair.secret, server)


def chunks(sizes: Sequence[int]) -> list[_Chunk]:
    """Split a batch of pages of ``sizes`` bytes into requests within the per-request caps."""
    out: list[_Chunk] = []
    start = nbytes = 0
    for i, size in enumerate(sizes):
        if i > start and (i - start >= REQUEST_KEYS or nbytes + size > REQUEST_BYTES):
            out.append(_Chunk(start, i))
            start, nbytes = i, 0
        nbytes += size
    if start < len(sizes):
        out.append(_Chunk(start, len(sizes)))
    return out


class RemoteBackend:
    """Pages kept by a cache daemon; see the module doc for failure handling.

    Thread-safety: each calling thread gets its own DEALER socket (zmq sockets
    are not thread-safe); the breaker and counters are shared and locked.
    ``stats()`` asks the daemon for its size (bounded like every call; the last
    known size when it does not answer). ``put`` reports a key the daemon
    already held as stored and counts it in ``puts``.
    """

    def __init__(self, config: StorageConfig) -> None:
        if config.backend != "remote":
            raise ValueError(f"RemoteBackend needs storage.backend = 'remote', got {config}")
        self._config = config
        self._link = DaemonLink(config, load_curve_keys(config))
        self._local = threading.local()  # each thread's record arena
        self._counters = StatCounters()
        self._size = _Size(0, 0, 0, 0)  # as the daemon last reported it
        self._shm_off = not config.shm  # also once the daemon turned shared memory down

    # --- StorageBackend ---------------------------------------------------------------

    def exists(self, keys: Sequence[bytes]) -> int:
        self._check_open()
        check_keys(keys)
        parts = chunks([0] * len(keys))
        requests = [Request(Op.EXISTS, 0, tuple(keys[c.start : c.stop])) for c in parts]
        count = 0
        for part, reply in zip(
            parts, self._link.call(Op.EXISTS, requests, ExistsReply), strict=True
        ):
            if reply is None:
                break
            count += min(reply.count, part.stop - part.start)
            if reply.count < part.stop - part.start:
                break
        return count

    def contains(self, keys: Sequence[bytes]) -> list[bool]:
        self._check_open()
        check_keys(keys)
        parts = chunks([0] * len(keys))
        requests = [Request(Op.CONTAINS, 0, tuple(keys[c.start : c.stop])) for c in parts]
        present = [False] * len(keys)
        for part, reply in zip(
            parts, self._link.call(Op.CONTAINS, requests, ContainsReply), strict=True
        ):
            if reply is not None and len(reply.present) == part.stop - part.start:
                present[part.start : part.stop] = reply.present
        return present

    def get(self, keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        self._check_open()
        return self._get_runs(keys, [[view] for view in check_batch(keys, dst, writable=True)])

    def get_scatter(self, keys: Sequence[bytes], dst: list[Sequence[memoryview]]) -> list[bool]:
        self._check_open()
        return self._get_runs(keys, check_scatter(keys, dst))

    def _get_runs(self, keys: Sequence[bytes], views: list[Runs]) -> list[bool]:
        """Verified pages from the daemon into their runs (``get`` and ``get_scatter``)."""
        parts = chunks([total(runs) for runs in views])
        lease = self._lease()
        lease_id = lease.id if lease is not None else 0
        requests = [
            Request(Op.GET, 0, tuple(keys[c.start : c.stop]), lease=lease_id) for c in parts
        ]
        hits = [False] * len(keys)
        corrupt: list[bytes] = []
        answers = _Answers(lease)

        def fill(position: int, reply: Reply) -> None:
            # As each reply arrives: its pages are copied out while later ones travel.
            answers.note(position, reply)
            if isinstance(reply, GetReply) and reply.spans and lease is not None:
                answers.lost |= not self._fill_lent(parts[position], reply, keys, views, hits)
            elif isinstance(reply, GetReply):
                corrupt.extend(self._fill(parts[position], reply, keys, views, hits))

        self._link.call(Op.GET, requests, GetReply, fill)
        self._settle(answers, len(requests))
        self._counters.record_get(sum(hits), len(keys) - sum(hits), len(corrupt))
        if corrupt:
            logger.warning("%d damaged pages from the daemon; deleting them", len(corrupt))
            self._remove(corrupt)
        return hits

    def _fill(
        self,
        part: _Chunk,
        reply: GetReply,
        keys: Sequence[bytes],
        views: list[Runs],
        hits: list[bool],
    ) -> list[bytes]:
        """Verify and copy one reply's pages; return the keys of damaged ones."""
        if len(reply.found) != part.stop - part.start:
            self._link.count("bad_replies")
            return []
        corrupt: list[bytes] = []
        records = iter(reply.pages)
        for i, found in zip(range(part.start, part.stop), reply.found, strict=True):
            if not found:
                continue
            verdict = copy_verified_runs(memoryview(next(records)), keys[i], views[i])
            hits[i] = verdict is Verdict.OK
            if verdict.corrupt:
                corrupt.append(keys[i])
        return corrupt

    def _fill_lent(
        self,
        part: _Chunk,
        reply: GetReply,
        keys: Sequence[bytes],
        views: list[Runs],
        hits: list[bool],
    ) -> bool:
        """Copy one reply's records out of the slots lent to this thread's lease (a record
        that fails its check there is a miss: the daemon checked it, so the slot was
        reused, not the page damaged), then free the slots; False if the free could not
        be sent."""
        channel = self._link.channel()
        lease = channel.lease
        if lease is None or len(reply.found) != part.stop - part.start:
            self._link.count("bad_replies")
        else:
            spans = iter(reply.spans)
            for i, found in zip(range(part.start, part.stop), reply.found, strict=True):
                if found:
                    hits[i] = lease.read(next(spans), keys[i], views[i])
        lease_id = lease.id if lease is not None else 0
        free = Request(Op.SHM_FREE, 0, lease=lease_id, spans=reply.spans)
        return lease_id != 0 and channel.post(free, self._config.timeout_s)

    def _lease(self) -> ClientLease | None:
        """This thread's lease on the daemon's slab, attached (or renewed) when it may have
        expired; None: pages go as frames (``storage.shm`` off, the daemon has no shared
        memory or did not answer)."""
        if self._shm_off or self._link.breaker_state is not BreakerState.CLOSED:
            return None  # (an open breaker: the call itself fails fast or probes)
        channel = self._link.channel()
        lease, now = channel.lease, time.monotonic()
        if lease is not None and lease.fresh(now):
            return lease
        answers = _Answers(None)
        ask = Request(Op.SHM_ATTACH, 0, lease=lease.id if lease else 0, put_bytes=SHM_PUT_BYTES)
        (grant,) = self._link.call(Op.SHM_ATTACH, [ask], ShmAttachReply, answers.note)
        channel.lease = None
        if grant is None:
            if answers.refused:
                self._shm_off = True
                logger.warning("the daemon has no shared memory (server.shm_bytes): frames")
        elif lease is not None and grant.lease == lease.id:
            lease.renewed(now)
            channel.lease = lease
        else:
            channel.lease = self._map(grant, now)
        return channel.lease

    def _map(self, grant: ShmAttachReply, now: float) -> ClientLease | None:
        try:
            return ClientLease(grant, now)
        except (OSError, ValueError) as e:  # not the daemon's host, or its slab is gone
            logger.warning("cannot map the daemon's shared memory (%s): pages go as frames", e)
            self._shm_off = True
            self._detach(self._link.channel(), grant.lease)
            return None

    @staticmethod
    def _detach(channel: Channel, lease: int) -> None:
        """Give ``lease`` up (unanswered; if it cannot be sent, the daemon reclaims the lease
        once it has been silent for its expiry)."""
        with contextlib.suppress(zmq.ZMQError):
            channel.post(Request(Op.SHM_DETACH, 0, lease=lease), 0.1)

    def _settle(self, answers: _Answers, sent: int) -> None:
        """After an exchange through a lease: renewed if every request was answered,
        else given up (the daemon reclaims what the lost replies held)."""
        lease = answers.lease
        if lease is None:
            return
        if answers.seen == sent and not answers.lost:
            lease.renewed(answers.started)
            return
        channel = self._link.channel()
        channel.lease = None
        self._detach(channel, lease.id)

    def put(self, keys: Sequence[bytes], src: list[memoryview]) -> list[bool]:
        self._check_open()
        views = check_batch(keys, src, writable=False)
        return self._put_runs(keys, [[view] for view in views])

    def put_gather(self, keys: Sequence[bytes], src: list[Sequence[memoryview]]) -> list[bool]:
        self._check_open()
        return self._put_runs(keys, check_gather(keys, src))

    def _put_runs(self, keys: Sequence[bytes], pages: list[Runs]) -> list[bool]:
        """Pages (each its runs, concatenated) to the daemon as records built straight from
        the runs, never gathered into a page first (``put`` and ``put_gather``)."""
        sizes = [total(runs) for runs in pages]
        fits = [i for i, size in enumerate(sizes) if size <= self._config.max_page_bytes]
        parts = [fits[c.start : c.stop] for c in chunks([sizes[i] for i in fits])]
        results = [False] * len(keys)
        for group in self._put_rounds(parts, sizes):
            self._put_round(group, keys, pages, results)
        self._counters.record_put(sum(results), len(keys) - sum(results), 0)
        return results

    def _put_rounds(self, parts: list[list[int]], sizes: list[int]) -> list[list[list[int]]]:
        """A put's requests (page indices each) in rounds, each sent once the last was
        answered: one round over frames; through a lease, as many as reuse its put area."""
        lease = self._lease()
        room = lease.area_bytes if lease is not None else 0
        rounds: list[list[list[int]]] = [[]]
        used = 0
        for part in parts:
            size = sum(HEADER_BYTES + sizes[i] for i in part)
            if room and rounds[-1] and used + size > room:
                rounds.append([])
                used = 0
            rounds[-1].append(part)
            used += size
        return rounds

    def _put_round(
        self,
        parts: list[list[int]],
        keys: Sequence[bytes],
        pages: list[Runs],
        results: list[bool],
    ) -> None:
        """One round of PUT requests: through the lease's put area where the records fit,
        else as frames from the arena; ``results`` filled from the replies."""
        lease = self._lease()
        if lease is not None:
            lease.start()
        lent = [
            lease.encode_runs([keys[i] for i in part], [pages[i] for i in part])
            if lease is not None
            else ()
            for part in parts
        ]
        arena = self._arena()
        framed = [part for part, spans in zip(parts, lent, strict=True) if not spans]
        arena.start(sum(HEADER_BYTES + total(pages[i]) for part in framed for i in part))
        requests = [  # a request sent as frames gets its records as it is sent (PutFramer)
            Request(
                Op.PUT,
                0,
                tuple(keys[i] for i in part),
                lease=lease.id if spans and lease is not None else 0,
                spans=spans,
            )
            for part, spans in zip(parts, lent, strict=True)
        ]
        answers = _Answers(lease)
        framer = PutFramer(arena, requests, parts, keys, pages, answers.note)
        replies = self._send_records(arena, requests, framer)
        self._settle(answers, len(requests))
        for part, reply in zip(parts, replies, strict=True):
            if reply is not None and len(reply.stored) == len(part):
                for i, stored in zip(part, reply.stored, strict=True):
                    results[i] = stored
            elif reply is not None:
                self._link.count("bad_replies")

    def delete(self, keys: Sequence[bytes]) -> int:
        self._check_open()
        check_keys(keys)
        deleted = self._remove(keys)
        self._counters.record_deletes(deleted)
        return deleted

    def _remove(self, keys: Sequence[bytes]) -> int:
        """DELETE ``keys`` at the daemon; return how many it held."""
        parts = chunks([0] * len(keys))
        requests = [Request(Op.DELETE, 0, tuple(keys[c.start : c.stop])) for c in parts]
        deleted = 0
        for part, reply in zip(
            parts, self._link.call(Op.DELETE, requests, DeleteReply), strict=True
        ):
            if reply is not None and reply.deleted:
                deleted += reply.deleted
                # Which keys were present is not reported: announce them all (a removal
                # announced for an absent page is harmless, a missed one is stale).
                self._counters.note_removed(keys[part.start : part.stop])
        return deleted

    def take_removed(self) -> list[bytes]:
        return self._counters.take_removed()

    def stats(self) -> StorageStats:
        self._check_open()
        (reply,) = self._link.call(Op.STATS, [Request(Op.STATS, 0)], StatsReply)
        if reply is not None:
            self._size = _Size(*(int(reply.stats.get(name, 0)) for name in DAEMON_SIZE_STATS))
        failed = self.failed_calls()
        size = self._size
        snap = self._counters.snapshot(size.entries, size.bytes_used, size.capacity_bytes)
        # A request the daemon did not answer (or refused) was a miss or a failed
        # put for the caller: count it where every backend counts such calls. A page
        # the daemon found damaged was a miss too, counted by the daemon only.
        return dataclasses.replace(
            snap, errors=snap.errors + failed, corrupt=snap.corrupt + size.corrupt
        )

    def link_stats(self) -> RemoteLinkStats:
        """Counters of the connection to the daemon (thread-safe, no I/O)."""
        return self._link.stats()

    def failed_calls(self) -> int:
        """Requests that got no usable answer: timed out, refused by the open breaker,
        answered with an error or a broken reply (``FailedCalls``; no I/O)."""
        link = self.link_stats()
        return link.timeouts + link.fast_fails + link.error_replies + link.bad_replies

    def ping(self) -> str | None:
        """The daemon's version string, or None if it did not answer in time."""
        self._check_open()
        (reply,) = self._link.call(Op.PING, [Request(Op.PING, 0)], PingReply)
        return reply.server if reply is not None else None

    def close(self) -> None:
        self._link.close(self._give_lease_back)

    def _check_open(self) -> None:
        if self._link.closed:
            raise StorageClosedError("RemoteBackend is closed")

    def _give_lease_back(self, channel: Channel) -> None:
        if channel.lease is not None:  # its slots come back now, not on expiry
            self._detach(channel, channel.lease.id)

    # --- a put's record arena ---------------------------------------------------------

    def _arena(self) -> RecordArena:
        arena: RecordArena | None = getattr(self._local, "arena", None)
        if arena is None:
            arena = self._local.arena = RecordArena()
        return arena

    def _send_records(
        self, arena: RecordArena, requests: list[Request], framer: PutFramer
    ) -> list[PutReply | None]:
        """The PUT exchange; the arena is dropped unless every request was answered (see
        ``record_arena``: only then has ZeroMQ surely finished sending from it)."""
        try:
            replies = self._link.call(Op.PUT, requests, PutReply, framer.on_reply, framer.prepare)
        except BaseException:
            arena.discard()
            raise
        if any(reply is None for reply in replies):
            arena.discard()
        return replies
