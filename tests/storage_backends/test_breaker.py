"""CircuitBreaker: opens after consecutive failures, probes after the cool-down, backs off."""

from __future__ import annotations

import threading

import pytest

from storage_backends.breaker import BreakerState, CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def breaker(clock: Clock, failures: int = 3) -> CircuitBreaker:
    return CircuitBreaker(failures, cooldown_s=1.0, max_cooldown_s=4.0, clock=clock)


def test_opens_after_consecutive_failures_only() -> None:
    clock = Clock()
    b = breaker(clock)
    b.record_failure()
    b.record_failure()
    b.record_success()  # a success in between resets the run
    b.record_failure()
    b.record_failure()
    assert b.allow() and b.state is BreakerState.CLOSED
    b.record_failure()
    assert b.state is BreakerState.OPEN and b.times_opened == 1
    assert not b.allow()


def test_evidence_of_a_dead_peer_opens_at_once() -> None:
    b = breaker(Clock(), failures=3)
    b.record_down()
    assert b.state is BreakerState.OPEN and b.times_opened == 1 and not b.allow()


def test_one_probe_after_cooldown_then_closes_on_success() -> None:
    clock = Clock()
    b = breaker(clock, failures=1)
    b.record_failure()
    clock.now += 0.99
    assert not b.allow()
    clock.now += 0.02
    assert b.allow()  # the probe
    assert b.state is BreakerState.HALF_OPEN
    assert not b.allow()  # everyone else still fails fast
    b.record_success()
    assert b.state is BreakerState.CLOSED and b.allow()


def test_failed_probes_double_the_cooldown_up_to_the_cap() -> None:
    clock = Clock()
    b = breaker(clock, failures=1)
    b.record_failure()
    waits = []
    for _ in range(4):
        start = clock.now
        while not b.allow():
            clock.now += 0.25
        waits.append(clock.now - start)
        b.record_failure()
    assert waits == [1.0, 2.0, 4.0, 4.0]
    assert b.times_opened == 1
    b.record_success()
    b.record_failure()
    clock.now += 1.0
    assert b.allow()  # the cool-down starts over after a success


def test_concurrent_callers_get_a_single_probe() -> None:
    clock = Clock()
    b = breaker(clock, failures=1)
    b.record_failure()
    clock.now += 2
    allowed: list[bool] = []
    threads = [threading.Thread(target=lambda: allowed.append(b.allow())) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(allowed) == [False] * 15 + [True]


@pytest.mark.parametrize(("failures", "cooldown", "cap"), [(0, 1.0, 1.0), (1, 0.0, 1.0), (1, 2, 1)])
def test_rejects_bad_settings(failures: int, cooldown: float, cap: float) -> None:
    with pytest.raises(ValueError):
        CircuitBreaker(failures, cooldown, cap)
