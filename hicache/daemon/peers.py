"""Connections to the daemon: the fd limit, a bound on peers, and warnings near either.

Idle peers each hold a file descriptor; once the process runs out, the
listening socket can accept no one (and libzmq retries the failing accept
in a loop). So the daemon raises its soft fd limit to the hard limit at
start, counts accepted connections through a socket monitor, and shuts a
connection down at once when it would exceed ``server.max_peers`` (kept
below the fd limit). Half-open and silent peers are dropped by ZMTP
heartbeats and the handshake timeout, set on the socket by the server.
"""

from __future__ import annotations

import contextlib
import logging
import resource
import socket
from typing import NamedTuple

import zmq
from zmq.utils.monitor import recv_monitor_message

logger = logging.getLogger(__name__)

# Descriptors kept for everything but peers: the store, the metrics port, logs, pipes.
FD_RESERVE = 64
_NEAR = 0.9  # warn once the peers reach this share of the bound


class PeerCount(NamedTuple):
    connected: int
    refused: int  # connections shut down for being over the bound, so far


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

    def __init__(self, router: zmq.Socket[bytes], max_peers: int, fd_limit: int) -> None:
        self._router = router
        self._max = max(1, min(max_peers, fd_limit - FD_RESERVE))
        if self._max < max_peers:
            logger.warning(
                "server.max_peers %d exceeds what the fd limit %d allows: bound to %d",
                max_peers,
                fd_limit,
                self._max,
            )
        self.socket = router.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        self._fds: set[int] = set()
        self._refused = 0
        self._warned = False

    def handle(self) -> PeerCount:
        while self.socket.poll(0):
            event = recv_monitor_message(self.socket)
            fd = int(event["value"])
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self._fds.discard(fd)
            elif len(self._fds) >= self._max:
                self._refuse(fd)
            else:
                self._fds.add(fd)
                self._warn_if_near()
        return PeerCount(len(self._fds), self._refused)

    def _refuse(self, fd: int) -> None:
        _shut_down(fd)
        self._refused += 1
        if self._refused == 1 or self._refused % 1000 == 0:
            logger.warning(
                "%d peers connected (server.max_peers): refused a connection (%d so far)",
                len(self._fds),
                self._refused,
            )

    def _warn_if_near(self) -> None:
        near = len(self._fds) >= _NEAR * self._max
        if near and not self._warned:
            logger.warning("%d peers connected, near the bound of %d", len(self._fds), self._max)
        self._warned = near

    def close(self) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self._router.disable_monitor()
        self.socket.close(linger=0)
