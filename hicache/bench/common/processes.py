"""Server subprocesses for benchmarks and tests: the cache daemon and the echo baseline.

A server binds an OS-picked loopback port and logs a banner line with its
endpoint; ``ServerProcess`` reads its output until then (bounded wait) and
afterwards drains it on a thread (into ``log_path`` when given), the caller
checks readiness with a reply (``wait_ping``), never a sleep, and ``stop()``
ends the process by PID: SIGTERM, then SIGKILL if it does not exit in time.
"""

from __future__ import annotations

import argparse
import logging
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from hicache.daemon.oneshot import DaemonCallError, call
from storage_backends.remote.protocol import Op, PingReply

logger = logging.getLogger(__name__)

DAEMON_BANNER = "hicache daemon listening on"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0


class ServerError(RuntimeError):
    """A server subprocess did not start, print its endpoint or answer in time."""


class ServerProcess:
    """One server subprocess; ``endpoint`` is what its banner line announced."""

    def __init__(
        self,
        argv: Sequence[str],
        banner: str,
        log_path: Path | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.argv = list(argv)
        self.proc = subprocess.Popen(
            self.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=cwd,
        )
        self._drain: threading.Thread | None = None
        self._head = b""  # output read while looking for the banner: the log starts with it
        try:
            self.endpoint = self._read_banner(banner)
        except BaseException:
            self.kill()
            raise
        self._drain = threading.Thread(target=self._copy_output, args=(log_path,), daemon=True)
        self._drain.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read_banner(self, banner: str) -> str:
        """The word after ``banner`` on the first output line that has it."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        buffered = b""
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if sel.select(timeout=max(deadline - time.monotonic(), 0)):
                    chunk = os.read(self.proc.stdout.fileno(), 4096)
                    if not chunk:
                        break  # the process closed its output: it died
                    self._head += chunk
                    buffered += chunk
                    *lines, buffered = buffered.split(b"\n")  # keep a partial last line
                    for line in lines:
                        _, found, rest = line.decode(errors="replace").partition(banner)
                        if found and rest.split():
                            return rest.split()[0]
        raise ServerError(f"{self.argv[:5]} logged no {banner!r} line (rc={self.proc.poll()})")

    def _copy_output(self, log_path: Path | None) -> None:
        """Keep reading the server's output so that it never blocks on a full pipe."""
        assert self.proc.stdout is not None
        with open(log_path or os.devnull, "ab", buffering=0) as log:  # readable while it runs
            log.write(self._head)
            while chunk := os.read(self.proc.stdout.fileno(), 1 << 16):
                log.write(chunk)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM, wait, SIGKILL as a last resort; return the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                logger.warning("server %d ignored SIGTERM; killing it", self.pid)
                self.kill()
        return self._finish()

    def kill(self) -> int:
        """SIGKILL (``kill -9``) and reap; return the exit code."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(STOP_TIMEOUT_S)
        return self._finish()

    def _finish(self) -> int:
        if self._drain is not None:
            self._drain.join(STOP_TIMEOUT_S)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return int(self.proc.returncode)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(
        self, exc: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def wait_ping(endpoint: str, client_key: str | None = None, server_key: str | None = None) -> str:
    """PING the daemon at ``endpoint`` (with CURVE key files when given) until it answers,
    for at most ``START_TIMEOUT_S``; return its version string. ServerError otherwise."""
    deadline = time.monotonic() + START_TIMEOUT_S
    last: DaemonCallError | None = None
    while time.monotonic() < deadline:
        try:
            reply = call(endpoint, Op.PING, 0.5, server_key, client_key)
        except DaemonCallError as exc:  # not up yet: ask again until the deadline
            last = exc
            continue
        assert isinstance(reply, PingReply)
        return reply.server
    raise ServerError(f"no PING reply from {endpoint} within {START_TIMEOUT_S} s (last: {last})")


def start_daemon(
    config: Path | str,
    store: Path,
    endpoint: str = "tcp://127.0.0.1:0",
    log_path: Path | None = None,
    keys: tuple[str, str] | None = None,
    extra: Sequence[str] = (),
    profile: Path | None = None,
) -> ServerProcess:
    """The daemon (``config``: a TOML path, or a shipped config's name) at ``endpoint`` (default: an
    OS-picked loopback port) over the store at ``store``, metrics off, with ``extra`` flags of
    ``hicache serve``; returned once it answers a PING (sent with ``keys`` = (client key file,
    server key file) under CURVE). With ``profile``, it runs under
    ``hicache.bench.daemon.profiler``, which writes its cProfile figures there on exit."""
    runner = (
        ["hicache.daemon"] if profile is None else ["hicache.bench.daemon.profiler", str(profile)]
    )
    argv = [sys.executable, "-m", *runner, "serve", "--config", str(config)]
    argv += ["--endpoint", endpoint, "--store", str(store), "--metrics-port", "-1", *extra]
    server = ServerProcess(argv, DAEMON_BANNER, log_path)
    try:
        wait_ping(server.endpoint, *(keys or (None, None)))
    except BaseException:
        server.kill()
        raise
    return server


def daemon_setting(text: str) -> str:
    """``SECTION.KEY=VALUE`` as ``hicache serve --set`` takes it (an argparse type)."""
    name, eq, _ = text.partition("=")
    if not eq or "." not in name.strip(".") or " " in name:
        raise argparse.ArgumentTypeError(f"expected SECTION.KEY=VALUE, got {text!r}")
    return text


def add_daemon_set_flag(parser: argparse.ArgumentParser, help_text: str) -> None:
    """The repeatable ``--daemon-set SECTION.KEY=VALUE`` flag of the engine benches."""
    parser.add_argument(
        "--daemon-set",
        action="append",
        default=[],
        type=daemon_setting,
        metavar="SECTION.KEY=VALUE",
        help=help_text,
    )


def serve_sets(settings: Sequence[str]) -> list[str]:
    """``hicache serve`` flags for ``settings`` (each ``SECTION.KEY=VALUE``)."""
    return [arg for setting in settings for arg in ("--set", setting)]


def start_echo(endpoint: str = "tcp://127.0.0.1:*") -> ServerProcess:
    """The plain ROUTER echo (``hicache.bench.common.zmq_echo``) at ``endpoint``; it answers
    once bound."""
    from hicache.bench.common.zmq_echo import BANNER

    return ServerProcess([sys.executable, "-m", "hicache.bench.common.zmq_echo", endpoint], BANNER)


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) process ``pid`` has used; 0.0 where
    ``/proc`` cannot tell."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
