"""TierJobRunner (the vLLM tier's I/O workers) against its docstring's promises:

- every submitted job comes back from ``finished`` exactly once, with its own id, kind
  and outcome (None when it raised: counted in the FailureLog, the worker lives on);
- queued loads run before queued stores;
- ``busy`` is true while a job is queued, running, or finished and not collected;
  ``wait_idle`` returns once nothing is queued or running;
- ``shutdown`` fails the queued jobs, lets the running one finish, and later
  ``submit``s fail at once.

Jobs block on events the test sets, so every ordering here is forced, none is raced.
"""

from __future__ import annotations

import logging
import threading

import pytest

from hicache.integrations.common import FailureLog
from hicache.integrations.vllm_jobs import FinishedJob, JobOutcome, TierJobRunner
from tests.polling import wait_until

WAIT_S = 10.0


class Gate:
    """A job body that records when it started and waits for ``open``."""

    def __init__(self, ran: list[int], job_id: int, fail: bool = False) -> None:
        self.ran, self.job_id, self.fail = ran, job_id, fail
        self.started, self.release = threading.Event(), threading.Event()

    def __call__(self) -> JobOutcome:
        self.ran.append(self.job_id)
        self.started.set()
        assert self.release.wait(WAIT_S)
        if self.fail:
            raise OSError(f"job {self.job_id} failed")
        return JobOutcome((True,) * self.job_id, 10 * self.job_id)


def _collect(runner: TierJobRunner, count: int) -> list[FinishedJob]:
    """``count`` finished records (a bounded wait), in the order ``finished`` gave them."""
    done: list[FinishedJob] = []

    def enough() -> bool:
        done.extend(runner.finished())
        return len(done) >= count

    assert wait_until(enough, WAIT_S), f"only {len(done)} of {count} jobs came back"
    return done


@pytest.fixture
def runner_and_log():
    log = FailureLog(logging.getLogger("test-vllm-jobs"))
    runner = TierJobRunner(1, log, name="test-jobs")
    yield runner, log
    runner.shutdown(WAIT_S)


def test_loads_go_before_queued_stores_and_each_job_returns_once(runner_and_log) -> None:
    runner, log = runner_and_log
    ran: list[int] = []
    first = Gate(ran, 1)
    runner.submit(1, False, first)  # a store holds the only worker
    assert first.started.wait(WAIT_S)
    gates = {i: Gate(ran, i, fail=i == 4) for i in range(2, 7)}
    for i, gate in gates.items():
        runner.submit(i, i % 2 == 0, gate)  # loads: 2, 4, 6; stores: 3, 5
        gate.release.set()
    assert runner.busy()
    first.release.set()
    runner.wait_idle()
    assert ran == [1, 2, 4, 6, 3, 5]  # the queued loads first, each kind in order
    done = _collect(runner, 6)
    assert sorted(d.job_id for d in done) == [1, 2, 3, 4, 5, 6]  # each once
    assert [d.job_id for d in done] == ran  # in completion order
    for record in done:
        assert record.is_load == (record.job_id % 2 == 0)
        if record.job_id == 4:
            assert record.outcome is None
        else:
            assert record.outcome == JobOutcome((True,) * record.job_id, 10 * record.job_id)
    assert log.total() == 1
    assert not runner.busy() and runner.finished() == []


def test_a_job_that_raises_leaves_the_worker_alive(runner_and_log) -> None:
    runner, log = runner_and_log
    ran: list[int] = []
    for job_id, fail in ((1, True), (2, False)):
        gate = Gate(ran, job_id, fail)
        gate.release.set()
        runner.submit(job_id, True, gate)
    runner.wait_idle()
    outcomes = {d.job_id: d.outcome for d in _collect(runner, 2)}
    assert outcomes == {1: None, 2: JobOutcome((True, True), 20)} and log.total() == 1


def test_busy_until_collected(runner_and_log) -> None:
    runner, _ = runner_and_log
    gate = Gate([], 1)
    gate.release.set()
    runner.submit(1, True, gate)
    runner.wait_idle()
    assert runner.busy()  # finished, not yet collected
    assert [d.job_id for d in _collect(runner, 1)] == [1]
    assert not runner.busy()


def test_shutdown_fails_queued_jobs_and_later_submits(runner_and_log) -> None:
    runner, _ = runner_and_log
    ran: list[int] = []
    running = Gate(ran, 1)
    runner.submit(1, True, running)
    assert running.started.wait(WAIT_S)
    queued = [Gate(ran, i) for i in (2, 3)]
    runner.submit(2, True, queued[0])
    runner.submit(3, False, queued[1])
    stopper = threading.Thread(target=runner.shutdown, args=(WAIT_S,))
    stopper.start()
    failed_first = _collect(runner, 2)  # the queued two, failed before the running one ends
    assert sorted((d.job_id, d.outcome) for d in failed_first) == [(2, None), (3, None)]
    running.release.set()
    stopper.join(WAIT_S)
    assert not stopper.is_alive()
    (last,) = _collect(runner, 1)
    assert (last.job_id, last.outcome) == (1, JobOutcome((True,), 10))  # it finished
    runner.submit(4, True, Gate(ran, 4))
    (late,) = runner.finished()
    assert (late.job_id, late.is_load, late.outcome) == (4, True, None)
    assert ran == [1]  # neither the queued jobs nor the late one ran


def test_no_workers_is_refused() -> None:
    with pytest.raises(ValueError, match="workers"):
        TierJobRunner(0, FailureLog(logging.getLogger("test-vllm-jobs")))
