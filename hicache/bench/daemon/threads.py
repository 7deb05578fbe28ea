"""Where a server's CPU goes, thread by thread: the daemon with its threads named.

``python -m hicache.bench.daemon.threads ARGS...`` runs ``hicache.daemon``'s
command line with each Python thread's OS name set to its ``threading`` name
(Linux; ``prctl``), so that ``/proc/PID/task/*/stat`` tells the socket thread,
the writer, the readers and the store's I/O pool apart (ZeroMQ names its own
I/O threads ``ZMQbg/IO/N``). Only the benches start the daemon this way
(``hicache bench daemon``); the daemon itself carries no such code.
``thread_cpu`` reads any process's threads' CPU seconds by group.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

_PR_SET_NAME = 15
_NAME_BYTES = 15  # the kernel keeps 15 bytes of a thread's name
# Thread names (as the kernel keeps them) -> the group they count in.
_GROUPS = (
    (re.compile(r"ZMQbg/IO/\d+"), "zmq-io"),
    (re.compile(r"ZMQbg/.*"), "zmq-other"),
    (re.compile(r"daemon-writer.*"), "writer"),
    (re.compile(r"daemon-reader.*"), "readers"),
    (re.compile(r"disk-io.*"), "disk-io"),
)
MAIN = "main"  # the process's first thread: the daemon's socket thread, the echo's loop


def label_this_thread(name: str | None = None) -> None:
    """Set the calling thread's OS name (default: its ``threading`` name); Linux only,
    silently nothing elsewhere."""
    if not sys.platform.startswith("linux"):
        return
    text = (name or threading.current_thread().name)[:_NAME_BYTES].encode()
    try:
        ctypes.CDLL(None).prctl(_PR_SET_NAME, ctypes.c_char_p(text), 0, 0, 0)
    except (OSError, AttributeError):
        return


def _label_new_thread(_frame: FrameType, _event: str, _arg: object) -> None:
    # threading calls this hook once in each new thread: name it, then stop hooking it.
    sys.setprofile(None)
    label_this_thread()


def group(name: str, pid: int, tid: int) -> str:
    """The group a thread of ``pid`` named ``name`` counts in (its first thread: ``MAIN``)."""
    if tid == pid:
        return MAIN
    for pattern, label in _GROUPS:
        if pattern.fullmatch(name):
            return label
    return "other"


def _cpu_s(task: Path, stat: str) -> float:
    """A thread's CPU seconds: the scheduler's nanosecond count where the kernel keeps
    it (``schedstat``), else user + system time in clock ticks (10 ms steps)."""
    try:
        return int((task / "schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        fields = stat.rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> Mapping[str, float]:
    """CPU seconds the threads of process ``pid`` used so far, summed by ``group``; empty
    where ``/proc`` cannot tell (threads that ended are not counted)."""
    out: dict[str, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        task = Path(f"/proc/{pid}/task/{tid}")
        try:
            stat = (task / "stat").read_text()
            cpu = _cpu_s(task, stat)
        except OSError:
            continue  # ended meanwhile
        key = group(stat[stat.index("(") + 1 : stat.rindex(")")], pid, int(tid))
        out[key] = out.get(key, 0.0) + cpu
    return out


def main(argv: list[str]) -> int:
    from hicache.daemon.cli import main as daemon_main

    threading.setprofile(_label_new_thread)  # type: ignore[arg-type]
    return daemon_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
