"""Shared-memory GET slots reused while a slow client is still copying out of them.

The daemon lends a GET slot, the reply goes out, and the client copies the record out
of the slab. If that client stays silent past the lease's expiry (a stalled thread),
the daemon reclaims its lease and lends the same bytes to another client's GET. The
client's check runs over its own copy, so a slot rewritten before or during the copy
is a miss, never a hit with other bytes; a slot rewritten after the copy is a hit
with what was copied. Real ``ShmPlane`` and ``ClientLease`` on one slab file; the
client's copy (``shm_lease.scatter``) is slowed down so that the reuse lands at a
chosen point, and a clock the test moves expires the lease.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from hicache.daemon.shm_plane import ShmPlane
from storage_backends.page_format import HEADER_BYTES, encode_page
from storage_backends.remote import shm_lease
from storage_backends.remote.protocol import ShmAttachReply, Span
from storage_backends.remote.shm_lease import ClientLease
from tests.hicache.daemon.shm_fake import EXPIRES_S, Clock

PAYLOAD = 3000
KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))


def client(plane: ShmPlane) -> tuple[int, ClientLease]:
    grant = plane.attach(0, 0)
    reply = ShmAttachReply(1, grant.lease, plane.path, plane.size, grant.put, EXPIRES_S)
    return grant.lease, ClientLease(reply, 0.0)


def get_through_slab(plane: ShmPlane, lease: int, record: bytes) -> Span:
    """A GET's record lent to ``lease``, as the daemon serves it (the request in flight
    while the record is copied in; the reply has gone out when this returns)."""
    plane.begin(lease)
    spans = plane.lend(lease, [record])
    plane.end(lease)
    assert spans is not None
    return spans[0]


# What the other client's GET puts in the reused slot: another key's page, or (another
# tenant's page under the same client key) the same key with other bytes.
REUSES = {
    "other key": encode_page(OTHER_KEY, b"\x22" * PAYLOAD),
    "same key, other bytes": encode_page(KEY, b"\x33" * PAYLOAD),
}


def reuse_by_another_client(plane: ShmPlane, clock: Clock, span: Span, record: bytes) -> None:
    """The first client stays silent past expiry: its lease is reclaimed and the same
    bytes of the slab are lent to another client's GET, which writes ``record`` there."""
    clock.now += EXPIRES_S
    assert plane.sweep() == 1
    lease, _ = client(plane)
    assert get_through_slab(plane, lease, record).offset == span.offset


Scatter = Callable[[memoryview, Sequence[memoryview]], None]


def slowed(real: Scatter, at: float, reuse: Callable[[], None]) -> Scatter:
    """``scatter`` that copies the first ``at`` of the page, then lets the slot be reused,
    then copies the rest (at 0: the reuse lands after the header read, before any byte)."""

    def copy(page: memoryview, runs: Sequence[memoryview]) -> None:
        cut = int(len(page) * at)
        flat: list[tuple[int, memoryview]] = []
        offset = 0
        for run in runs:
            flat.append((offset, run))
            offset += len(run)
        first = [(o, r[: max(0, min(len(r), cut - o))]) for o, r in flat]
        rest = [(o + len(f), r[len(f) :]) for (o, r), (_, f) in zip(flat, first, strict=True)]
        for o, part in first:
            part[:] = page[o : o + len(part)]
        reuse()
        for o, part in rest:
            part[:] = page[o : o + len(part)]

    return copy


@pytest.mark.parametrize("runs", [[PAYLOAD], [1000, PAYLOAD - 1000]], ids=["one run", "K and V"])
@pytest.mark.parametrize("at", [0.0, 0.25, 0.5, 0.9], ids=lambda at: f"reused at {at:.0%}")
@pytest.mark.parametrize("reuse", sorted(REUSES))
def test_a_slot_rewritten_before_or_during_the_copy_is_a_miss(
    plane: ShmPlane,
    clock: Clock,
    monkeypatch: pytest.MonkeyPatch,
    runs: list[int],
    at: float,
    reuse: str,
) -> None:
    lease, reader = client(plane)
    mine = encode_page(KEY, b"\x11" * PAYLOAD)
    span = get_through_slab(plane, lease, mine)
    rewrite = lambda: reuse_by_another_client(plane, clock, span, REUSES[reuse])  # noqa: E731
    monkeypatch.setattr(shm_lease, "scatter", slowed(shm_lease.scatter, at, rewrite))
    dst = [memoryview(bytearray(n)) for n in runs]
    assert not reader.read(span, KEY, dst), "a slot rewritten under the copy was a hit"


@pytest.mark.parametrize("reuse", sorted(REUSES))
def test_a_slot_rewritten_after_the_copy_is_a_hit_with_the_copied_bytes(
    plane: ShmPlane, clock: Clock, monkeypatch: pytest.MonkeyPatch, reuse: str
) -> None:
    """The check runs over the client's own copy, not over the slab."""
    lease, reader = client(plane)
    mine = encode_page(KEY, b"\x11" * PAYLOAD)
    span = get_through_slab(plane, lease, mine)
    rewrite = lambda: reuse_by_another_client(plane, clock, span, REUSES[reuse])  # noqa: E731
    monkeypatch.setattr(shm_lease, "scatter", slowed(shm_lease.scatter, 1.0, rewrite))
    dst = [memoryview(bytearray(1000)), memoryview(bytearray(PAYLOAD - 1000))]
    assert reader.read(span, KEY, dst)
    assert b"".join(dst) == mine[HEADER_BYTES:]
