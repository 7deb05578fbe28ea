"""The shared-memory plane under a slab too small for its clients' replies (no daemon):
leases attach, lend, free, detach, expire and attach again, in any order.

A model keeps what each lease was lent (the spans ``lend`` returned, the bytes copied
there) and its put area. After every step: no two leases (or put areas) hold the same
slot, every lent slot still holds the bytes copied into it, and the slab's used bytes
are exactly what the leases hold. A sweep never raises, and reclaims exactly the
leases silent for ``expires_s`` (or detached) with nothing in flight.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)

from hicache.daemon.shm_extents import GRAIN
from hicache.daemon.shm_plane import ShmPlane
from storage_backends.remote.protocol import Span

SIZE = 24 * GRAIN  # a lease's share (a quarter) is 6 slots; three leases fill the slab
EXPIRES_S = 3.0


def _rounded(length: int) -> int:
    return -(-length // GRAIN) * GRAIN


@dataclasses.dataclass
class _Model:
    put: Span
    seen: float
    busy: int = 0
    detached: bool = False
    lent: dict[int, bytes] = dataclasses.field(default_factory=dict)  # offset -> bytes


class ShmPlaneMachine(RuleBasedStateMachine):
    leases = Bundle("leases")

    def __init__(self) -> None:
        super().__init__()
        self.now = 100.0
        self.fill = 0
        self.plane: ShmPlane | None = None
        self.model: dict[int, _Model] = {}

    @initialize(tmp=st.just(None))
    def open_plane(self, tmp: None) -> None:
        path = Path(f"/dev/shm/hicache-test-plane-{id(self)}")
        if not path.parent.is_dir():
            path = Path(f"/tmp/hicache-test-plane-{id(self)}")
        self.path = path
        self.plane = ShmPlane(str(path), SIZE, EXPIRES_S, lambda: self.now)

    def _plane(self) -> ShmPlane:
        assert self.plane is not None
        return self.plane

    @rule(target=leases, put_slots=st.integers(0, 8))
    def attach(self, put_slots: int) -> int:
        grant = self._plane().attach(0, put_slots * GRAIN)
        assert grant.lease not in self.model
        assert grant.put.length <= min(put_slots * GRAIN, SIZE // 4)
        self.model[grant.lease] = _Model(grant.put, self.now)
        return grant.lease

    @rule(lease=leases)
    def renew(self, lease: int) -> None:
        entry = self.model.get(lease)
        grant = self._plane().attach(lease, GRAIN)
        if entry is not None and not entry.detached:
            assert grant == (lease, entry.put)
            entry.seen = self.now
        else:  # reclaimed (or given up): a new lease, and its own put area
            assert grant.lease != lease and grant.lease not in self.model
            self.model[grant.lease] = _Model(grant.put, self.now)

    @rule(lease=leases, sizes=st.lists(st.integers(1, 3 * GRAIN), min_size=1, max_size=5))
    def lend(self, lease: int, sizes: list[int]) -> None:
        records = []
        for size in sizes:
            self.fill = (self.fill + 1) % 251
            records.append(bytes([self.fill + 1]) * size)
        entry = self.model.get(lease)
        spans = self._plane().lend(lease, records)
        if spans is None:
            return
        assert entry is not None and not entry.detached
        assert [span.length for span in spans] == sizes
        for span, record in zip(spans, records, strict=True):
            assert span.offset not in entry.lent
            entry.lent[span.offset] = record

    @rule(lease=leases, data=st.data())
    def free(self, lease: int, data: st.DataObject) -> None:
        entry = self.model.get(lease)
        mine = sorted(entry.lent) if entry is not None else []
        chosen = data.draw(st.lists(st.sampled_from(mine), unique=True)) if mine else []
        others = [o for m in self.model.values() if m is not entry for o in m.lent]
        stray = data.draw(st.lists(st.sampled_from(others), max_size=2)) if others else []
        spans = [Span(o, len(entry.lent[o])) for o in chosen if entry is not None]
        self._plane().free(lease, spans + [Span(o, GRAIN) for o in stray])  # strays: ignored
        if entry is not None:
            entry.seen = self.now
            for offset in chosen:
                del entry.lent[offset]

    @rule(lease=leases)
    def begin(self, lease: int) -> None:
        entry = self.model.get(lease)
        try:
            self._plane().begin(lease)
        except Exception:
            assert entry is None or entry.detached
            return
        assert entry is not None and not entry.detached
        entry.busy += 1
        entry.seen = self.now

    @precondition(lambda self: any(m.busy for m in self.model.values()))
    @rule(data=st.data())
    def end(self, data: st.DataObject) -> None:
        lease = data.draw(st.sampled_from([k for k, m in self.model.items() if m.busy]))
        self._plane().end(lease)
        self.model[lease].busy -= 1
        self.model[lease].seen = self.now

    @rule(lease=consumes(leases))
    def detach(self, lease: int) -> None:
        if lease in self.model:
            self.model[lease].detached = True
        self._plane().detach(lease)  # sweeps
        self._forget_reclaimed()

    @rule(seconds=st.sampled_from([0.5, 1.0, EXPIRES_S]))
    def sweep(self, seconds: float) -> None:
        self.now += seconds
        self._plane().sweep()
        self._forget_reclaimed()

    def _forget_reclaimed(self) -> None:
        for lease, m in list(self.model.items()):
            if m.busy <= 0 and (m.detached or self.now - m.seen >= EXPIRES_S):
                del self.model[lease]

    @invariant()
    def every_slot_is_held_once_and_counted(self) -> None:
        if self.plane is None:
            return
        self.plane.check()
        held = [m.put for m in self.model.values() if m.put.length]
        held += [Span(o, len(r)) for m in self.model.values() for o, r in m.lent.items()]
        held.sort()
        for a, b in itertools.pairwise(held):
            assert a.offset + _rounded(a.length) <= b.offset, (a, b)
        stats = self.plane.stats()
        assert stats.leases == len(self.model)
        assert stats.lent_bytes == sum(_rounded(span.length) for span in held)

    @invariant()
    def lent_slots_hold_what_was_copied_there(self) -> None:
        if self.plane is None:
            return
        with open(self.path, "rb") as slab:
            for m in self.model.values():
                for offset, record in m.lent.items():
                    slab.seek(offset)
                    assert slab.read(len(record)) == record

    def teardown(self) -> None:
        if self.plane is not None:
            self.plane.close()


TestShmPlane = ShmPlaneMachine.TestCase
TestShmPlane.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)
