"""FairQueue: round robin across peers, one item in service per peer, FIFO within a peer."""

from __future__ import annotations

from hicache.daemon.fair_queue import FairQueue


def test_a_backlog_does_not_hold_another_peers_item() -> None:
    queue: FairQueue[str] = FairQueue()
    for i in range(50):
        assert queue.push(b"bulk", f"bulk-{i}")
    assert queue.pop(0) == "bulk-0"
    queue.push(b"small", "small-0")  # came after the whole backlog
    assert queue.pop(0) == "small-0"  # the bulk peer is busy: the next consumer serves small
    queue.done(b"bulk")
    queue.done(b"small")
    assert queue.pop(0) == "bulk-1"


def test_turns_alternate_and_each_peer_keeps_its_order() -> None:
    queue: FairQueue[str] = FairQueue()
    for i in range(3):
        queue.push(b"a", f"a{i}")
    for i in range(2):
        queue.push(b"b", f"b{i}")
    order = []
    while (item := queue.pop(0)) is not None:
        order.append(item)
        queue.done(item[:1].encode())
    assert order == ["a0", "b0", "a1", "b1", "a2"]


def test_a_busy_peer_gets_nothing_until_done() -> None:
    queue: FairQueue[str] = FairQueue()
    queue.push(b"a", "a0")
    queue.push(b"a", "a1")
    assert queue.pop(0) == "a0"
    assert queue.pop(0) is None  # a1 waits for a0 to be done
    queue.done(b"a")
    assert queue.pop(0) == "a1"


def test_close_returns_what_was_queued_and_refuses_more() -> None:
    queue: FairQueue[str] = FairQueue()
    queue.push(b"a", "a0")
    queue.push(b"b", "b0")
    assert queue.pop(0) == "a0"
    assert queue.close() == ["b0"]
    assert not queue.push(b"a", "a1")
    assert queue.pop() is None and len(queue) == 0
