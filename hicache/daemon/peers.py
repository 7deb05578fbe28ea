"""Connections to the daemon: the fd limit, a bound on peers, and warnings near either.

Idle peers each hold a file descriptor; once the process runs out, the
listening socket can accept no one (and libzmq retries the failing accept
in a loop). So the daemon raises its soft fd limit to the hard limit at
start and counts accepted connections through a socket monitor. A
connection that would exceed ``server.max_peers`` (kept below the fd limit)
makes room by shutting down the idlest one instead: the TCP connection that
has gone longest without receiving a byte (a peer that never handshook, or
an engine that stopped sending), so a new engine's first request is not
lost to connections that only hold a slot. Where that cannot be told (ipc),
the newcomer is shut instead. Half-open and silent peers are also dropped by
ZMTP heartbeats and the handshake timeout, set on the socket by the server.
"""

from __future__ import annotations

import contextlib
import logging
import resource
import socket
import struct
from typing import NamedTuple

import zmq
from zmq.utils.monitor import recv_monitor_message

logger = logging.getLogger(__name__)

# Descriptors kept for everything but peers: the store, the metrics port, logs, pipes.
FD_RESERVE = 64
_NEAR = 0.9  # warn once the peers reach this share of the bound
# struct tcp_info (linux/tcp.h): eight u8 fields, then u32s; tcpi_last_data_recv is the 12th.
_TCP_INFO_BYTES = 104
_LAST_DATA_RECV = struct.Struct("=I")
_LAST_DATA_RECV_OFFSET = 8 + 11 * 4


class PeerCount(NamedTuple):
    connected: int
    refused: int  # connections shut down to stay within the bound (newcomer or idlest), so far


def idle_ms(fd: int) -> int | None:
    """Milliseconds since the TCP connection on ``fd`` last received data; None if that
    cannot be read (not TCP, not Linux, already closed)."""
    tcp_info = getattr(socket, "TCP_INFO", None)
    if tcp_info is None:
        return None
    try:
        dup = socket.socket(fileno=socket.dup(fd))
    except OSError:
        return None
    try:
        info = dup.getsockopt(socket.IPPROTO_TCP, tcp_info, _TCP_INFO_BYTES)
    except OSError:
        return None
    finally:
        dup.close()
    if len(info) < _LAST_DATA_RECV_OFFSET + _LAST_DATA_RECV.size:
        return None
    return int(_LAST_DATA_RECV.unpack_from(info, _LAST_DATA_RECV_OFFSET)[0])


def raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; return the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft if soft != resource.RLIM_INFINITY else target
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:
        logger.warning("cannot raise the fd limit from %d to %d: %s", soft, target, exc)
        return soft
    return target


def _shut_down(fd: int) -> None:
    """End the TCP connection on ``fd`` (libzmq then closes its descriptor itself)."""
    with contextlib.suppress(OSError):
        dup = socket.socket(fileno=socket.dup(fd))
        try:
            dup.shutdown(socket.SHUT_RDWR)
        finally:
            dup.close()


class PeerGuard:
    """Counts a ROUTER's accepted connections and refuses those over ``max_peers``.

    Used on the socket thread only: register ``socket`` with the poller and call
    ``handle`` when it is readable; ``close`` before the ROUTER is closed.
    """

    def __init__(
        self, router: zmq.Socket[bytes], max_peers: int, fd_limit: int, min_idle_ms: int
    ) -> None:
        self._router = router
        # Only a connection silent this long may be shut to make room: a live engine
        # (heartbeats count as data) is always fresher, so a burst of newcomers never
        # pushes out engines that talk.
        self._min_idle_ms = min_idle_ms
        self._max = max(1, min(max_peers, fd_limit - FD_RESERVE))
        if self._max < max_peers:
            logger.warning(
                "server.max_peers %d exceeds what the fd limit %d allows: bound to %d",
                max_peers,
                fd_limit,
                self._max,
            )
        self.socket = router.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        self._fds: dict[int, None] = {}  # in accept order: the oldest first
        self._refused = 0
        self._warned = False

    def handle(self) -> PeerCount:
        while self.socket.poll(0):
            event = recv_monitor_message(self.socket)
            fd = int(event["value"])
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self._fds.pop(fd, None)
            elif len(self._fds) >= self._max:
                self._make_room(fd)
            else:
                self._fds[fd] = None
                self._warn_if_near()
        return PeerCount(len(self._fds), self._refused)

    def _make_room(self, fd: int) -> None:
        """Over the bound: shut the idlest connection and keep ``fd``, or shut ``fd``."""
        idlest = self._idlest()
        if idlest is not None:
            del self._fds[idlest]
            self._fds[fd] = None
        victim = idlest if idlest is not None else fd
        _shut_down(victim)
        self._refused += 1
        if self._refused == 1 or self._refused % 1000 == 0:
            which = "the idlest connection" if idlest is not None else "a new connection"
            logger.warning(
                "%d peers connected (server.max_peers): refused a connection, %s (%d so far)",
                len(self._fds),
                which,
                self._refused,
            )

    def _idlest(self) -> int | None:
        """The connection longest without data (of equals, the oldest), if it has been
        silent for at least ``min_idle_ms``; None if there is none or it cannot be told."""
        idle = {fd: ms for fd in self._fds if (ms := idle_ms(fd)) is not None}
        if not idle:
            return None
        fd = max(idle, key=idle.__getitem__)
        return fd if idle[fd] >= self._min_idle_ms else None

    def _warn_if_near(self) -> None:
        near = len(self._fds) >= _NEAR * self._max
        if near and not self._warned:
            logger.warning("%d peers connected, near the bound of %d", len(self._fds), self._max)
        self._warned = near

    def close(self) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self._router.disable_monitor()
        self.socket.close(linger=0)
