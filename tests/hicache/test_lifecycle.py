"""Lifecycle: releases run once, newest first, on release(), collection or exit."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

import pytest

from hicache.lifecycle import Lifecycle


class Owner:
    pass


def test_release_runs_once_newest_first() -> None:
    owner, calls = Owner(), []
    life = Lifecycle(owner)
    life.started(lambda: calls.append("a"))
    life.started(lambda: calls.append("b"))
    life.release()
    life.release()
    assert calls == ["b", "a"] and life.released
    with pytest.raises(RuntimeError):
        life.started(lambda: None)


def test_a_failing_release_does_not_stop_the_others() -> None:
    calls: list[str] = []

    def boom() -> None:
        raise OSError("socket already gone")

    owner = Owner()
    life = Lifecycle(owner)
    life.started(lambda: calls.append("first"))
    life.started(boom)
    life.release()
    assert calls == ["first"]


def test_garbage_collection_releases() -> None:
    calls: list[str] = []
    owner = Owner()
    Lifecycle(owner).started(lambda: calls.append("done"))
    del owner
    gc.collect()
    assert calls == ["done"]


def test_interpreter_exit_releases_before_daemon_threads_are_killed() -> None:
    script = textwrap.dedent(
        """
        import threading, time
        from hicache.lifecycle import Lifecycle
        class Owner: pass
        owner, stop = Owner(), threading.Event()
        worker = threading.Thread(target=stop.wait, daemon=True)
        worker.start()
        def release():
            stop.set()
            worker.join(5)
            print("released", worker.is_alive(), flush=True)
        Lifecycle(owner).started(release)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.strip() == "released False"
