"""Owner-side delivery of completions: exactly once, optionally held and shuffled."""

from __future__ import annotations

import queue
import random
import time

from transfer.base import Completion, TransferError
from transfer.faults import FaultInjection


class CompletionMailbox:
    """Collects completions from workers and hands each to the owner exactly once.

    ``put`` is thread-safe (workers call it); every other method belongs to
    the owner thread. Holding and reordering come from a FaultInjection and
    exist for tests only. Raises TransferError on timeouts and on ``release``
    without holding.
    """

    def __init__(self, faults: FaultInjection | None = None) -> None:
        self._inbox: queue.SimpleQueue[Completion] = queue.SimpleQueue()
        self._hold = faults is not None and faults.hold
        self._reorder = faults is not None and faults.reorder
        self._rng = random.Random(faults.seed if faults is not None else 0)
        self._held: list[Completion] = []
        self._ready: list[Completion] = []

    def put(self, completion: Completion) -> None:
        self._inbox.put(completion)

    def poll(self) -> list[Completion]:
        self._drain()
        out, self._ready = self._ready, []
        if self._reorder:
            self._rng.shuffle(out)
        return out

    def take(self, op_id: int, timeout: float | None) -> Completion:
        """Block until ``op_id``'s completion arrives; remove it from every list."""
        for pile in (self._ready, self._held):
            for i, c in enumerate(pile):
                if c.op_id == op_id:
                    return pile.pop(i)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            got = self._get(deadline)
            if got is None:
                raise TransferError(f"timed out waiting for op {op_id}")
            if got.op_id == op_id:
                return got
            self._route(got)

    def release(self, n: int | None, timeout: float | None) -> int:
        """Let up to ``n`` held completions (all, if None) through to ``poll``.

        With a ``timeout``, first waits up to that long until ``n`` are held.
        Returns how many were released.
        """
        if not self._hold:
            raise TransferError("release() needs FaultInjection(hold=True)")
        self._drain()
        if n is not None and timeout is not None:
            deadline = time.monotonic() + timeout
            while len(self._held) < n:
                c = self._get(deadline)
                if c is None:
                    break
                self._route(c)
        count = len(self._held) if n is None else min(n, len(self._held))
        if self._reorder:
            picks = set(self._rng.sample(range(len(self._held)), count))
        else:
            picks = set(range(count))
        self._ready.extend(c for i, c in enumerate(self._held) if i in picks)
        self._held = [c for i, c in enumerate(self._held) if i not in picks]
        return count

    def _get(self, deadline: float | None) -> Completion | None:
        """The next arrival, or None once ``deadline`` (monotonic) has passed."""
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            return self._inbox.get(timeout=remaining)
        except queue.Empty:
            return None

    def _drain(self) -> None:
        while True:
            try:
                c = self._inbox.get_nowait()
            except queue.Empty:
                return
            self._route(c)

    def _route(self, c: Completion) -> None:
        (self._held if self._hold else self._ready).append(c)
