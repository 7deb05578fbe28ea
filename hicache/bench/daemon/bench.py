"""Daemon throughput: GET/PUT GB/s and EXISTS latency of the remote backend vs a plain zmq echo.

The bench starts ``hicache serve`` (on a temporary store) and the echo server
(``hicache.bench.common.zmq_echo``) as subprocesses, once per transport (ipc, tcp
on loopback; shm: ipc with the daemon's shared-memory slab on and the clients
using it, held to the same ipc echo). ``clients`` threads share one RemoteBackend (one DEALER socket
per thread, as the storage I/O workers do); the baseline threads send the
same requests through their own DEALER sockets to the echo, which stores
nothing and checks nothing (``daemon_cells``). ``ratio`` is daemon/echo
throughput for GET and PUT, and echo/daemon p50 latency for EXISTS (so > 1
always means "daemon faster"); each is the best of ``--repeat`` runs, daemon
and echo alternated. The default run is short (64 KiB x 16 and 2 MiB x 4 pages
a call); ``--grid`` runs every page size x pages a call x client count.
Then fairness (``daemon_fairness``): a 1-page GET and a PING while another
client streams GETs and PUTs. ``--profile DIR`` writes cProfile figures of the
daemon (every thread) and of this process.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

from tqdm import tqdm

from hicache.bench.common.processes import ServerProcess, start_daemon, start_echo
from hicache.bench.daemon.cells import Cell, Client, EchoClient, Plan, Timing, measure
from hicache.bench.daemon.fairness import FairnessRow, measure_fairness, print_fairness
from hicache.bench.daemon.profiler import ThreadProfiles
from hicache.config.flags import at_least
from hicache.daemon.oneshot import call
from storage_backends import StorageConfig
from storage_backends.remote.client import RemoteBackend
from storage_backends.remote.protocol import Op, StatsReply

logger = logging.getLogger(__name__)

TRANSPORTS = ("ipc", "shm", "tcp")
FAIRNESS_TRANSPORTS = ("ipc", "tcp")  # its raw clients send frames: shm would repeat ipc
SHORT = ((64 << 10, 16), (2 << 20, 4))  # (page bytes, pages a call) of the default run
GRID_PAGES = (64 << 10, 256 << 10, 2 << 20, 8 << 20)
GRID_PER_CALL = (1, 4, 16)
GRID_CLIENTS = (1, 4)
OPS = ("PUT", "GET", "EXISTS")
COMMITS = "hicache_daemon_commits"
COMMITTED = "hicache_daemon_committed_put_requests"


@dataclass(frozen=True)
class Row:
    op: str
    transport: str
    clients: int
    page_bytes: int
    pages: int
    gbps: float
    baseline_gbps: float
    ratio: float
    cpu_ratio: float  # echo's CPU time / the daemon path's, per byte (per call for EXISTS)
    p50_us: float
    p99_us: float
    puts_per_commit: float  # PUT requests per group commit (PUT rows; 0 elsewhere)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--clients", type=client_counts, default="1", help="comma-separated client counts"
    )
    parser.add_argument("--grid", action="store_true", help="every page size x pages x clients")
    parser.add_argument(
        "--transports",
        type=transports,
        default=",".join(TRANSPORTS),
        help="comma-separated: ipc, shm (ipc through the daemon's shared memory), tcp",
    )
    parser.add_argument(
        "--shm-mib", type=at_least(1), default=1024, help="the daemon's slab for shm (MiB)"
    )
    parser.add_argument(
        "--mib", type=at_least(1), default=64, help="MiB each GET/PUT measurement moves in all"
    )
    parser.add_argument(
        "--repeat", type=at_least(1), default=3, help="runs per cell; the best counts"
    )
    parser.add_argument(
        "--exists-calls", type=at_least(1), default=100, help="EXISTS calls per client"
    )
    parser.add_argument(
        "--fairness-mib", type=at_least(1), default=256, help="MiB streamed by the bulk client"
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="write cProfile files here (default: no profiling)",
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="write the rows here (default: print only)"
    )


def client_counts(text: str) -> list[int]:
    """An argparse type: ``parse_clients`` with argparse's one-line refusal."""
    try:
        return parse_clients(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--clients ")) from None


def parse_clients(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--clients must be comma-separated integers, got {text!r}") from None
    if not counts or min(counts) < 1:
        raise ValueError(f"--clients needs counts >= 1, got {text!r}")
    return counts


def transports(text: str) -> list[str]:
    """An argparse type: a comma-separated subset of ``TRANSPORTS``."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names or any(name not in TRANSPORTS for name in names):
        raise argparse.ArgumentTypeError(f"expected some of {','.join(TRANSPORTS)}; got {text!r}")
    return names


def cells(args: argparse.Namespace, transport: str) -> list[Cell]:
    """The cells to measure over ``transport``: the short default, or the grid."""
    counts = args.clients if isinstance(args.clients, list) else parse_clients(args.clients)
    if args.grid:
        shapes = [(size, n) for size in GRID_PAGES for n in GRID_PER_CALL]
        counts = sorted(set(counts) | set(GRID_CLIENTS))
    else:
        shapes = list(SHORT)
    return [Cell(transport, size, n, c) for size, n in shapes for c in counts]


def speed(timing: Timing, op: str) -> float:
    """Higher is better: GB/s for GET and PUT, calls per second at the median for EXISTS."""
    return timing.gbps if op != "EXISTS" else 1e6 / max(timing.percentile_us(50), 1e-9)


def cpu_cost(timing: Timing, op: str) -> float:
    """CPU seconds (client + server) per byte moved, or per call for EXISTS."""
    work = timing.nbytes if op != "EXISTS" else len(timing.latencies_s)
    return timing.cpu_s / max(work, 1)


def cell_row(op: str, cell: Cell, mine: Timing, base: Timing, per_commit: float = 0.0) -> Row:
    moves = op != "EXISTS"
    return Row(
        op=op,
        transport=cell.transport,
        clients=cell.clients,
        page_bytes=cell.page_bytes,
        pages=cell.pages,
        gbps=mine.gbps if moves else 0.0,
        baseline_gbps=base.gbps if moves else 0.0,
        ratio=speed(mine, op) / max(speed(base, op), 1e-12),
        cpu_ratio=cpu_cost(base, op) / max(cpu_cost(mine, op), 1e-15),
        p50_us=mine.percentile_us(50),
        p99_us=mine.percentile_us(99),
        puts_per_commit=per_commit,
    )


def _better(op: str, new: Timing, old: Timing | None) -> Timing:
    """The faster of two runs (wall time), keeping the lower CPU cost of the two."""
    if old is None:
        return new
    fast = new if speed(new, op) > speed(old, op) else old
    lean = new if cpu_cost(new, op) < cpu_cost(old, op) else old
    return fast._replace(cpu_s=lean.cpu_s * max(fast.nbytes, 1) / max(lean.nbytes, 1))


class Target(NamedTuple):
    """A client, the pid of the server it talks to and (the daemon) its endpoint."""

    client: Client
    pid: int
    endpoint: str = ""


def commits(endpoint: str) -> tuple[float, float]:
    """The daemon's group commits and the PUT requests they carried, so far."""
    reply = call(endpoint, Op.STATS, 30.0)
    assert isinstance(reply, StatsReply)
    stats = reply.stats
    return stats[f"{COMMITS}_total"], stats[f"{COMMITTED}_total"]


def cell_rows(
    daemon: Target, echo: Target, plans: list[Plan], exists_calls: int
) -> tuple[list[Row], int]:
    """PUT, GET, EXISTS rows of one cell, each the best of one run per plan (fresh keys
    each, daemon and echo alternated); and the pages that were not stored or read back."""
    mine: dict[str, Timing | None] = dict.fromkeys(OPS)
    base: dict[str, Timing | None] = dict.fromkeys(OPS)
    missing = 0
    before = commits(daemon.endpoint)
    for plan in plans:
        for op in OPS:
            got = measure(daemon.client, daemon.pid, plan, op, exists_calls)
            if op != "EXISTS":
                missing += (plan.nbytes - got.nbytes) // plan.cell.page_bytes
            mine[op] = _better(op, got, mine[op])
            echoed = measure(echo.client, echo.pid, plan, op, exists_calls)
            base[op] = _better(op, echoed, base[op])
        for calls in plan.calls:  # keep the daemon's memory tier for the next run
            for keys in calls:
                daemon.client.delete(keys)
    after = commits(daemon.endpoint)
    per_commit = (after[1] - before[1]) / max(after[0] - before[0], 1)
    rows = []
    for op in OPS:
        m, b = mine[op], base[op]
        assert m is not None and b is not None
        rows.append(cell_row(op, plans[0].cell, m, b, per_commit if op == "PUT" else 0.0))
    return rows, missing


def print_rows(rows: list[Row]) -> None:
    head = f"{'op':<7}{'via':<4}{'clients':>8}{'page':>9}{'pages':>6}{'GB/s':>8}{'echo':>8}"
    print(f"{head}{'ratio':>7}{'cpu':>6}{'p50 µs':>9}{'p99 µs':>9}{'puts/commit':>12}")
    for r in rows:
        page = f"{r.page_bytes >> 10} KiB"
        print(
            f"{r.op:<7}{r.transport:<4}{r.clients:>8}{page:>9}{r.pages:>6}{r.gbps:>8.2f}"
            f"{r.baseline_gbps:>8.2f}{r.ratio:>7.2f}{r.cpu_ratio:>6.2f}{r.p50_us:>9.0f}"
            f"{r.p99_us:>9.0f}{r.puts_per_commit:>12.1f}"
        )


def run_cells(
    backend: Target, echo: Target, todo: list[Cell], args: argparse.Namespace
) -> tuple[list[Row], int]:
    rows: list[Row] = []
    missing = 0
    for cell in tqdm(todo, desc="daemon bench", unit="cell", leave=False):
        total = max(args.mib << 20, cell.page_bytes * cell.pages * cell.clients)
        plans = [Plan.build(f"{rep}/{cell}", cell, total) for rep in range(args.repeat)]
        got, lost = cell_rows(backend, echo, plans, args.exists_calls)
        rows += got
        missing += lost
    return rows, missing


def _endpoints(transport: str, tmp: Path) -> tuple[str, str]:
    """Where the daemon and the echo listen (loopback tcp on OS-picked ports, or ipc)."""
    if transport in ("ipc", "shm"):
        return f"ipc://{tmp}/daemon.sock", f"ipc://{tmp}/echo.sock"
    return "tcp://127.0.0.1:0", "tcp://127.0.0.1:*"


def run_transport(
    args: argparse.Namespace, transport: str
) -> tuple[list[Row], list[FairnessRow], int]:
    """Every cell over ``transport``, then fairness: one daemon and one echo for all."""
    with tempfile.TemporaryDirectory(prefix="hicache-bench-daemon-") as name:
        tmp = Path(name)
        daemon_at, echo_at = _endpoints(transport, tmp)
        profile = args.profile / f"daemon-{transport}.prof" if args.profile else None
        extra = [flag for text in getattr(args, "overrides", []) for flag in ("--set", text)]
        shm = transport == "shm"
        if shm:  # the endpoint too: --set is checked before --endpoint applies
            extra += ["--set", f"server.endpoint={daemon_at}"]
            extra += ["--set", f"server.shm_bytes={args.shm_mib << 20}"]
        daemon = start_daemon(
            args.config_path, tmp / "store", daemon_at, extra=extra, profile=profile
        )
        echo_server: ServerProcess | None = None
        backend = echo = None
        try:
            echo_server = start_echo(echo_at)
            config = StorageConfig(
                backend="remote", endpoint=daemon.endpoint, timeout_s=60.0, shm=shm
            )
            backend, echo = RemoteBackend(config), EchoClient(echo_server.endpoint)
            todo = cells(args, transport)
            targets = Target(backend, daemon.pid, daemon.endpoint), Target(echo, echo_server.pid)
            rows, missing = run_cells(*targets, todo, args)
            fairness = (
                measure_fairness(daemon.endpoint, transport, args.fairness_mib << 20)
                if transport in FAIRNESS_TRANSPORTS
                else []
            )
        finally:
            for closable in (backend, echo):
                if closable is not None:
                    closable.close()
            if echo_server is not None:
                echo_server.stop()
            daemon.stop()
    return rows, fairness, missing


def run(args: argparse.Namespace) -> int:
    profiles = ThreadProfiles() if args.profile is not None else None
    if profiles is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
        profiles.install()
    rows: list[Row] = []
    fairness: list[FairnessRow] = []
    missing = 0
    names = args.transports if isinstance(args.transports, list) else transports(args.transports)
    for transport in names:
        got, fair, lost = run_transport(args, transport)
        rows, fairness, missing = rows + got, fairness + fair, missing + lost
    if profiles is not None:
        profiles.dump(str(args.profile / "client.prof"))
        print(f"profiles: {args.profile}")
    print_rows(rows)
    print_fairness(fairness)
    if missing:
        print(f"WARNING: {missing} pages were not stored or not read back")
    if args.json is not None:
        report = {"cells": [asdict(r) for r in rows], "fairness": [r._asdict() for r in fairness]}
        args.json.write_text(json.dumps(report, indent=2))
        print(f"report: {args.json}")
    return 0 if not missing else 1
