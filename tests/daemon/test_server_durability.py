"""Acknowledged PUTs survive ``kill -9`` and SIGTERM; SIGTERM exits 0 after answering."""

from __future__ import annotations

from pathlib import Path

from hicache.daemon.protocol import Op, PutReply, Request, decode_reply, encode_request

from .conftest import REPLY_TIMEOUT_S, page_key, page_record

WINDOW = 16  # PUT requests kept in flight


class _Pipeline:
    """PUT requests of 4 pages each, ``WINDOW`` in flight on one DEALER; tracks acks."""

    def __init__(self, client) -> None:
        self.client = client
        self.sent: dict[int, list[bytes]] = {}
        self.acked: list[bytes] = []
        self._next = 0

    def send_one(self) -> None:
        self._next += 1
        keys = [page_key(4 * self._next + j, "dur-") for j in range(4)]
        records = [page_record(key, 0, size=8192) for key in keys]
        self.client.sock.send_multipart(encode_request(Request(Op.PUT, self._next, keys, records)))
        self.sent[self._next] = keys

    def receive_one(self, timeout_s: float = REPLY_TIMEOUT_S) -> bool:
        frames = self.client.recv(timeout_s)
        if frames is None:
            return False
        reply = decode_reply(frames, Op.PUT)
        assert isinstance(reply, PutReply) and all(reply.stored), reply
        self.acked.extend(self.sent.pop(reply.id))
        return True

    def run_until(self, acks: int) -> None:
        for _ in range(WINDOW):
            self.send_one()
        while len(self.acked) < 4 * acks:
            assert self.receive_one()
            self.send_one()


def _check_all_served(daemon, connect, keys: list[bytes]) -> None:
    client = connect(daemon.endpoint)
    daemon.wait_ping(client)
    for start in range(0, len(keys), 256):
        batch = keys[start : start + 256]
        assert client.get(batch) == [page_record(key, 0, size=8192) for key in batch]


def test_kill_9_loses_no_acknowledged_page(start_daemon, connect, tmp_path: Path) -> None:
    daemon = start_daemon()
    pipeline = _Pipeline(connect(daemon.endpoint))
    pipeline.run_until(acks=150)
    daemon.kill9()  # with WINDOW requests in flight
    assert pipeline.sent, "requests were in flight at the kill"
    restarted = start_daemon(daemon.config_path.read_text())
    _check_all_served(restarted, connect, pipeline.acked)


def test_sigterm_answers_in_flight_writes_and_exits_0(start_daemon, connect, tmp_path) -> None:
    daemon = start_daemon()
    pipeline = _Pipeline(connect(daemon.endpoint))
    pipeline.run_until(acks=40)
    acked_before = len(pipeline.acked)
    assert daemon.terminate() == 0, daemon.log()
    while pipeline.receive_one(timeout_s=0.5):
        pass  # replies to what the daemon had read before stopping
    assert len(pipeline.acked) >= acked_before
    restarted = start_daemon(daemon.config_path.read_text())
    _check_all_served(restarted, connect, pipeline.acked)
