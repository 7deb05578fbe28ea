"""What ``storage_backends.remote.channel.Channel`` promises, each against a scripted peer.

The peer is a ROUTER socket on 127.0.0.1 (an OS-picked port) driven by a script in a
thread: it sees exactly what the channel sends and answers when, and how, the test
says. Promises (the module's docstrings and docs/protocol.md):

- replies are matched by id and returned in request order, whatever order they come in;
- each reply is handed to ``on_reply`` as it arrives, before later ones are answered,
  and a GET reply's pages are not held once it has seen them;
- at most ``WINDOW`` requests are in flight, and the window is used (pipelining);
- every request carries an id never used before on the channel;
- an exchange left unanswered returns (bounded) with every request counted timed out,
  and the channel then talks over a new connection, so a late reply is never taken for
  a later request's;
- a reply that breaks the protocol is counted bad (its slot empty), a reply to an
  unknown id or an error without id is ignored;
- a daemon that goes away and comes back on the same endpoint is reached again.
"""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Callable, Iterator

import msgpack
import pytest
import zmq

from storage_backends.page_format import encode_page
from storage_backends.remote.channel import WINDOW, Channel
from storage_backends.remote.protocol import (
    ErrorCode,
    ErrorReply,
    ExistsReply,
    GetReply,
    Limits,
    Op,
    Reply,
    Request,
    decode_request,
    encode_reply,
)
from tests.polling import wait_until

Ctx = zmq.Context[zmq.Socket[bytes]]
Received = tuple[bytes, Request]  # (the client's ROUTER identity, its request)
Script = Callable[["Peer"], None]
BOUND_S = 10.0  # every wait of the peer on the client is bounded by this
# How long the peer watches for a request the window must hold back. A slow machine
# can only make the check miss a violation, never fail a correct channel.
QUIET_MS = 100


class Peer:
    """The daemon's side: a ROUTER socket plus helpers for a script."""

    def __init__(self, ctx: Ctx, endpoint: str = "tcp://127.0.0.1:*"):
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(endpoint)
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def recv(self, timeout_ms: int = int(BOUND_S * 1000)) -> Received | None:
        if not self.sock.poll(timeout_ms, zmq.POLLIN):
            return None
        ident, *frames = self.sock.recv_multipart()
        return ident, decode_request(frames, Limits())

    def must_recv(self) -> Received:
        got = self.recv()
        assert got is not None, "the channel sent nothing within the bound"
        return got

    def send(self, ident: bytes, frames: list[bytes | memoryview]) -> None:
        self.sock.send_multipart([ident, *frames])

    def exists(self, ident: bytes, rid: int, count: int) -> None:
        self.send(ident, encode_reply(ExistsReply(rid, count)))


class Run:
    """A script running against a peer in a thread; ``join`` re-raises its failure."""

    def __init__(self, peer: Peer, script: Script):
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, args=(peer, script), daemon=True)
        self.thread.start()

    def _main(self, peer: Peer, script: Script) -> None:
        try:
            script(peer)
        except BaseException as e:  # handed to the test thread by join()
            self.error = e

    def join(self) -> None:
        self.thread.join(BOUND_S * 2)
        assert not self.thread.is_alive(), "the peer's script did not finish"
        if self.error is not None:
            raise self.error


@pytest.fixture
def ctx() -> Iterator[Ctx]:
    context: Ctx = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def peer(ctx: Ctx) -> Peer:
    return Peer(ctx)


def rebind(ctx: Ctx, endpoint: str, into: list[Peer]) -> bool:
    """Bind a new peer on ``endpoint`` into ``into``; False while the port is still taken."""
    try:
        into.append(Peer(ctx, endpoint))
    except zmq.ZMQError as e:
        if e.errno != zmq.EADDRINUSE:
            raise
        return False
    return True


def channel(ctx: Ctx, endpoint: str) -> Channel:
    return Channel(ctx, endpoint, None, Limits().max_frame_bytes)


def exists(n: int) -> list[Request]:
    """``n`` EXISTS requests; request i asks about i + 1 keys (so its answer is i + 1)."""
    return [
        Request(Op.EXISTS, 0, tuple(bytes([i % 256, j]) for j in range(i % 7 + 1)))
        for i in range(n)
    ]


def answer_len(peer: Peer, got: Received) -> None:
    """Answer an EXISTS with the number of keys it asked about."""
    ident, request = got
    peer.exists(ident, request.id, len(request.keys))


@pytest.mark.timeout(30)
def test_replies_come_back_in_request_order_whatever_order_they_arrive_in(
    ctx: Ctx, peer: Peer
) -> None:
    requests = exists(10)

    def script(p: Peer) -> None:
        held = [p.must_recv() for _ in requests]
        for got in reversed(held):
            answer_len(p, got)

    run = Run(peer, script)
    out = channel(ctx, peer.endpoint).exchange(Op.EXISTS, requests, BOUND_S)
    run.join()
    assert (out.timed_out, out.bad) == (0, 0)
    counts = [r.count if isinstance(r, ExistsReply) else None for r in out.replies]
    assert counts == [len(r.keys) for r in requests]


@pytest.mark.timeout(30)
def test_each_reply_is_handed_over_while_later_ones_are_still_unanswered(
    ctx: Ctx, peer: Peer
) -> None:
    requests = exists(3)
    seen: list[tuple[int, int]] = []  # (position, count) as the channel hands them over
    handed = [threading.Event() for _ in requests]

    def script(p: Peer) -> None:
        held = [p.must_recv() for _ in requests]
        for n, got in enumerate(reversed(held)):
            answer_len(p, got)  # the last request first
            assert handed[len(requests) - 1 - n].wait(BOUND_S), "reply not handed over"

    def on_reply(position: int, reply: object) -> None:
        assert isinstance(reply, ExistsReply)
        seen.append((position, reply.count))
        handed[position].set()

    run = Run(peer, script)
    out = channel(ctx, peer.endpoint).exchange(Op.EXISTS, requests, BOUND_S, on_reply)
    run.join()
    assert seen == [(2, 3), (1, 2), (0, 1)]  # in arrival order, each once
    assert [r.count if isinstance(r, ExistsReply) else None for r in out.replies] == [1, 2, 3]


@pytest.mark.timeout(30)
def test_at_most_window_requests_are_in_flight_and_the_window_is_used(ctx: Ctx, peer: Peer) -> None:
    requests = exists(WINDOW + 9)
    most_held: list[int] = []

    def script(p: Peer) -> None:
        answered = 0
        while answered < len(requests):
            # A correct channel has exactly this many in flight before it waits.
            expected = min(WINDOW, len(requests) - answered)
            held = [p.must_recv() for _ in range(expected)]
            extra = p.recv(QUIET_MS)
            if extra is not None:
                held.append(extra)
            most_held.append(len(held))
            for got in held:
                answer_len(p, got)
            answered += len(held)

    run = Run(peer, script)
    out = channel(ctx, peer.endpoint).exchange(Op.EXISTS, requests, BOUND_S)
    run.join()
    assert (out.timed_out, out.bad) == (0, 0)
    assert most_held == [WINDOW, 9]


@pytest.mark.timeout(30)
def test_every_request_carries_an_id_never_used_before(ctx: Ctx, peer: Peer) -> None:
    ids: list[int] = []
    rounds = 3

    def script(p: Peer) -> None:
        for _ in range(rounds * 4):
            got = p.must_recv()
            ids.append(got[1].id)
            answer_len(p, got)

    run = Run(peer, script)
    chan = channel(ctx, peer.endpoint)
    for _ in range(rounds):
        assert chan.exchange(Op.EXISTS, exists(4), BOUND_S).timed_out == 0
    run.join()
    assert len(set(ids)) == len(ids) == rounds * 4


@pytest.mark.timeout(30)
def test_an_unanswered_exchange_returns_with_every_request_timed_out(ctx: Ctx, peer: Peer) -> None:
    requests = exists(5)
    # The peer takes the requests and never answers: a hung daemon.
    out = channel(ctx, peer.endpoint).exchange(Op.EXISTS, requests, 0.2)
    assert out.replies == [None] * len(requests)
    assert (out.timed_out, out.bad) == (len(requests), 0)


@pytest.mark.timeout(30)
def test_with_no_daemon_at_all_an_exchange_returns_timed_out(ctx: Ctx) -> None:
    nobody = Peer(ctx)
    endpoint = nobody.endpoint
    nobody.sock.close(linger=0)
    out = channel(ctx, endpoint).exchange(Op.EXISTS, exists(3), 0.2)
    assert (out.replies, out.timed_out, out.bad) == ([None] * 3, 3, 0)


@pytest.mark.timeout(30)
def test_after_a_timeout_the_channel_talks_over_a_new_connection(ctx: Ctx, peer: Peer) -> None:
    chan = channel(ctx, peer.endpoint)
    assert chan.exchange(Op.EXISTS, exists(1), 0.2).timed_out == 1
    first = peer.must_recv()  # the unanswered request
    # After the timeout the daemon sees another connection; one that answered
    # everything keeps its connection.
    ident_after: list[bytes] = []

    def script(p: Peer) -> None:
        got = p.must_recv()
        ident_after.append(got[0])
        answer_len(p, got)
        got = p.must_recv()
        ident_after.append(got[0])
        answer_len(p, got)

    run = Run(peer, script)
    for _ in range(2):
        assert chan.exchange(Op.EXISTS, exists(1), BOUND_S).timed_out == 0
    run.join()
    assert ident_after[0] != first[0]
    assert ident_after[0] == ident_after[1]


@pytest.mark.timeout(30)
def test_a_late_reply_is_never_taken_for_a_later_requests(ctx: Ctx, peer: Peer) -> None:
    chan = channel(ctx, peer.endpoint)
    one_key = [Request(Op.EXISTS, 0, (b"k",))]
    assert chan.exchange(Op.EXISTS, one_key, 0.2).timed_out == 1
    late_ident, late = peer.must_recv()

    def script(p: Peer) -> None:
        ident, request = p.must_recv()
        # The late answer (1: "present") comes first, then the real one (0).
        p.exists(late_ident, late.id, 1)
        p.exists(ident, request.id, 0)

    run = Run(peer, script)
    out = chan.exchange(Op.EXISTS, one_key, BOUND_S)
    run.join()
    assert (out.timed_out, out.bad) == (0, 0)
    assert isinstance(out.replies[0], ExistsReply) and out.replies[0].count == 0


def raw_reply(rid: int | None, **fields: object) -> list[bytes | memoryview]:
    return [msgpack.packb({"v": 1, "id": rid, **fields})]


@pytest.mark.timeout(30)
def test_a_broken_reply_is_counted_bad_and_strays_are_ignored(ctx: Ctx, peer: Peer) -> None:
    requests = exists(3)

    def script(p: Peer) -> None:
        held = [p.must_recv() for _ in requests]
        ident = held[0][0]
        p.send(ident, raw_reply(held[0][1].id, ok=True, count="three"))  # breaks the protocol
        p.send(ident, raw_reply(None, ok=False, code="BUSY", message="no id"))  # no id
        p.exists(ident, max(g[1].id for g in held) + 1000, 5)  # an id never sent
        answer_len(p, held[1])
        p.send(ident, encode_reply(ErrorReply(held[2][1].id, ErrorCode.BUSY, "later")))

    run = Run(peer, script)
    out = channel(ctx, peer.endpoint).exchange(Op.EXISTS, requests, BOUND_S)
    run.join()
    assert (out.timed_out, out.bad) == (0, 1)
    assert out.replies[0] is None
    assert isinstance(out.replies[1], ExistsReply) and out.replies[1].count == 2
    assert isinstance(out.replies[2], ErrorReply) and out.replies[2].code is ErrorCode.BUSY


@pytest.mark.timeout(30)
def test_a_daemon_back_on_the_same_endpoint_is_reached_again(ctx: Ctx, peer: Peer) -> None:
    chan = channel(ctx, peer.endpoint)
    run = Run(peer, lambda p: answer_len(p, p.must_recv()))
    assert chan.exchange(Op.EXISTS, exists(1), BOUND_S).timed_out == 0
    run.join()
    peer.sock.close(linger=0)
    # zmq releases the port in its I/O thread, after close() returns.
    back: list[Peer] = []
    assert wait_until(lambda: rebind(ctx, peer.endpoint, back), BOUND_S)
    stop = threading.Event()

    def answer_all(p: Peer) -> None:
        while not stop.is_set():
            got = p.recv(50)
            if got is not None:
                answer_len(p, got)

    run = Run(back[0], answer_all)
    # A request sent before the client saw the old connection drop is lost with it
    # (a timeout, then a fresh socket): the promise is that some exchange gets through.
    reached = wait_until(lambda: chan.exchange(Op.EXISTS, exists(1), 0.5).timed_out == 0, BOUND_S)
    stop.set()
    run.join()
    assert reached


@pytest.mark.timeout(30)
def test_a_get_reply_s_pages_are_let_go_once_on_reply_has_seen_them(ctx: Ctx, peer: Peer) -> None:
    # Held to the end of the exchange, a call's receive buffers were all freed at once, and
    # glibc gave that memory back to the kernel: the next call faulted fresh memory in.
    page = encode_page(b"k" * 32, b"p" * (256 << 10))
    requests = [Request(Op.GET, 0, (bytes([i]) * 32,)) for i in range(4)]

    def script(p: Peer) -> None:
        for _ in requests:
            ident, request = p.must_recv()
            p.send(ident, encode_reply(GetReply(request.id, (True,), (page,))))

    run = Run(peer, script)
    seen: list[weakref.ref[zmq.Frame]] = []

    def on_reply(_position: int, reply: Reply) -> None:
        assert isinstance(reply, GetReply) and bytes(reply.pages[0]) == page
        frame = memoryview(reply.pages[0]).obj
        assert isinstance(frame, zmq.Frame)
        seen.append(weakref.ref(frame))

    outcome = channel(ctx, peer.endpoint).exchange(Op.GET, requests, BOUND_S, on_reply)
    run.join()
    assert len(seen) == 4 and all(isinstance(r, GetReply) for r in outcome.replies)
    gc.collect()
    assert [ref() for ref in seen] == [None] * 4  # released while the outcome is held
    assert [r.found for r in outcome.replies if isinstance(r, GetReply)] == [(True,)] * 4
