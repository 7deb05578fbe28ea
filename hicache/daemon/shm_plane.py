"""ShmPlane: the daemon's shared-memory slab and the leases same-host clients hold on it.

The slab is one file under /dev/shm (0600, the daemon's user, named by the endpoint and
the daemon's pid; removed at close, and by the next daemon to start if a killed one left
it) that the daemon and its ``ipc://`` clients map.
A client attaches (SHM_ATTACH) and gets a lease: its own put area, into which it
writes PUT records, and GET slots the daemon fills with the records it answers
with, lent until the client frees them (SHM_FREE). A lease is reclaimed, with
everything lent to it, once it has had no request in flight and no request or
reply for ``expires_s`` (three heartbeat intervals): a dead client's memory comes
back; a live one's requests count as heartbeats, so a busy client keeps its slots.

Nothing here trusts the client: the daemon copies a PUT record out of the slab
before checking it, and a client checks every record it reads (key and checksum),
so a slot reused under a slow or stale reader is a miss, never a wrong byte.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import mmap
import os
import secrets
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from hicache.daemon.shm_extents import Extents
from storage_backends.remote.protocol import MAX_ID, ErrorCode, Frame, ProtocolError, Span

logger = logging.getLogger(__name__)

_NO_AREA = Span(0, 0)


def slab_path(endpoint: str) -> str:
    """Where this daemon, bound to ``endpoint``, keeps its slab: named by the user, the
    endpoint and the pid, so that ``remove_stale`` can tell what a dead daemon left."""
    name = f"{_PREFIX}{os.getuid()}-{_endpoint_tag(endpoint)}-{os.getpid()}"
    return os.path.join(_slab_dir(), name)


def remove_stale(endpoint: str) -> int:
    """Remove this user's slabs whose daemon is gone (killed before it could remove its
    own), and any other slab of ``endpoint``; return how many."""
    digest = _endpoint_tag(endpoint)
    mine = f"{_PREFIX}{os.getuid()}-"
    removed = 0
    for name in os.listdir(_slab_dir()):
        parts = name.removeprefix(mine).split("-")
        if not name.startswith(mine) or len(parts) != 2 or not parts[1].isdigit():
            continue
        if parts[0] == digest or not _alive(int(parts[1])):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(_slab_dir(), name))
                removed += 1
    return removed


_PREFIX = "hicache-slab-"


def _endpoint_tag(endpoint: str) -> str:
    """The part of a slab's name that says which endpoint its daemon was bound to."""
    return hashlib.sha256(endpoint.encode()).hexdigest()[:16]


def _slab_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


class Grant(NamedTuple):
    """A lease as SHM_ATTACH reports it."""

    lease: int
    put: Span


class ShmStats(NamedTuple):
    leases: int
    lent_bytes: int  # put areas and GET slots, all leases together
    size: int


@dataclass
class _Lease:
    put: Span
    seen: float
    busy: int = 0  # requests of this lease in flight in the daemon
    detached: bool = False
    lent: dict[int, Span] = field(default_factory=dict)  # GET slots by offset
    lent_bytes: int = 0


class ShmPlane:
    """The slab and its leases. Every method is thread-safe (one lock; no copy is made
    under it). Unknown leases raise ``ProtocolError(NO_LEASE)`` where a request needs
    one. Construction raises OSError if the slab cannot be created (e.g. /dev/shm full).
    """

    def __init__(
        self, path: str, size: int, expires_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = path
        self.expires_s = expires_s
        self._clock = clock
        self._lock = threading.Lock()
        self._free = Extents(size)
        self.size = self._free.size
        self._leases: dict[int, _Lease] = {}
        self._map = _create(path, self.size)
        self._view = memoryview(self._map)

    def attach(self, lease: int, put_bytes: int) -> Grant:
        """Renew ``lease`` if it is alive, else open a new one with a put area of up to
        ``put_bytes`` (a quarter of the slab at most; none when no run is free)."""
        with self._lock:
            known = self._leases.get(lease)
            if known is not None and not known.detached:
                known.seen = self._clock()
                return Grant(lease, known.put)
            want = min(put_bytes, self.size // 4)
            put = (self._free.take(want) if want else None) or _NO_AREA
            lease = secrets.randbelow(MAX_ID - 1) + 1
            self._leases[lease] = _Lease(put, self._clock())
            return Grant(lease, put)

    def touch(self, lease: int) -> None:
        """A request of ``lease`` arrived (a heartbeat); NO_LEASE if it is unknown."""
        with self._lock:
            self._alive(lease).seen = self._clock()

    def begin(self, lease: int) -> None:
        """A request of ``lease`` arrived (it counts as a heartbeat); NO_LEASE if unknown.
        Each ``begin`` must be followed by one ``end`` when its reply goes out."""
        with self._lock:
            entry = self._alive(lease)
            entry.busy += 1
            entry.seen = self._clock()

    def end(self, lease: int) -> None:
        with self._lock:
            entry = self._leases.get(lease)
            if entry is not None:
                entry.busy -= 1
                entry.seen = self._clock()

    def free(self, lease: int, spans: Sequence[Span]) -> None:
        """Give back GET slots the client has copied out (others' or unknown ones: ignored)."""
        with self._lock:
            entry = self._leases.get(lease)
            if entry is None:
                return
            entry.seen = self._clock()
            for span in spans:
                lent = entry.lent.pop(span.offset, None)
                if lent is not None:
                    entry.lent_bytes -= lent.length
                    self._free.give_back(lent)

    def detach(self, lease: int) -> None:
        """The client is done with ``lease``: reclaimed as soon as nothing of it is in flight."""
        with self._lock:
            entry = self._leases.get(lease)
            if entry is not None:
                entry.detached = True
        self.sweep()

    def put_records(self, lease: int, spans: Sequence[Span]) -> tuple[Frame, ...]:
        """Read-only views of a PUT's records, each inside the lease's put area (BAD_FRAMES
        otherwise). Copy them before checking them: the client can still write there."""
        with self._lock:
            area = self._alive(lease).put
        end = area.offset + area.length
        for span in spans:
            if span.offset < area.offset or span.offset + span.length > end:
                raise ProtocolError(ErrorCode.BAD_FRAMES, f"{span} is outside the lease's area")
        return tuple(self._view[s.offset : s.offset + s.length].toreadonly() for s in spans)

    def lend(self, lease: int, records: Sequence[Frame]) -> tuple[Span, ...] | None:
        """Copy ``records`` into GET slots lent to ``lease`` (which has this request in
        flight, see ``begin``); None when the slab, or the lease's share of it (a
        quarter), has no room, or the lease is gone: the reply then goes as frames, and
        nothing is lent (a reply is lent whole or not at all)."""
        spans: list[Span] = []
        with self._lock:
            entry = self._leases.get(lease)
            need = sum(len(record) for record in records)
            if entry is None or entry.detached or entry.lent_bytes + need > self.size // 4:
                return None
            for record in records:
                span = self._free.take(len(record))
                if span is None:  # the slab is full: what was taken goes back, nothing lent
                    for taken in spans:
                        self._free.give_back(taken)
                    return None
                spans.append(span)
            # Lent only once every record has its slot: a reply is lent whole or not at all.
            for span in spans:
                entry.lent[span.offset] = span
                entry.lent_bytes += span.length
        for span, record in zip(spans, records, strict=True):
            self._view[span.offset : span.offset + len(record)] = record
        return tuple(Span(s.offset, len(r)) for s, r in zip(spans, records, strict=True))

    def sweep(self) -> int:
        """Reclaim leases silent for ``expires_s`` (or detached) with nothing in flight;
        return how many. Every slot of theirs goes back; a slot found free already (a
        bug: freed twice) is skipped and raised as ValueError once the rest is back."""
        now = self._clock()
        with self._lock:
            dead = [
                lease
                for lease, entry in self._leases.items()
                if entry.busy <= 0 and (entry.detached or now - entry.seen >= self.expires_s)
            ]
            spans = [s for lease in dead for s in _held(self._leases.pop(lease)) if s.length]
            failed = _give_back_each(self._free, spans)
        if dead:
            logger.debug("reclaimed %d shared-memory leases", len(dead))
        if failed is not None:  # every other span went back; the caller hears of the bug
            raise failed
        return len(dead)

    def check(self) -> None:
        """Assert every slot is held once: put areas and GET slots of all leases apart,
        none of them free, each lease's ``lent_bytes`` its slots' sum, and the free list
        plus what the leases hold the whole slab. Mutates nothing."""
        with self._lock:
            self._free.check()
            held: list[Span] = []
            for entry in self._leases.values():
                assert entry.lent_bytes == sum(s.length for s in entry.lent.values()), entry
                assert all(offset == s.offset for offset, s in entry.lent.items()), entry
                held.extend(entry.lent.values())
                if entry.put.length:
                    held.append(entry.put)
            held.sort()
            for a, b in itertools.pairwise(held):
                assert a.offset + a.length <= b.offset, f"{a} and {b} are lent at once"
            for span in held:
                assert not self._free.overlaps_free(span), f"{span} is lent and free"
            assert self._free.used == sum(s.length for s in held), "slots unaccounted for"

    def stats(self) -> ShmStats:
        with self._lock:
            return ShmStats(len(self._leases), self._free.used, self.size)

    def close(self) -> None:
        """Remove the slab (clients' mappings stay valid until they drop them)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        with contextlib.suppress(BufferError):  # views still held by queued work
            self._view.release()
            self._map.close()

    def _alive(self, lease: int) -> _Lease:
        entry = self._leases.get(lease)
        if entry is None or entry.detached:
            raise ProtocolError(ErrorCode.NO_LEASE, "unknown shared-memory lease; attach again")
        return entry


def _held(entry: _Lease) -> list[Span]:
    return [*entry.lent.values(), entry.put]


def _give_back_each(free: Extents, spans: Sequence[Span]) -> ValueError | None:
    """Give every span back; the first refusal (a span freed twice), if any."""
    failed: ValueError | None = None
    for span in spans:
        try:
            free.give_back(span)
        except ValueError as exc:
            failed = failed or exc
    return failed


def _create(path: str, size: int) -> mmap.mmap:
    """A fresh 0600 file of ``size`` bytes at ``path``, mapped (a stale one is replaced).
    The space is allocated now, so a full /dev/shm is an error here, not a SIGBUS later."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)
        return mmap.mmap(fd, size)
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)
