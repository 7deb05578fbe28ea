"""Where a server's CPU goes by thread: names to groups, and this process's own threads."""

from __future__ import annotations

import os
import threading

from hicache.bench.daemon.threads import MAIN, group, label_this_thread, thread_cpu


def test_thread_names_map_to_their_groups() -> None:
    pid = 1000
    assert group("python", pid, pid) == MAIN  # the first thread, whatever its name
    assert group("ZMQbg/IO/0", pid, 1001) == group("ZMQbg/IO/1", pid, 1002) == "zmq-io"
    assert group("ZMQbg/Reaper", pid, 1003) == "zmq-other"
    assert group("daemon-writer", pid, 1004) == "writer"
    assert group("daemon-reader-3", pid, 1005) == "readers"
    assert group("disk-io_0", pid, 1006) == "disk-io"
    assert group("Thread-7", pid, 1007) == "other"


def test_a_labelled_thread_s_cpu_is_counted_in_its_group() -> None:
    spun, release = threading.Event(), threading.Event()

    def spin() -> None:
        label_this_thread("daemon-writer")
        total = 0
        for i in range(2_000_000):  # some CPU, bounded
            total += i
        spun.set()
        assert release.wait(30)  # alive while its CPU is read

    worker = threading.Thread(target=spin)
    worker.start()
    try:
        assert spun.wait(30)
        cpu = thread_cpu(os.getpid())
    finally:
        release.set()
        worker.join()
    assert cpu.get("writer", 0.0) > 0.0 and cpu.get(MAIN, 0.0) > 0.0
