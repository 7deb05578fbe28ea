"""lower_this_thread: only the calling thread's priority changes, by the amount asked."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from hicache.daemon.thread_priority import MAX_NICE, lower_this_thread

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux threads")


def _in_thread(nice: int) -> tuple[bool, int]:
    """What lower_this_thread(nice) returned in a new thread, and that thread's nice after."""
    out: list[tuple[bool, int]] = []

    def run() -> None:
        lowered = lower_this_thread(nice)
        out.append((lowered, os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)
    return out[0]


@linux_only
def test_only_the_calling_thread_is_lowered() -> None:
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    lowered, theirs = _in_thread(3)
    assert lowered
    assert theirs == min(MAX_NICE, mine + 3)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine


@linux_only
def test_zero_leaves_the_thread_as_it_is() -> None:
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert _in_thread(0) == (False, mine)


@pytest.mark.parametrize("nice", [-1, MAX_NICE + 1])
def test_out_of_range_is_refused(nice: int) -> None:
    with pytest.raises(ValueError, match="nice"):
        lower_this_thread(nice)
