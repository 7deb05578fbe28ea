"""DaemonServer: the ROUTER socket loop of ``hicache serve``.

One thread owns the socket and only receives, routes and sends: it answers PING
and STATS at once, answers a read (GET, EXISTS, CONTAINS) the memory tier holds in
full, queues the other reads per client for the reader threads (``readers``: round
robin across clients, so one client's bulk reads never hold another's small request;
``read_answers`` builds read replies on either thread), and hands writes (PUT,
DELETE) to the writer thread, replying when their commit is done. Replies go out
as they complete, so one client's requests may be answered out of order (each
carries its request id).
Every failure becomes an error reply; nothing a client sends can stop the loop.
What a client can make the daemon hold is bounded: writes in flight, reads
queued, GET replies being read or not yet taken (``replies``), connections
(``peers``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import NamedTuple

import zmq

from hicache.config.daemon import DaemonConfig, ServerConfig, is_loopback
from hicache.daemon.auth import DEFAULT_TENANT, CurveAuth
from hicache.daemon.metrics import DaemonMetrics
from hicache.daemon.peers import PeerGuard, raise_fd_limit
from hicache.daemon.read_answers import ReadAnswers
from hicache.daemon.readers import Readers, ReadJob
from hicache.daemon.replies import ReplyBudget, send_reply
from hicache.daemon.reply_pool import POISON_ENV, ReplyPool, poison_on
from hicache.daemon.shm_plane import ShmPlane, remove_stale, slab_path
from hicache.daemon.store import DaemonStore, scoped_key
from hicache.daemon.writer import WriteDone, WriteJob, Writer, WriterStats
from storage_backends.remote.protocol import (
    DeleteReply,
    ErrorCode,
    ErrorReply,
    GetReply,
    Op,
    PingReply,
    ProtocolError,
    PutReply,
    Reply,
    Request,
    ShmAttachReply,
    StatsReply,
    decode_request,
    encode_reply,
)

logger = logging.getLogger(__name__)

_POLL_MS = 100
_RECV_BATCH = 256  # messages taken per wake-up before the writer's completions are sent
_LINGER_MS = 2000  # time the socket keeps trying to deliver the last replies on close


def server_version() -> str:
    try:
        return f"hicache {version('hicache')}"
    except PackageNotFoundError:
        return "hicache (not installed)"


def _quiet_ms(server: ServerConfig) -> int:
    """How long a connection must have been silent before it may be shut to make room:
    two heartbeat intervals (a live engine answers every one), or, without heartbeats,
    the handshake timeout."""
    quiet_s = 2 * server.heartbeat_s if server.heartbeat_s > 0 else server.handshake_timeout_s
    return int(quiet_s * 1000)


class Bound(NamedTuple):
    """Where a started daemon listens (written to ``server.ready_file`` as JSON)."""

    endpoint: str
    metrics_port: int | None
    pid: int


class _Pending(NamedTuple):
    """What the loop needs to answer a write once the writer is done."""

    identity: zmq.Frame
    request: Request
    start: float
    nbytes: int


def _bind_address(endpoint: str) -> str:
    # ZeroMQ spells "any free port" as '*'.
    return endpoint[:-2] + ":*" if endpoint.endswith(":0") else endpoint


class DaemonServer:
    """Owns the socket, store, writer, metrics and (with CURVE) the authenticator.

    ``start`` binds and returns where (zmq.ZMQError/OSError if it cannot);
    ``serve`` runs the loop on the calling thread until ``stop`` (thread- and
    signal-safe) and then calls ``close``: no new requests are read, queued
    writes are committed and answered, the store is flushed and closed.
    Construction raises ValueError (key files) or StorageOpenError (store).
    """

    def __init__(self, config: DaemonConfig) -> None:
        self._config = config
        self._limits = config.limits
        self._stopping = threading.Event()
        self._closed = False
        self._context = zmq.Context(io_threads=config.server.io_threads)
        self._auth: CurveAuth | None = None
        try:
            self._auth = CurveAuth(self._context, config.auth) if config.auth.curve else None
            self._store = DaemonStore(config.store, config.limits.max_page_bytes, _quotas(config))
        except BaseException:
            if self._auth is not None:
                self._auth.stop()
            self._context.term()
            raise
        self._metrics = DaemonMetrics(self._store.size, self._writer_stats)
        self._router = self._context.socket(zmq.ROUTER)
        self._wake_in = self._context.socket(zmq.PULL)
        self._wake_out = self._context.socket(zmq.PUSH)
        self._writer: Writer | None = None
        self._readers: Readers | None = None
        self._reads: ReadAnswers | None = None  # with the readers, once started
        self._wake_lock = threading.Lock()
        self._peers: PeerGuard | None = None
        self._in_flight = 0
        self._in_flight_bytes = 0
        server = config.server
        # Store reads land in its buffers, which the replies send.
        self._pool = ReplyPool(poison=poison_on())
        self._replies = ReplyBudget(
            server.max_queued_reply_bytes_per_peer,
            server.max_queued_reply_bytes,
            self._pool.give_back_all,
        )
        self._admins = {t.name for t in config.auth.tenants if t.admin}
        self._server = server_version()
        self._shm: ShmPlane | None = None  # the shared-memory slab (server.shm_bytes > 0)

    def _writer_stats(self) -> WriterStats:
        return self._writer.stats() if self._writer is not None else WriterStats(0, 0, 0)

    def start(self) -> Bound:
        """Bind the socket (and metrics port), start the writer, write the ready file."""
        self._configure_router()
        server = self._config.server
        self._peers = PeerGuard(self._router, server.max_peers, raise_fd_limit(), _quiet_ms(server))
        self._router.bind(_bind_address(self._config.server.endpoint))
        endpoint = self._router.getsockopt_string(zmq.LAST_ENDPOINT)
        if server.shm_bytes > 0:
            if remove_stale(endpoint):
                logger.info("removed shared-memory slabs that daemons killed earlier left")
            self._shm = ShmPlane(slab_path(endpoint), server.shm_bytes, 3 * server.heartbeat_s)
            self._metrics.watch_shm(self._shm.stats)
        wake = f"inproc://hicache-daemon-wake-{id(self)}"
        self._wake_in.bind(wake)
        self._wake_out.connect(wake)
        nice = server.background_nice  # the socket thread runs first on busy cores
        self._writer = Writer(self._store, self._wake, nice)
        reads = ReadAnswers(
            self._store, self._pool, self._replies, self._metrics, self._limits, self._shm
        )
        self._reads = reads
        self._readers = Readers(server.readers, reads.serve, self._wake, nice)
        self._metrics.reply_bytes.set_function(lambda: self._replies.queued_bytes)
        self._metrics.reply_buffers.set_function(lambda: self._pool.size().lent)
        self._metrics.reply_tampered.set_function(lambda: self._pool.size().tampered)
        if poison_on():
            logger.warning("%s: reply buffers are poisoned once given back (debug)", POISON_ENV)
        metrics = self._config.metrics
        port = self._metrics.serve_http(metrics.host, metrics.port) if metrics.port >= 0 else None
        bound = Bound(endpoint, port, os.getpid())
        if self._auth is None and not is_loopback(endpoint):
            logger.warning("listening on %s without CURVE: any client that reaches it", endpoint)
        if self._config.server.ready_file:  # first: once the banner is logged, the file is there
            _write_ready_file(Path(self._config.server.ready_file), bound)
        # hicache.bench.common.processes reads the endpoint from this line: keep its wording.
        metrics_text = "metrics off" if port is None else f"metrics on {metrics.host}:{port}"
        logger.info("hicache daemon listening on %s (%s)", endpoint, metrics_text)
        return bound

    def _configure_router(self) -> None:
        sock = self._router
        # A frame this far past the limits is not answered: the peer is dropped instead,
        # so no single frame can make the daemon buffer more than this.
        sock.setsockopt(zmq.MAXMSGSIZE, 2 * self._limits.max_frame_bytes + 4096)
        sock.setsockopt(zmq.RCVHWM, self._config.server.max_inflight_requests)
        sock.setsockopt(zmq.LINGER, _LINGER_MS)
        server = self._config.server
        # Peers that vanished without a FIN, or connect and never handshake, give their fd back.
        sock.setsockopt(zmq.HANDSHAKE_IVL, int(server.handshake_timeout_s * 1000))
        if server.heartbeat_s > 0:
            sock.setsockopt(zmq.HEARTBEAT_IVL, int(server.heartbeat_s * 1000))
            sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(3 * server.heartbeat_s * 1000))
            sock.setsockopt(zmq.HEARTBEAT_TTL, int(3 * server.heartbeat_s * 1000))
        if self._auth is not None:
            self._auth.secure(sock)

    def _wake(self) -> None:
        # Runs on the writer and reader threads; a zmq socket is not thread-safe: one at a time.
        # zmq.Again: wake-ups already queued; the loop drains all completions at once.
        with self._wake_lock, contextlib.suppress(zmq.Again):
            self._wake_out.send(b"", zmq.NOBLOCK)

    def stop(self) -> None:
        """Ask the loop to finish (safe from signal handlers and other threads)."""
        self._stopping.set()

    def serve(self) -> bool:
        """Run until ``stop``; then shut down. Returns False if writes could not be finished."""
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._wake_in, zmq.POLLIN)
        if self._peers is not None:
            poller.register(self._peers.socket, zmq.POLLIN)
        while not self._stopping.is_set():
            events = dict(poller.poll(_POLL_MS))
            self._sweep()
            if self._peers is not None and self._peers.socket in events:
                self._metrics.peers.set(self._peers.handle().connected)
            if self._wake_in in events:
                self._deliver()
            if self._router in events:
                self._receive()
        return self.close()

    def _sweep(self) -> None:
        """Release what ZeroMQ has sent and reclaim silent leases. A sweep that raises (a
        bug) is logged and counted, and the loop goes on: the next sweep tries again."""
        sweeps: list[Callable[[], object]] = [self._replies.sweep]
        if self._shm is not None:
            sweeps.append(self._shm.sweep)
        for sweep in sweeps:
            try:
                sweep()
            except Exception:
                logger.exception("a sweep failed; serving on")
                self._metrics.sweep_failures.inc()

    def _receive(self) -> None:
        # Asking the socket whether a message waits is far cheaper than the zmq.Again a
        # receive on an empty socket raises (it would cost one exception per wake-up).
        for _ in range(_RECV_BATCH):
            if not _readable(self._router):
                return
            self._handle(self._router.recv_multipart(zmq.NOBLOCK, copy=False))

    def _handle(self, frames: Sequence[zmq.Frame]) -> None:
        identity, body = frames[0], frames[1:]
        start = time.perf_counter()
        nbytes = sum(len(frame) for frame in body)
        self._metrics.received.inc(nbytes)
        request: Request | None = None
        try:
            request = decode_request([frame.buffer for frame in body], self._limits)
            tenant = self._tenant(body[0])
            self._metrics.tenant_request(tenant, request.op)
            reply = self._dispatch(identity, request, tenant, start, nbytes)
        except ProtocolError as exc:
            request_id = request.id if request is not None else exc.request_id
            reply = ErrorReply(request_id, exc.code, exc.message)
        except Exception as exc:  # a bug or a store failure must not end the loop
            logger.exception("request failed")
            request_id = request.id if request is not None else None
            reply = ErrorReply(request_id, ErrorCode.INTERNAL, f"{exc!r:.200}")
        if reply is not None:
            self._send(identity, reply, start, request.op if request is not None else None)

    def _tenant(self, header: zmq.Frame) -> str:
        if self._auth is None:
            return DEFAULT_TENANT
        try:
            user_id = header.get("User-Id")
        except zmq.ZMQError:
            user_id = None
        tenant = self._auth.tenant_of(user_id if isinstance(user_id, str) else None)
        if tenant is None:
            raise ProtocolError(ErrorCode.UNAUTHORIZED, "client key is not mapped to a tenant")
        return tenant

    def _dispatch(
        self, identity: zmq.Frame, request: Request, tenant: str, start: float, nbytes: int
    ) -> Reply | None:
        """The reply to a read, or None once a write is queued (answered on commit)."""
        keys = tuple(scoped_key(tenant, key) for key in request.keys)
        if request.op in (Op.SHM_ATTACH, Op.SHM_FREE, Op.SHM_DETACH):
            return self._shm_op(request)
        if request.lease:
            request = self._leased(request)
        if request.op is Op.PING:
            return PingReply(request.id, self._server)
        if request.op is Op.STATS:
            return self._stats(request, tenant)
        if request.op in (Op.EXISTS, Op.CONTAINS, Op.GET):
            job = ReadJob(identity.bytes, request, keys, tenant, start)
            assert self._reads is not None
            done = self._reads.from_memory(job)
            if done is None:
                self._submit_read(job)
            else:
                self._send(job.peer, done.reply, start, request.op, done.claimed)
            return None
        self._admit_write(request, nbytes)
        assert self._writer is not None
        pending = _Pending(identity, request, start, nbytes)
        write = WriteJob(request.op, keys, request.pages, pending, tenant, request.keys)
        self._begin(request)
        self._writer.submit(write)
        self._in_flight += 1
        self._in_flight_bytes += nbytes
        self._metrics.in_flight.set(self._in_flight)
        return None

    def _stats(self, request: Request, tenant: str) -> StatsReply:
        """The whole daemon's figures without CURVE or for an admin tenant, else the
        tenant's own (its requests; its store's size when it has a quota)."""
        if self._auth is None or tenant in self._admins:
            return StatsReply(request.id, self._metrics.snapshot())
        own = self._metrics.tenant_snapshot(tenant, self._store.tenant_size(tenant))
        return StatsReply(request.id, own)

    def _shm_op(self, request: Request) -> Reply | None:
        """SHM_ATTACH's reply (BAD_OP with shared memory off); SHM_FREE and SHM_DETACH
        are not answered."""
        shm = self._shm
        if request.op is Op.SHM_ATTACH:
            if shm is None:
                raise ProtocolError(ErrorCode.BAD_OP, "shared memory is off (server.shm_bytes)")
            grant = shm.attach(request.lease, request.put_bytes)
            return ShmAttachReply(
                request.id, grant.lease, shm.path, shm.size, grant.put, shm.expires_s
            )
        if shm is not None and request.op is Op.SHM_FREE:
            shm.free(request.lease, request.spans)
        elif shm is not None:
            shm.detach(request.lease)
        return None

    def _leased(self, request: Request) -> Request:
        """A GET or PUT through a lease (NO_LEASE if unknown): a PUT's records are views
        of its put area, written from there (its request keeps the lease alive)."""
        if self._shm is None:
            raise ProtocolError(ErrorCode.NO_LEASE, "shared memory is off (server.shm_bytes)")
        if request.op is Op.PUT and request.spans:
            pages = self._shm.put_records(request.lease, request.spans)
            return dataclasses.replace(request, pages=pages)
        self._shm.touch(request.lease)
        return request

    def _begin(self, request: Request) -> None:
        """A queued request of a lease keeps it from being reclaimed until its reply."""
        if request.lease and self._shm is not None:
            self._shm.begin(request.lease)

    def _end(self, request: Request) -> None:
        if request.lease and self._shm is not None:
            self._shm.end(request.lease)

    def _submit_read(self, job: ReadJob) -> None:
        """Queue a read for the readers; BUSY over the bound on reads waiting."""
        assert self._readers is not None
        if self._readers.stats().queued >= self._config.server.max_inflight_requests:
            raise ProtocolError(ErrorCode.BUSY, "too many reads queued; retry later")
        self._begin(job.request)
        if not self._readers.submit(job):
            self._end(job.request)
            raise ProtocolError(ErrorCode.BUSY, "the daemon is stopping")
        self._metrics.queued_reads.set(self._readers.stats().queued)

    def _admit_write(self, request: Request, nbytes: int) -> None:
        """BUSY over the in-flight bounds. (A PUT's records are checked on the writer
        thread: a checksum over every byte has no place on the socket thread.)"""
        server = self._config.server
        if (
            self._in_flight >= server.max_inflight_requests
            or self._in_flight_bytes + nbytes > server.max_inflight_bytes
        ):
            raise ProtocolError(ErrorCode.BUSY, "too many writes in flight; retry later")

    def _deliver(self) -> None:
        while _readable(self._wake_in):
            self._wake_in.recv(zmq.NOBLOCK)
        assert self._writer is not None
        for done in self._writer.take_done():
            self._finish_write(done)
        self._deliver_reads()

    def _deliver_reads(self) -> None:
        assert self._readers is not None
        for read in self._readers.take_done():
            job = read.job
            if read.failed:
                self._metrics.read_failures.inc()
            self._send(job.peer, read.reply, job.start, job.request.op, read.claimed, read.buffers)
            self._end(job.request)
        self._metrics.queued_reads.set(self._readers.stats().queued)

    def _finish_write(self, done: WriteDone) -> None:
        pending = done.job.token
        assert isinstance(pending, _Pending)
        self._in_flight -= 1
        self._in_flight_bytes -= pending.nbytes
        self._metrics.in_flight.set(self._in_flight)
        request = pending.request
        reply: Reply
        if done.malformed:
            reply = ErrorReply(request.id, ErrorCode.MALFORMED, done.error)
        elif done.error:
            reply = ErrorReply(request.id, ErrorCode.INTERNAL, done.error)
        elif request.op is Op.PUT:
            reply = PutReply(request.id, done.stored)
        else:
            reply = DeleteReply(request.id, done.deleted)
        self._send(pending.identity, reply, pending.start, request.op)
        self._end(request)

    def _send(
        self,
        identity: zmq.Frame | bytes,
        reply: Reply,
        start: float,
        op: Op | None,
        claimed: int = 0,
        buffers: Sequence[memoryview] = (),
    ) -> None:
        """Send ``reply``; a GET reply's ``claimed`` budget is held, and its pool ``buffers``
        lent, until ZeroMQ releases it."""
        frames = encode_reply(reply)
        if isinstance(reply, ErrorReply):
            self._metrics.errors.labels(code=reply.code.value).inc()
        if op is not None:
            self._metrics.answered(op, time.perf_counter() - start)
        nbytes = sum(len(frame) for frame in frames)
        self._metrics.sent.inc(nbytes)
        peer = identity if isinstance(identity, bytes) else identity.bytes
        track = isinstance(reply, GetReply) and bool(reply.pages)
        tracker = send_reply(self._router, identity, frames, track)
        if tracker is not None:
            self._replies.add(peer, tracker, claimed, buffers)
            return
        if claimed:
            self._replies.unclaim(peer, claimed)
        self._pool.give_back_all(buffers)

    def close(self) -> bool:
        """Finish and answer queued writes, then close everything (idempotent; call it
        directly only if ``serve`` never ran). False if the writes did not finish in time."""
        if self._closed:
            return True
        self._closed = True
        logger.info("stopping: answering %d writes in flight", self._in_flight)
        finished = True
        if self._readers is not None:  # reads not started are dropped unanswered
            _, finished = self._readers.close(self._config.server.shutdown_timeout_s)
            self._deliver_reads()
        if self._writer is not None:
            finished = self._writer.close(self._config.server.shutdown_timeout_s) and finished
            for done in self._writer.take_done():
                self._finish_write(done)
        self._wake_in.close(linger=0)
        self._wake_out.close(linger=0)
        if self._peers is not None:
            self._peers.close()
        self._router.close(linger=_LINGER_MS)
        if self._auth is not None:
            self._auth.stop()
        self._metrics.close()
        if self._shm is not None:
            self._shm.close()
        if finished:
            self._store.close()
        else:
            logger.error("writer did not finish within the shutdown timeout")
        self._context.term()
        return finished


def _readable(sock: zmq.Socket[bytes]) -> bool:
    """Whether a message waits on ``sock`` (the socket thread owns it)."""
    events = sock.getsockopt(zmq.EVENTS)
    return isinstance(events, int) and bool(events & zmq.POLLIN)


def _quotas(config: DaemonConfig) -> dict[str, int]:
    if not config.auth.curve:
        return {}
    return {t.name: t.max_store_bytes for t in config.auth.tenants if t.max_store_bytes > 0}


def _write_ready_file(path: Path, bound: Bound) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(bound._asdict()))
    os.replace(tmp, path)
