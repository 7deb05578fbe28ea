"""The shared-memory slab's allocator and leases (no daemon): a clock the test moves.

Leases are reclaimed after ``expires_s`` of silence with nothing in flight, never
while a request of theirs is; what they held comes back to the slab; a client's
read out of the slab is a miss whenever the slot does not hold the key's intact
record.
"""

from __future__ import annotations

import itertools
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hicache.daemon import shm_plane
from hicache.daemon.shm_extents import GRAIN, Extents
from hicache.daemon.shm_plane import ShmPlane, remove_stale, slab_path
from storage_backends.page_format import HEADER_BYTES, encode_page
from storage_backends.remote.protocol import ErrorCode, ProtocolError, ShmAttachReply, Span
from storage_backends.remote.shm_lease import ClientLease
from tests.hicache.daemon.shm_fake import EXPIRES_S, SIZE, Clock


def record(i: int, size: int = 1000) -> tuple[bytes, bytes]:
    key = i.to_bytes(32, "little")
    return key, encode_page(key, bytes([i % 256]) * size)


class ExtentsMachine(RuleBasedStateMachine):
    """Spans handed out never overlap; what came back is free again, merged."""

    def __init__(self) -> None:
        super().__init__()
        self.extents = Extents(SIZE)
        self.taken: list[Span] = []

    @rule(nbytes=st.integers(1, 20 * GRAIN))
    def take(self, nbytes: int) -> None:
        span = self.extents.take(nbytes)
        if span is not None:
            assert span.length >= nbytes and span.offset + span.length <= SIZE
            self.taken.append(span)

    @precondition(lambda self: self.taken)
    @rule(which=st.integers(0, 1000))
    def give_back(self, which: int) -> None:
        span = self.taken.pop(which % len(self.taken))
        self.extents.give_back(span)
        with pytest.raises(ValueError):
            self.extents.give_back(span)  # twice: refused, nothing changed

    @invariant()
    def spans_are_disjoint_and_counted(self) -> None:
        spans = sorted(self.taken)
        for a, b in itertools.pairwise(spans):
            assert a.offset + a.length <= b.offset
        assert self.extents.used == sum(s.length for s in spans)

    def teardown(self) -> None:
        for span in self.taken:
            self.extents.give_back(span)
        assert self.extents.take(SIZE) == Span(0, SIZE)  # one free run again


TestExtents = ExtentsMachine.TestCase
TestExtents.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_the_slab_is_a_private_file_replacing_a_stale_one(tmp_path: Path, clock: Clock) -> None:
    path = tmp_path / "slab"
    path.write_bytes(b"left by a crashed daemon")
    plane = ShmPlane(str(path), SIZE, EXPIRES_S, clock)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.stat().st_size == SIZE
    plane.close()
    assert not path.exists()


def test_slabs_that_killed_daemons_left_are_removed_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shm_plane, "_slab_dir", lambda: str(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    endpoint, uid = "ipc:///x.sock", os.getuid()
    digest = Path(slab_path(endpoint)).name.split("-")[3]  # hicache-slab-UID-DIGEST-PID
    removed = [
        f"hicache-slab-{uid}-{digest}-{os.getppid()}",  # this endpoint's: replaced
        f"hicache-slab-{uid}-{'0' * 16}-{gone.pid}",  # a killed daemon's
    ]
    kept = [
        f"hicache-slab-{uid}-{'0' * 16}-{os.getpid()}",  # a live daemon's
        f"hicache-slab-{uid + 1}-{'0' * 16}-{gone.pid}",  # another user's
        "notes.txt",
    ]
    for name in removed + kept:
        (tmp_path / name).write_bytes(b"")
    assert remove_stale(endpoint) == 2
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(kept)


def test_a_silent_lease_is_reclaimed_with_everything_lent_to_it(plane: ShmPlane, clock) -> None:
    grant = plane.attach(0, 8 * GRAIN)
    assert grant.put.length == 8 * GRAIN
    assert plane.lend(grant.lease, [record(1)[1], record(2)[1]]) is not None
    assert plane.stats().lent_bytes == 10 * GRAIN
    clock.now += EXPIRES_S - 0.01
    assert plane.sweep() == 0
    clock.now += 0.01
    assert plane.sweep() == 1
    assert plane.stats() == (0, 0, SIZE)
    with pytest.raises(ProtocolError) as err:
        plane.touch(grant.lease)
    assert err.value.code is ErrorCode.NO_LEASE
    assert plane.attach(grant.lease, 0).lease != grant.lease  # a new lease, not the old one


def test_a_lease_with_a_request_in_flight_is_never_reclaimed(plane: ShmPlane, clock) -> None:
    grant = plane.attach(0, GRAIN)
    plane.lend(grant.lease, [record(1)[1]])
    plane.begin(grant.lease)  # a long request: no message for many intervals
    clock.now += 100 * EXPIRES_S
    assert plane.sweep() == 0 and plane.stats().lent_bytes == 2 * GRAIN
    plane.end(grant.lease)  # its reply went out: silence counts from here
    clock.now += EXPIRES_S / 2
    assert plane.sweep() == 0
    plane.touch(grant.lease)  # any request is a heartbeat
    clock.now += EXPIRES_S * 0.9
    assert plane.sweep() == 0 and plane.attach(grant.lease, 0) == grant  # renewed, same area
    clock.now += EXPIRES_S
    assert plane.sweep() == 1 and plane.stats().lent_bytes == 0


def test_freed_and_detached_slots_come_back(plane: ShmPlane) -> None:
    grant = plane.attach(0, 0)
    assert grant.put.length == 0
    spans = plane.lend(grant.lease, [record(1)[1], record(2)[1]])
    assert spans is not None
    plane.free(grant.lease, [spans[0], Span(12345, 1)])  # an unknown span is ignored
    assert plane.stats().lent_bytes == GRAIN
    plane.free(grant.lease, spans)  # the first again: ignored
    assert plane.stats().lent_bytes == 0
    plane.lend(grant.lease, [record(3)[1]])
    plane.begin(grant.lease)
    plane.detach(grant.lease)
    assert plane.stats().leases == 1  # a request in flight: it goes once that is answered
    assert plane.lend(grant.lease, [record(4)[1]]) is None  # but lends nothing more
    plane.end(grant.lease)
    plane.sweep()
    assert plane.stats() == (0, 0, SIZE)


def test_a_full_slab_or_share_lends_nothing(plane: ShmPlane) -> None:
    one, other, _ = (plane.attach(0, SIZE // 4) for _ in range(3))
    big = encode_page(b"k" * 32, b"x" * (SIZE // 4 - 100))
    assert plane.lend(one.lease, [big, big]) is None  # over one lease's quarter
    assert plane.lend(one.lease, [big]) is not None
    assert plane.lend(other.lease, [record(1)[1]]) is None  # full: three areas and that slot
    assert plane.stats().lent_bytes == SIZE  # nothing taken by the refusals


def test_put_records_must_lie_in_the_leases_area(plane: ShmPlane) -> None:
    grant = plane.attach(0, 2 * GRAIN)
    area = grant.put
    inside = plane.put_records(grant.lease, [Span(area.offset, 100), Span(area.offset + 100, 50)])
    assert [len(view) for view in inside] == [100, 50]
    with pytest.raises(ProtocolError) as err:
        plane.put_records(grant.lease, [Span(area.offset + area.length - 10, 11)])
    assert err.value.code is ErrorCode.BAD_FRAMES
    with pytest.raises(ProtocolError) as err:
        plane.put_records(grant.lease + 1, [])
    assert err.value.code is ErrorCode.NO_LEASE


def test_a_client_reads_only_the_keys_intact_record(plane: ShmPlane) -> None:
    grant = plane.attach(0, 4 * GRAIN)
    reply = ShmAttachReply(1, grant.lease, plane.path, plane.size, grant.put, EXPIRES_S)
    lease = ClientLease(reply, 0.0)
    (key, rec), (_, other_rec) = record(7), record(8)
    spans = plane.lend(grant.lease, [rec, other_rec])
    assert spans is not None
    dst = memoryview(bytearray(1000))
    assert lease.read(spans[0], key, [dst]) and bytes(dst) == rec[HEADER_BYTES:]
    halves = [memoryview(bytearray(400)), memoryview(bytearray(600))]
    assert lease.read(spans[0], key, halves) and b"".join(halves) == rec[HEADER_BYTES:]
    assert not lease.read(spans[1], key, [dst])  # the slot now holds another key's record
    assert not lease.read(spans[0], key, [memoryview(bytearray(999))])  # not its length
    assert not lease.read(Span(plane.size - 10, 100), key, [dst])  # past the slab
    with open(plane.path, "r+b") as slab:  # a payload byte changed under the reader
        slab.seek(spans[0].offset + 500)
        slab.write(b"\xff")
    assert not lease.read(spans[0], key, [dst])


def test_put_records_written_by_a_client_are_what_the_daemon_reads(plane: ShmPlane) -> None:
    grant = plane.attach(0, 2 * GRAIN)
    reply = ShmAttachReply(1, grant.lease, plane.path, plane.size, grant.put, EXPIRES_S)
    lease = ClientLease(reply, 0.0)
    key, rec = record(3)
    payload = memoryview(rec[HEADER_BYTES:])
    spans = lease.encode([key, key], [payload, payload])
    assert len(spans) == 2
    assert [bytes(view) for view in plane.put_records(grant.lease, spans)] == [rec, rec]
    assert lease.encode([key] * 7, [payload] * 7) == ()  # past the area: nothing written
    lease.start()
    assert lease.encode([key], [payload])[0] == spans[0]  # a new batch reuses the area
    assert os.path.exists(plane.path)
