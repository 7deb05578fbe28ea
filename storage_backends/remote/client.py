"""RemoteBackend: the StorageBackend of a shared cache daemon (``hicache serve``) over ZeroMQ.

Every call is bounded: a daemon that is down, slow or restarting turns lookups
into misses and puts into failures after at most ``storage.timeout_s``. The
first request left unanswered (or a socket error) opens the breaker, as do
``storage.breaker_failures`` BUSY/INTERNAL replies in a row; while it is open
calls fail fast until a probe gets through again (``storage_backends.breaker``): every
``storage.breaker_cooldown_s`` one caller first sends a PING, and its answer
closes the breaker, so hits come back within one cool-down of the daemon.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

import zmq

from storage_backends.base import StorageStats
from storage_backends.batch import check_batch, check_keys
from storage_backends.breaker import Admission, CircuitBreaker
from storage_backends.config import StorageConfig
from storage_backends.counters import StatCounters
from storage_backends.errors import StorageClosedError, StorageOpenError
from storage_backends.page_format import HEADER_BYTES, Verdict
from storage_backends.record_arena import RecordArena
from storage_backends.remote.channel import Channel, CurveKeys, OnReply
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
    StatsReply,
)
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
# Room for a reply header (a GET's found list, a STATS map) beyond a page record.
REPLY_HEADER_BYTES = 1 << 20
# Replies the daemon sends when it, not the request, is the problem.
_PEER_FAILURES = frozenset({ErrorCode.BUSY, ErrorCode.INTERNAL})
_R = TypeVar("_R", bound=Reply)


@dataclass(frozen=True)
class RemoteLinkStats:
    """Counters of the link to the daemon since this backend was created.

    ``timeouts``: requests unanswered within ``timeout_s``; ``fast_fails``:
    calls refused by the open breaker; ``error_replies``: error codes the
    daemon answered with; ``bad_replies``: replies that broke the protocol;
    ``reconnects``: sockets replaced after a timeout or bad reply.
    """

    requests: int
    timeouts: int
    fast_fails: int
    error_replies: int
    bad_replies: int
    reconnects: int
    breaker_opens: int
    breaker_state: str


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
        self._curve = load_curve_keys(config)
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._local = threading.local()
        self._channels: dict[threading.Thread, Channel] = {}
        self._lock = threading.Lock()
        # No growing back-off: a probe is one PING, so probing on every cool-down is cheap.
        self._breaker = CircuitBreaker(
            config.breaker_failures, config.breaker_cooldown_s, config.breaker_cooldown_s
        )
        self._hinted = False  # the first timeout logs what it may mean, once
        self._counters = StatCounters()
        self._link = dict.fromkeys(
            ("requests", "timeouts", "fast_fails", "error_replies", "bad_replies", "reconnects"), 0
        )  # "reconnects": of channels already closed; live ones count their own
        self._size = _Size(0, 0, 0, 0)  # as the daemon last reported it
        self._closed = False

    # --- StorageBackend ---------------------------------------------------------------

    def exists(self, keys: Sequence[bytes]) -> int:
        self._check_open()
        check_keys(keys)
        parts = chunks([0] * len(keys))
        requests = [Request(Op.EXISTS, 0, tuple(keys[c.start : c.stop])) for c in parts]
        count = 0
        for part, reply in zip(parts, self._call(Op.EXISTS, requests, ExistsReply), strict=True):
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
            parts, self._call(Op.CONTAINS, requests, ContainsReply), strict=True
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
        requests = [Request(Op.GET, 0, tuple(keys[c.start : c.stop])) for c in parts]
        hits = [False] * len(keys)
        corrupt: list[bytes] = []

        def fill(position: int, reply: Reply) -> None:
            # As each reply arrives: its pages are copied out while later ones travel.
            if isinstance(reply, GetReply):
                corrupt.extend(self._fill(parts[position], reply, keys, views, hits))

        self._call(Op.GET, requests, GetReply, fill)
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
            self._count("bad_replies")
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

    def put(self, keys: Sequence[bytes], src: list[memoryview]) -> list[bool]:
        self._check_open()
        views = check_batch(keys, src, writable=False)
        return self._put_runs(keys, [[view] for view in views])

    def put_gather(self, keys: Sequence[bytes], src: list[Sequence[memoryview]]) -> list[bool]:
        self._check_open()
        return self._put_runs(keys, check_gather(keys, src))

    def _put_runs(self, keys: Sequence[bytes], runs: list[Runs]) -> list[bool]:
        """Pages (each its runs, concatenated) to the daemon as records built straight
        from the runs into this thread's arena (``put`` and ``put_gather``)."""
        sizes = [total(page) for page in runs]
        fits = [i for i, size in enumerate(sizes) if size <= self._config.max_page_bytes]
        parts = chunks([sizes[i] for i in fits])
        arena = self._arena()
        arena.start(sum(HEADER_BYTES + sizes[i] for i in fits))
        requests = [
            Request(
                Op.PUT,
                0,
                tuple(keys[i] for i in fits[c.start : c.stop]),
                tuple(arena.encode_runs(keys[i], runs[i]) for i in fits[c.start : c.stop]),
            )
            for c in parts
        ]
        replies = self._send_records(arena, requests)
        results = [False] * len(keys)
        for part, reply in zip(parts, replies, strict=True):
            if reply is not None and len(reply.stored) == part.stop - part.start:
                for i, stored in zip(fits[part.start : part.stop], reply.stored, strict=True):
                    results[i] = stored
            elif reply is not None:
                self._count("bad_replies")
        self._counters.record_put(sum(results), len(keys) - sum(results), 0)
        return results

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
        for part, reply in zip(parts, self._call(Op.DELETE, requests, DeleteReply), strict=True):
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
        (reply,) = self._call(Op.STATS, [Request(Op.STATS, 0)], StatsReply)
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
        with self._lock:
            link = dict(self._link)
            link["reconnects"] += sum(c.reconnects for c in self._channels.values())
        return RemoteLinkStats(
            **link,
            breaker_opens=self._breaker.times_opened,
            breaker_state=self._breaker.state.value,
        )

    def failed_calls(self) -> int:
        """Requests that got no usable answer: timed out, refused by the open breaker,
        answered with an error or a broken reply (``FailedCalls``; no I/O)."""
        link = self.link_stats()
        return link.timeouts + link.fast_fails + link.error_replies + link.bad_replies

    def ping(self) -> str | None:
        """The daemon's version string, or None if it did not answer in time."""
        self._check_open()
        (reply,) = self._call(Op.PING, [Request(Op.PING, 0)], PingReply)
        return reply.server if reply is not None else None

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()
        self._ctx.term()

    # --- the link ---------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StorageClosedError("RemoteBackend is closed")

    def _count(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._link[name] += amount

    def _channel(self) -> Channel:
        channel: Channel | None = getattr(self._local, "channel", None)
        if channel is None:
            with self._lock:
                self._check_open()
                self._prune_channels()
                channel = Channel(
                    self._ctx, self._config.endpoint, self._curve, self._max_frame_bytes()
                )
                self._channels[threading.current_thread()] = channel
            self._local.channel = channel
        return channel

    def _arena(self) -> RecordArena:
        arena: RecordArena | None = getattr(self._local, "arena", None)
        if arena is None:
            arena = self._local.arena = RecordArena()
        return arena

    def _send_records(self, arena: RecordArena, requests: list[Request]) -> list[PutReply | None]:
        """The PUT exchange; the arena is dropped unless every request was answered (see
        ``record_arena``: only then has ZeroMQ surely finished sending from it)."""
        try:
            replies = self._call(Op.PUT, requests, PutReply)
        except BaseException:
            arena.discard()
            raise
        if any(reply is None for reply in replies):
            arena.discard()
        return replies

    def _max_frame_bytes(self) -> int:
        """The largest frame a valid reply can carry: one page record, or a header."""
        return self._config.max_page_bytes + HEADER_BYTES + REPLY_HEADER_BYTES

    def _drop_channel(self) -> None:
        channel: Channel | None = getattr(self._local, "channel", None)
        self._local.channel = None
        if channel is None:
            return
        with self._lock:
            self._channels.pop(threading.current_thread(), None)
            self._link["reconnects"] += channel.reconnects + 1
        with contextlib.suppress(zmq.ZMQError):
            channel.close()

    def _prune_channels(self) -> None:
        """Close the sockets of threads that have exited (caller holds the lock)."""
        for thread in [t for t in self._channels if not t.is_alive()]:
            channel = self._channels.pop(thread)
            self._link["reconnects"] += channel.reconnects
            channel.close()

    def _call(
        self, op: Op, requests: list[Request], kind: type[_R], on_reply: OnReply | None = None
    ) -> list[_R | None]:
        """Run ``requests`` through this thread's channel under the breaker.

        Returns one typed reply per request, None where the request failed
        (no answer in time, an error reply, a reply of the wrong shape);
        ``on_reply`` sees each reply as it arrives (``Channel.exchange``).
        """
        if not requests:
            return []
        admission = self._breaker.admit()
        if admission is Admission.PROBE and op is not Op.PING and not self._probe():
            admission = Admission.REFUSE
        if admission is Admission.REFUSE:
            self._count("fast_fails", len(requests))
            return [None] * len(requests)
        return self._exchange(op, requests, kind, on_reply)

    def _exchange(
        self, op: Op, requests: list[Request], kind: type[_R], on_reply: OnReply | None = None
    ) -> list[_R | None]:
        """``_call`` once admitted: the exchange, its counters and the breaker's record."""
        self._count("requests", len(requests))
        # Until shown otherwise the peer is down: an exception, a timeout or a socket
        # error opens the breaker at once, so one call, not several, waits on a dead daemon.
        record: Callable[[], None] = self._breaker.record_down
        try:
            channel = self._channel()
            outcome = channel.exchange(op, requests, self._config.timeout_s, on_reply)
            self._count("timeouts", outcome.timed_out)
            if outcome.timed_out:
                self._hint_once()
            self._count("bad_replies", outcome.bad)
            typed = [self._typed(reply, kind) for reply in outcome.replies]
            if outcome.timed_out == 0:
                busy = any(
                    isinstance(r, ErrorReply) and r.code in _PEER_FAILURES for r in outcome.replies
                )  # the daemon answered: only a run of such replies opens the breaker
                record = self._breaker.record_failure if busy else self._breaker.record_success
            return typed
        except zmq.ZMQError as e:
            logger.warning("daemon link %s failed: %s", self._config.endpoint, e)
            self._drop_channel()  # the next call starts on a new socket
            return [None] * len(requests)
        finally:
            record()

    def _probe(self) -> bool:
        """The breaker's probe: one PING; its answer closes the breaker, else it reopens."""
        (reply,) = self._exchange(Op.PING, [Request(Op.PING, 0)], PingReply)
        return reply is not None

    def _hint_once(self) -> None:
        with self._lock:
            hinted, self._hinted = self._hinted, True
        if hinted:
            return
        if self._curve is None:
            hint = (
                "if the daemon runs with auth.curve, set storage.curve_server_key and "
                "storage.curve_client_key (a client without them gets no reply at all)"
            )
        else:
            hint = (
                "check that storage.curve_server_key is the daemon's public key and that "
                "the daemon lists this client's public key in auth.tenants"
            )
        logger.warning(
            "no reply from the daemon at %s within %.1f s; %s",
            self._config.endpoint,
            self._config.timeout_s,
            hint,
        )

    def _typed(self, reply: Reply | None, kind: type[_R]) -> _R | None:
        if reply is None or isinstance(reply, kind):
            return reply
        if isinstance(reply, ErrorReply):
            self._count("error_replies")
            logger.warning("daemon answered %s: %s", reply.code, reply.message)
        else:
            self._count("bad_replies")
        return None
