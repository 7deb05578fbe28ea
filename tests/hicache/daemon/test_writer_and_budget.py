"""The daemon's writer thread and its reply budget, in process, against what they promise.

Writer: jobs are applied in arrival order; every job gets exactly one ``WriteDone`` with
its own slice of the batch's results and its token untouched; PUTs waiting together
are committed together, but only with PUTs into the same store (tenant); a failing
batch becomes error completions, is counted, and the thread carries on; ``notify``
follows each batch; ``close`` finishes every submitted job first.

ReplyBudget: ``room`` is the least of the peer's and the total's room; a reply leaves
the count once ZeroMQ released it (replies to a peer leave in order); a reply already
released when added is never counted; a reader claims bytes before its reply exists and
gives back what it does not send.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from hicache.daemon.replies import ReplyBudget
from hicache.daemon.writer import WriteJob, Writer
from storage_backends.page_format import encode_page
from storage_backends.remote.protocol import Frame, Op

WAIT_S = 10.0


class FakeStore:
    """A DaemonStore stand-in: per-tenant dicts, first page wins; records the calls; a
    gate holds the first call so that later jobs queue up behind it; keys starting with
    0xFF make a put raise."""

    def __init__(self) -> None:
        self.pages: dict[str | None, dict[bytes, Frame]] = {}
        self.calls: list[tuple[str, int, str | None]] = []  # (op, keys, tenant)
        self.gate = threading.Event()
        self.entered = threading.Event()

    def _wait(self) -> None:
        self.entered.set()
        assert self.gate.wait(WAIT_S)

    def put(
        self,
        keys: Sequence[bytes],
        records: Sequence[Frame],
        tenant: str | None,
        client_keys: Sequence[bytes] = (),
    ) -> list:
        self._wait()
        self.calls.append(("put", len(keys), tenant))
        if any(k[:1] == b"\xff" for k in keys):
            raise OSError("disk on fire")
        held = self.pages.setdefault(tenant, {})
        out = []
        for key, record in zip(keys, records, strict=True):
            out.append(key[:1] != b"\xfe")  # 0xFE: refused by the store
            if out[-1]:
                held.setdefault(key, record)
        return out

    def delete(self, keys: Sequence[bytes], tenant: str | None) -> int:
        self._wait()
        self.calls.append(("delete", len(keys), tenant))
        held = self.pages.setdefault(tenant, {})
        return sum(held.pop(k, None) is not None for k in set(keys))


def _key(first: int, i: int) -> bytes:
    return bytes([first]) + i.to_bytes(31, "little")


def _put(token: int, keys: list[bytes], tenant: str | None = None) -> WriteJob:
    return WriteJob(Op.PUT, tuple(keys), tuple(b"rec" + k for k in keys), token, tenant)


def _start() -> tuple[FakeStore, Writer, threading.Semaphore]:
    store, notified = FakeStore(), threading.Semaphore(0)
    return store, Writer(store, notified.release), notified  # type: ignore[arg-type]


def test_jobs_waiting_together_commit_together_per_store_in_order() -> None:
    store, writer, notified = _start()
    writer.submit(_put(0, [_key(1, 0)]))
    assert store.entered.wait(WAIT_S)  # the first job holds the writer in the store
    jobs = [
        _put(1, [_key(1, 1), _key(1, 2)]),
        _put(2, [_key(0xFE, 3)]),  # refused by the store: its own result only
        _put(3, [_key(1, 4)], tenant="t"),  # another store: its own commit
        _put(4, [_key(1, 5)], tenant="t"),
        WriteJob(Op.DELETE, (_key(1, 1), _key(1, 9)), (), 5),
        _put(6, [_key(1, 1), _key(1, 6)]),  # after the delete: stored again
    ]
    for job in jobs:
        writer.submit(job)
    store.gate.set()
    assert writer.close(WAIT_S)
    done = writer.take_done()
    assert [d.job.token for d in done] == list(range(7))  # one each, in arrival order
    assert [d.stored for d in done if d.job.op is Op.PUT] == [
        (True,),
        (True, True),
        (False,),
        (True,),
        (True,),
        (True, True),
    ]
    assert done[5].deleted == 1 and all(d.error == "" for d in done)
    assert store.calls == [
        ("put", 1, None),
        ("put", 3, None),  # jobs 1 and 2: one commit
        ("put", 2, "t"),  # jobs 3 and 4
        ("delete", 2, None),
        ("put", 2, None),
    ]
    stats = writer.stats()
    assert (stats.commits, stats.committed_requests, stats.failures) == (4, 6, 0)
    assert set(store.pages[None]) == {_key(1, i) for i in (0, 1, 2, 6)}
    assert notified.acquire(timeout=0)  # after each batch
    assert writer.take_done() == []


def test_a_failing_batch_becomes_errors_and_the_writer_carries_on() -> None:
    store, writer, notified = _start()
    store.gate.set()
    writer.submit(_put(1, [_key(0xFF, 0)]))
    assert notified.acquire(timeout=WAIT_S)
    (failed,) = writer.take_done()
    assert failed.job.token == 1 and "disk on fire" in failed.error and failed.stored == ()
    writer.submit(_put(2, [_key(1, 0)]))
    assert writer.close(WAIT_S)
    (ok,) = writer.take_done()
    assert (ok.job.token, ok.stored, ok.error) == (2, (True,), "")
    assert writer.stats().failures == 1 and writer.stats().commits == 1


def test_a_put_with_a_bad_record_stores_nothing_and_the_rest_of_its_batch_commits() -> None:
    store, writer, _ = _start()
    writer.submit(_put(0, [_key(1, 0)]))
    assert store.entered.wait(WAIT_S)  # the next three wait together: one batch
    good = [_key(2, i) for i in range(3)]
    records = [encode_page(key, key * 3) for key in good]
    damaged = bytearray(records[1])
    damaged[8] ^= 1  # the header's key no longer matches (checksums are checked at reads)
    for token, pages in ((1, records[:1]), (2, [records[0], bytes(damaged)]), (3, records[2:])):
        keys = tuple(good[: len(pages)]) if token != 3 else tuple(good[2:])
        writer.submit(WriteJob(Op.PUT, keys, tuple(pages), token, None, keys))
    store.gate.set()
    assert writer.close(WAIT_S)
    done = {d.job.token: d for d in writer.take_done()}
    assert done[2].malformed and "page record 1" in done[2].error and done[2].stored == ()
    assert [(done[t].stored, done[t].malformed) for t in (1, 3)] == [((True,), False)] * 2
    assert store.calls[1:] == [("put", 2, None)]  # jobs 1 and 3, one commit
    assert set(store.pages[None]) == {_key(1, 0), good[0], good[2]}


def test_close_finishes_every_submitted_job_first() -> None:
    store, writer, _ = _start()
    writer.submit(_put(0, [_key(1, 0)]))
    assert store.entered.wait(WAIT_S)
    for token in range(1, 20):
        writer.submit(_put(token, [_key(1, token)], tenant=("a", "b")[token % 2]))
    closing = threading.Thread(target=writer.close, args=(WAIT_S,))
    closing.start()
    store.gate.set()
    closing.join(WAIT_S)
    assert [d.job.token for d in writer.take_done()] == list(range(20))


class FakeTracker:
    def __init__(self) -> None:
        self.done = False


PEERS = st.sampled_from([b"a", b"b", b"c"])


class BudgetModel(RuleBasedStateMachine):
    """ZeroMQ releases a peer's replies in order. The model keeps, per peer, the replies
    the budget may still count: ``room(peer)`` forgets that peer's released front,
    ``sweep`` every peer's; a reply released before ``add`` is never counted."""

    PER_PEER, TOTAL = 800, 1500

    def __init__(self) -> None:
        super().__init__()
        self.budget = ReplyBudget(self.PER_PEER, self.TOTAL)
        self.queues: dict[bytes, list[tuple[FakeTracker, int]]] = {}

    def _counted(self, peer: bytes | None = None) -> int:
        peers = [peer] if peer is not None else list(self.queues)
        return sum(n for p in peers for _, n in self.queues.get(p, []))

    def _forget(self, peer: bytes) -> None:
        queue = self.queues.get(peer, [])
        while queue and queue[0][0].done:
            queue.pop(0)

    def _room(self, peer: bytes) -> int:
        return min(self.PER_PEER - self._counted(peer), self.TOTAL - self._counted())

    @rule(peer=PEERS, nbytes=st.integers(0, 600), released=st.booleans())
    def add(self, peer: bytes, nbytes: int, released: bool) -> None:
        self._forget(peer)  # a claim first forgets the peer's released front
        fits = nbytes <= self._room(peer)
        assert self.budget.claim(peer, [nbytes]) == int(fits)  # a reader claims, then sends
        if not fits:
            return
        tracker = FakeTracker()
        tracker.done = released and all(t.done for t, _ in self.queues.get(peer, []))
        self.budget.add(peer, tracker, nbytes)  # type: ignore[arg-type]
        if not tracker.done:
            self.queues.setdefault(peer, []).append((tracker, nbytes))

    @rule(peer=PEERS, count=st.integers(1, 3))
    def release(self, peer: bytes, count: int) -> None:
        pending = [t for t, _ in self.queues.get(peer, []) if not t.done]
        for tracker in pending[:count]:  # in order, as ZeroMQ sends them
            tracker.done = True

    @rule(peer=PEERS)
    def room(self, peer: bytes) -> None:
        self._forget(peer)
        assert self.budget.room(peer) == self._room(peer)

    @rule(peer=PEERS, nbytes=st.integers(0, 600))
    def claim_and_give_back(self, peer: bytes, nbytes: int) -> None:
        """A reply sent without its pages (a miss, an error) gives its claim back."""
        self._forget(peer)
        claimed = nbytes * self.budget.claim(peer, [nbytes])
        assert self.budget.queued_bytes == self._counted() + claimed
        self.budget.unclaim(peer, claimed)

    @rule()
    def sweep(self) -> None:
        for peer in self.queues:
            self._forget(peer)
        self.budget.sweep()

    @invariant()
    def counts_exactly_what_is_not_forgotten(self) -> None:
        assert self.budget.queued_bytes == self._counted()


BudgetModel.TestCase.settings = settings(max_examples=50, stateful_step_count=20, deadline=None)
test_reply_budget_counts_what_zeromq_still_holds = BudgetModel.TestCase


@pytest.mark.parametrize("per_peer,total,want", [(100, 1000, 40), (1000, 100, 40)])
def test_room_is_the_tighter_bound(per_peer: int, total: int, want: int) -> None:
    budget = ReplyBudget(per_peer, total)
    assert budget.claim(b"p", [60]) == 1
    budget.add(b"p", FakeTracker(), 60)  # type: ignore[arg-type]
    assert budget.room(b"p") == want


def test_a_released_reply_gives_its_room_back_while_later_ones_wait() -> None:
    budget = ReplyBudget(1000, 10_000)
    first, second = FakeTracker(), FakeTracker()
    assert budget.claim(b"p", [300, 200]) == 2
    budget.add(b"p", first, 300)  # type: ignore[arg-type]
    budget.add(b"p", second, 200)  # type: ignore[arg-type]
    assert budget.room(b"p") == 500
    first.done = True
    assert budget.room(b"p") == 800 and budget.queued_bytes == 200
    second.done = True
    budget.sweep()
    assert budget.room(b"p") == 1000 and budget.queued_bytes == 0
