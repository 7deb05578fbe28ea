"""What ``FailureLog`` (hicache/integrations/common.py) promises.

- every failure is counted by kind, logged or not; ``total`` is their sum; ``counts``
  is a copy; counting is exact under threads;
- the first failure of each kind is logged with its traceback; later ones of that kind
  are held back until ``interval_s`` has passed since its last line, and then one line
  says how many came since that line and what the latest was;
- ``call`` returns ``fn()``, or the fallback after counting an ``Exception``; anything
  that is not an ``Exception`` (KeyboardInterrupt, SystemExit) goes through uncounted.

Time is a fake clock (the limiter reads ``time.monotonic``), so no test waits or
depends on how fast the machine is.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections import Counter
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import storage_backends.log_limit
from hicache.integrations.common import FailureLog

INTERVAL = 10.0
KINDS = ("get failed", "put failed", "exists failed")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class Lines(logging.Handler):
    """Keeps (message, whether it carries a traceback) of each record."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[str, bool]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.getMessage(), record.exc_info is not None))


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(storage_backends.log_limit, "time", fake)
    return fake


@pytest.fixture
def lines() -> Iterator[Lines]:
    handler = Lines()
    logger = logging.getLogger("test.failure_log")
    logger.addHandler(handler)
    logger.propagate = False
    yield handler
    logger.removeHandler(handler)
    logger.propagate = True


def fresh_log(handler: Lines) -> FailureLog:
    handler.lines.clear()
    return FailureLog(logging.getLogger("test.failure_log"), INTERVAL)


def expected_lines(events: list[tuple[int, float]]) -> list[tuple[str, bool]]:
    """The lines the promise allows for failures (kind index, clock advance before it)."""
    last: dict[str, tuple[float, int]] = {}  # kind -> (time of its last line, held back)
    now = 0.0
    out: list[tuple[str, bool]] = []
    for n, (kind_i, advance) in enumerate(events):
        now += advance
        kind = KINDS[kind_i]
        if kind not in last:
            last[kind] = (now, 0)
            out.append((kind, True))
        elif now - last[kind][0] < INTERVAL:
            last[kind] = (last[kind][0], last[kind][1] + 1)
        else:
            held = last[kind][1] + 1
            out.append((f"{kind} ({held} more since the last report): failure {n}", False))
            last[kind] = (now, 0)
    return out


events_st = st.lists(
    st.tuples(st.integers(0, len(KINDS) - 1), st.sampled_from([0.0, 1.0, 4.0, 9.5, 10.0, 25.0])),
    max_size=40,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(events=events_st)
def test_every_failure_is_counted_and_the_log_is_rate_limited_per_kind(
    clock: Clock, lines: Lines, events: list[tuple[int, float]]
) -> None:
    log = fresh_log(lines)
    for n, (kind_i, advance) in enumerate(events):
        clock.now += advance
        log.failure(KINDS[kind_i], RuntimeError(f"failure {n}"))
    assert lines.lines == expected_lines(events)
    assert log.counts() == dict(Counter(KINDS[k] for k, _ in events))
    assert log.total() == len(events)


def test_call_returns_the_result_or_counts_and_falls_back(clock: Clock, lines: Lines) -> None:
    log = fresh_log(lines)

    def boom() -> list[bool]:
        raise OSError("store down")

    assert log.call("get failed", lambda: [True], [False]) == [True]
    assert log.counts() == {} and log.total() == 0 and lines.lines == []
    assert log.call("get failed", boom, [False]) == [False]
    assert log.counts() == {"get failed": 1}
    assert lines.lines == [("get failed", True)]


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(3)])
def test_call_lets_what_is_not_an_exception_through_uncounted(
    clock: Clock, lines: Lines, exc: BaseException
) -> None:
    log = fresh_log(lines)

    def stop() -> int:
        raise exc

    with pytest.raises(type(exc)):
        log.call("get failed", stop, 0)
    assert log.total() == 0 and lines.lines == []


def test_counts_is_a_copy(clock: Clock, lines: Lines) -> None:
    log = fresh_log(lines)
    log.failure("get failed", RuntimeError("x"))
    snapshot = log.counts()
    snapshot["get failed"] = 99
    snapshot["other"] = 1
    assert log.counts() == {"get failed": 1}


def test_counting_is_exact_under_threads(clock: Clock, lines: Lines) -> None:
    log = fresh_log(lines)
    threads, each = 8, 500
    start = threading.Barrier(threads)

    def work(i: int) -> None:
        start.wait(10)
        for _ in range(each):
            log.failure(KINDS[i % 2], RuntimeError("x"))

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    # Switch threads as often as possible, so that an unlocked count loses updates.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for t in workers:
            t.start()
        for t in workers:
            t.join(30)
    finally:
        sys.setswitchinterval(interval)
    assert log.counts() == {KINDS[0]: threads // 2 * each, KINDS[1]: threads // 2 * each}
    assert log.total() == threads * each
    # One traceback per kind; the clock never moved, so nothing else.
    assert sorted(lines.lines) == sorted([(KINDS[0], True), (KINDS[1], True)])
