"""LocalMooncake: a ``mooncake_master`` and a ``mooncake_client`` holder on 127.0.0.1.

For the tests of the optional ``mooncake`` backend. The holder lends its
memory (``segment_bytes``) to the store, so backend clients lend none. Leases
are ``lease_ms`` (Mooncake's default is 10 s). Ports
are picked by the OS; readiness is a reply: the master and the holder accept
connections, then a probe client stores and removes one object.
"""

from __future__ import annotations

import ctypes
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from storage_backends.local_process import free_ports, terminate

_POLL_S = 0.05


class MooncakeUnavailableError(RuntimeError):
    """mooncake does not import here, or its servers did not come up in time."""


def mooncake_binaries() -> Path:
    """The folder of the ``mooncake_master`` and ``mooncake_client`` binaries."""
    try:
        import mooncake.store
    except ImportError as exc:
        raise MooncakeUnavailableError(f"mooncake does not import: {exc}") from exc
    import mooncake

    folder = Path(mooncake.__file__).parent
    if not (folder / "mooncake_master").exists():
        raise MooncakeUnavailableError(f"no mooncake_master in {folder}")
    return folder


def _wait_port(port: int, process: subprocess.Popen[bytes], deadline: float) -> None:
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise MooncakeUnavailableError(f"{process.args!r} exited with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(_POLL_S)
    raise MooncakeUnavailableError(f"nothing listens on port {port} in time")


class LocalMooncake:
    """Master + holder; use as a context manager. Not thread-safe."""

    def __init__(
        self, segment_bytes: int = 256 << 20, lease_ms: int = 500, start_timeout_s: float = 60.0
    ) -> None:
        self._segment = segment_bytes
        self._lease_ms = lease_ms
        self._timeout = start_timeout_s
        self._dir = Path(tempfile.mkdtemp(prefix="hicache-mooncake-"))
        self._processes: list[subprocess.Popen[bytes]] = []
        self.rpc_port = 0

    def __enter__(self) -> LocalMooncake:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        return f"mooncake://127.0.0.1:{self.rpc_port}"

    def start(self) -> None:
        """Start both servers and wait until an object can be stored; MooncakeUnavailableError."""
        folder = mooncake_binaries()
        deadline = time.monotonic() + self._timeout
        try:
            self.rpc_port, metrics_port, holder_port = free_ports(3)
            master = self._spawn(
                folder / "mooncake_master",
                [f"--rpc_port={self.rpc_port}", "--rpc_address=127.0.0.1"],
                [f"--metrics_port={metrics_port}", "--enable_metric_reporting=false"],
                # Short leases let tests remove pages just read; a read must finish within one.
                [f"--default_kv_lease_ttl={self._lease_ms}"],
            )
            _wait_port(self.rpc_port, master, deadline)
            holder = self._spawn(
                folder / "mooncake_client",
                [f"--master_server_address=127.0.0.1:{self.rpc_port}"],
                ["--metadata_server=P2PHANDSHAKE", "--host=127.0.0.1", f"--port={holder_port}"],
                [f"--global_segment_size={self._segment}", "--protocol=tcp"],
            )
            _wait_port(holder_port, holder, deadline)
            self._probe(deadline)
        except BaseException:
            self.stop()
            raise

    def _spawn(self, binary: Path, *flags: list[str]) -> subprocess.Popen[bytes]:
        args = [str(binary), *(flag for group in flags for flag in group)]
        with open(self._dir / f"{binary.name}.log", "wb") as log:  # the child keeps its own fd
            process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        self._processes.append(process)
        return process

    def _probe(self, deadline: float) -> None:
        """Store one object through a fresh client until the holder's memory is mounted."""
        from mooncake.store import MooncakeDistributedStore

        client = MooncakeDistributedStore()
        master = f"127.0.0.1:{self.rpc_port}"
        if client.setup("127.0.0.1", "P2PHANDSHAKE", 0, 1 << 20, "tcp", "", master) != 0:
            raise MooncakeUnavailableError("a probe client could not set up")
        data = bytearray(64)
        address = ctypes.addressof((ctypes.c_char * len(data)).from_buffer(data))
        try:
            client.register_buffer(address, len(data))
            while time.monotonic() < deadline:
                if client.batch_put_from(["hicache-probe"], [address], [len(data)]) == [0]:
                    client.batch_remove(["hicache-probe"])
                    return
                time.sleep(_POLL_S)
            raise MooncakeUnavailableError("the mooncake holder did not mount its memory in time")
        finally:
            client.close()

    def kill_holder(self) -> None:
        """SIGKILL the holder: the pages in its memory become unreachable."""
        holder = self._processes[1]
        holder.kill()
        holder.wait(timeout=10)

    def stop(self) -> None:
        """Terminate the servers by PID and remove the logs; idempotent."""
        for process in reversed(self._processes):
            terminate(process)
        self._processes = []
        shutil.rmtree(self._dir, ignore_errors=True)
