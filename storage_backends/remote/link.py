"""DaemonLink: one process's connection to a cache daemon, under a circuit breaker.

Each calling thread gets its own DEALER ``Channel`` (zmq sockets are not
thread-safe); the breaker and the link's counters are shared and locked. A call
runs its requests through the thread's channel, bounded by ``storage.timeout_s``:
the first request left unanswered (or a socket error) opens the breaker, as do
``storage.breaker_failures`` BUSY/INTERNAL replies in a row; while it is open calls
fail fast until a probe (one PING, every ``storage.breaker_cooldown_s``) gets an
answer. The link knows requests and replies, never pages: ``RemoteBackend`` builds
the one and reads the other.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import zmq

from storage_backends.breaker import Admission, BreakerState, CircuitBreaker
from storage_backends.config import StorageConfig
from storage_backends.errors import StorageClosedError
from storage_backends.page_format import HEADER_BYTES
from storage_backends.remote.channel import Channel, CurveKeys, OnReply, Prepare
from storage_backends.remote.protocol import ErrorCode, ErrorReply, Op, PingReply, Reply, Request

logger = logging.getLogger(__name__)

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


class DaemonLink:
    """The channels to one daemon, its breaker and counters (see the module docstring).

    Thread-safe. ``call`` never raises for the daemon's sake (no answer, an error
    reply, a broken reply, a socket error: that request's reply is None);
    StorageClosedError once ``close`` has run.
    """

    def __init__(self, config: StorageConfig, curve: CurveKeys | None) -> None:
        self._config = config
        self.curve = curve
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._local = threading.local()
        self._channels: dict[threading.Thread, Channel] = {}
        self._lock = threading.Lock()
        # No growing back-off: a probe is one PING, so probing on every cool-down is cheap.
        self._breaker = CircuitBreaker(
            config.breaker_failures, config.breaker_cooldown_s, config.breaker_cooldown_s
        )
        self._hinted = False  # the first timeout logs what it may mean, once
        self._counts = dict.fromkeys(
            ("requests", "timeouts", "fast_fails", "error_replies", "bad_replies", "reconnects"), 0
        )  # "reconnects": of channels already closed; live ones count their own
        self.closed = False

    @property
    def breaker_state(self) -> BreakerState:
        return self._breaker.state

    def count(self, name: str, amount: int = 1) -> None:
        """Add ``amount`` to the counter ``name`` (a field of ``RemoteLinkStats``)."""
        with self._lock:
            self._counts[name] += amount

    def stats(self) -> RemoteLinkStats:
        """The counters (no I/O)."""
        with self._lock:
            counts = dict(self._counts)
            counts["reconnects"] += sum(c.reconnects for c in self._channels.values())
        return RemoteLinkStats(
            **counts,
            breaker_opens=self._breaker.times_opened,
            breaker_state=self._breaker.state.value,
        )

    def channel(self) -> Channel:
        """This thread's channel, opened on first use; StorageClosedError once closed."""
        channel: Channel | None = getattr(self._local, "channel", None)
        if channel is None:
            with self._lock:
                if self.closed:
                    raise StorageClosedError("RemoteBackend is closed")
                self._prune_channels()
                channel = Channel(self._ctx, self._config.endpoint, self.curve, self._max_frame())
                self._channels[threading.current_thread()] = channel
            self._local.channel = channel
        return channel

    def close(self, before: Callable[[Channel], None]) -> bool:
        """Close every channel, each after ``before(channel)``, and the context; False if
        it was closed already."""
        with self._lock:
            if self.closed:
                return False
            self.closed = True
            for channel in self._channels.values():
                before(channel)
                channel.close()
            self._channels.clear()
        self._ctx.term()
        return True

    def call(
        self,
        op: Op,
        requests: list[Request],
        kind: type[_R],
        on_reply: OnReply | None = None,
        prepare: Prepare | None = None,
    ) -> list[_R | None]:
        """Run ``requests`` through this thread's channel under the breaker.

        Returns one typed reply per request, None where the request failed
        (no answer in time, an error reply, a reply of the wrong shape);
        ``on_reply`` sees each reply as it arrives, ``prepare`` builds each request
        as it is sent (``Channel.exchange``).
        """
        if not requests:
            return []
        admission = self._breaker.admit()
        if admission is Admission.PROBE and op is not Op.PING and not self._probe():
            admission = Admission.REFUSE
        if admission is Admission.REFUSE:
            self.count("fast_fails", len(requests))
            return [None] * len(requests)
        return self._exchange(op, requests, kind, on_reply, prepare)

    def _max_frame(self) -> int:
        """The largest frame a valid reply can carry: one page record, or a header."""
        return self._config.max_page_bytes + HEADER_BYTES + REPLY_HEADER_BYTES

    def _drop_channel(self) -> None:
        channel: Channel | None = getattr(self._local, "channel", None)
        self._local.channel = None
        if channel is None:
            return
        with self._lock:
            self._channels.pop(threading.current_thread(), None)
            self._counts["reconnects"] += channel.reconnects + 1
        with contextlib.suppress(zmq.ZMQError):
            channel.close()

    def _prune_channels(self) -> None:
        """Close the sockets of threads that have exited (caller holds the lock)."""
        for thread in [t for t in self._channels if not t.is_alive()]:
            channel = self._channels.pop(thread)
            self._counts["reconnects"] += channel.reconnects
            channel.close()

    def _exchange(
        self,
        op: Op,
        requests: list[Request],
        kind: type[_R],
        on_reply: OnReply | None = None,
        prepare: Prepare | None = None,
    ) -> list[_R | None]:
        """``call`` once admitted: the exchange, its counters and the breaker's record."""
        self.count("requests", len(requests))
        # Until shown otherwise the peer is down: an exception, a timeout or a socket
        # error opens the breaker at once, so one call, not several, waits on a dead daemon.
        record: Callable[[], None] = self._breaker.record_down
        try:
            channel = self.channel()
            outcome = channel.exchange(op, requests, self._config.timeout_s, on_reply, prepare)
            self.count("timeouts", outcome.timed_out)
            if outcome.timed_out:
                self._hint_once()
            self.count("bad_replies", outcome.bad)
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
        if self.curve is None:
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
            self.count("error_replies")
            logger.warning("daemon answered %s: %s", reply.code, reply.message)
        else:
            self.count("bad_replies")
        return None
