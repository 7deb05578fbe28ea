"""Helpers of the local server launchers (tests, benchmarks): free ports, stopping by PID."""

from __future__ import annotations

import socket
import subprocess


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports the OS reports free on 127.0.0.1 (held open together).

    Another process may take one before the server binds it: launchers retry then.
    """
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def terminate(process: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout_s``; reaps the process. No-op if it has exited."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=timeout_s)
