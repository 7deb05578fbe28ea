"""The socket thread is never held by the writer: a PING, another client's read and its
own later PING are answered while a bulk PUT batch is being committed; and the writer
and reader threads run below the socket thread's priority (``server.background_nice``).

The daemon runs in this process so that a test can hold the commit at a gate
(``DaemonStore.put`` wrapped): every assertion is on the order replies arrive in.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import msgpack
import pytest

from hicache.config.daemon import DaemonConfig
from hicache.daemon.store import DaemonStore
from storage_backends.remote.protocol import Frame, Op, PingReply, Request, encode_request

from .conftest import REPLY_TIMEOUT_S, Client, in_process_daemon, page_key, page_record

NICE = 5
BULK_PAGES = 16


class Gated(NamedTuple):
    endpoint: str
    gate: threading.Event  # commits wait for it
    committing: threading.Event  # set once a commit is held at the gate
    serving: threading.Thread  # the socket thread


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gated]:
    gate, committing = threading.Event(), threading.Event()
    original = DaemonStore.put

    def put(
        self: DaemonStore,
        keys: Sequence[bytes],
        records: Sequence[Frame],
        tenant: str | None = None,
        client_keys: Sequence[bytes] = (),
    ) -> list[bool]:
        committing.set()
        assert gate.wait(2 * REPLY_TIMEOUT_S)
        return original(self, keys, records, tenant, client_keys)

    monkeypatch.setattr(DaemonStore, "put", put)
    config = DaemonConfig().with_overrides(
        server={"endpoint": "tcp://127.0.0.1:0", "readers": 1, "background_nice": NICE},
        store={"path": str(tmp_path / "store"), "max_bytes": 64 << 20, "sync": False},
    )
    with in_process_daemon(config) as served:
        yield Gated(served.endpoint, gate, committing, served.serving)
        gate.set()


def reply_id(client: Client) -> int:
    frames = client.recv()
    assert frames is not None, "no reply in time"
    header = msgpack.unpackb(frames[0])
    assert header["ok"] is True, header
    return int(header["id"])


def test_pings_and_reads_are_answered_while_a_bulk_put_is_being_committed(daemon, clients) -> None:
    bulk, small = clients(), clients()
    keys = [page_key(i) for i in range(BULK_PAGES)]
    records = [page_record(key, i, size=64 << 10) for i, key in enumerate(keys)]
    bulk.sock.send_multipart(encode_request(Request(Op.PUT, 1, tuple(keys), tuple(records))))
    assert daemon.committing.wait(REPLY_TIMEOUT_S)  # the writer holds the batch at the gate
    assert isinstance(small.call(Op.PING), PingReply)
    assert small.get([page_key(99)]) == [None]  # a read (by the reader thread) too
    bulk.sock.send_multipart(encode_request(Request(Op.PING, 2)))
    assert reply_id(bulk) == 2  # the bulk client's own PING overtakes its PUT
    assert bulk.sock.poll(0) == 0  # the PUT is not acknowledged before its commit
    daemon.gate.set()
    assert reply_id(bulk) == 1


def _nice_of(thread: threading.Thread) -> int:
    assert thread.native_id is not None
    return os.getpriority(os.PRIO_PROCESS, thread.native_id)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread priorities: Linux")
def test_the_writer_and_readers_run_below_the_socket_thread(daemon, clients) -> None:
    daemon.gate.set()
    client = clients()
    key = page_key(0)
    assert client.put([key], [page_record(key, 0)]) == (True,)  # the writer has run
    assert client.get([page_key(1)]) == [None]  # and the reader (a miss is read from the store)
    names = {thread.name: thread for thread in threading.enumerate()}
    socket_nice = _nice_of(daemon.serving)
    assert _nice_of(names["daemon-writer"]) == min(19, socket_nice + NICE)
    assert _nice_of(names["daemon-reader-0"]) == min(19, socket_nice + NICE)
