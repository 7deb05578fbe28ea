"""``hicache serve``, ``hicache keygen`` and ``hicache stats``: the daemon's command line.

``add_parsers`` adds the three subcommands to a (lazy) sub-command group; each sets
``daemon_run`` (args → exit status), which ``hicache.cli.app.main`` calls. Nothing here
imports torch: ``hicache serve`` starts in a fraction of a second.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from hicache.config.flags import (
    LazySubParsers,
    Parser,
    add_config_flags,
    add_lazy_commands,
    at_least,
    check_override_keys,
    load_daemon_config,
    positive_float,
    verbose_parent,
)
from hicache.config.shipped import DAEMON

logger = logging.getLogger(__name__)

SERVE_DOC = """Run the cache daemon: one store shared by several engine processes over ZeroMQ.

It answers until SIGINT or SIGTERM, then finishes what is in flight and exits 0.
The flags below override single keys of --config; --set overrides any key."""
KEYGEN_DOC = """Write a CURVE key pair: DIRECTORY/NAME.key (public) and NAME.key_secret (mode 0600).

One pair for the daemon (auth.server_secret_key) and one per tenant or engine
(its public key in [[auth.tenants]], its secret file in storage.curve_client_key).
An existing pair is kept unless --force is given."""
STATS_DOC = """Print a running daemon's counters: requests, errors, pages and bytes per tier.

The daemon is the one at --connect, else at server.endpoint of --config."""


def add_parsers(sub: LazySubParsers) -> None:
    """``serve``, ``keygen`` and ``stats`` in the sub-command group ``sub``."""
    sub.add_lazy("serve", SERVE_DOC, _serve_flags)
    sub.add_lazy("keygen", KEYGEN_DOC, _keygen_flags)
    sub.add_lazy("stats", STATS_DOC, _stats_flags)


def _serve_flags(serve: argparse.ArgumentParser) -> None:
    add_config_flags(serve, DAEMON, "daemon")
    serve.add_argument(
        "--endpoint",
        help="tcp://HOST:PORT or ipc://PATH to listen on, port 0: OS-picked "
        "(default: server.endpoint of --config)",
    )
    serve.add_argument(
        "--allow-remote",
        action="store_true",
        default=None,
        help="bind beyond loopback without CURVE (server.allow_remote; logged as a warning)",
    )
    serve.add_argument(
        "--ready-file",
        help="write the bound endpoint here as JSON (default: server.ready_file of --config)",
    )
    serve.add_argument(
        "--store", dest="store_path", help="store directory (default: store.path of --config)"
    )
    serve.add_argument(
        "--store-bytes",
        type=at_least(1),
        help="store capacity in bytes (default: store.max_bytes of --config)",
    )
    serve.add_argument(
        "--memory-bytes",
        type=at_least(0),
        help="memory LRU in bytes (default: store.memory_bytes of --config)",
    )
    serve.add_argument(
        "--metrics-port",
        type=at_least(-1),
        help="Prometheus port, -1: off, 0: OS-picked (default: metrics.port of --config)",
    )
    serve.set_defaults(daemon_run=_serve)


def _keygen_flags(keygen: argparse.ArgumentParser) -> None:
    keygen.add_argument(
        "directory", type=Path, metavar="DIRECTORY", help="where to write the pair (created)"
    )
    keygen.add_argument("--name", default="client", help="file name of the pair")
    keygen.add_argument("--force", action="store_true", help="replace an existing pair")
    keygen.set_defaults(daemon_run=_keygen)


def _stats_flags(stats: argparse.ArgumentParser) -> None:
    add_config_flags(stats, DAEMON, "daemon")
    stats.add_argument(
        "--connect",
        metavar="ADDR",
        help="the daemon's endpoint, tcp://HOST:PORT or ipc://PATH "
        "(default: server.endpoint of --config)",
    )
    stats.add_argument(
        "--timeout", type=positive_float, default=5.0, help="seconds to wait for the reply"
    )
    stats.add_argument(
        "--server-key",
        help="CURVE: the daemon's public key, z85 or .key file (default: none, plain)",
    )
    stats.add_argument(
        "--client-key", help="CURVE: this client's .key_secret file (default: none, plain)"
    )
    stats.add_argument("--json", action="store_true", help="print JSON (raw values)")
    stats.set_defaults(daemon_run=_stats)


def _flag_overrides(args: argparse.Namespace) -> dict[str, str | int | bool]:
    """The serve flags given, as ``"section.key" -> value`` (applied after ``--set``)."""
    pick: dict[str, dict[str, str | int | bool | None]] = {
        "server": {
            "endpoint": args.endpoint,
            "allow_remote": args.allow_remote,
            "ready_file": args.ready_file,
        },
        "store": {
            "path": args.store_path,
            "max_bytes": args.store_bytes,
            "memory_bytes": args.memory_bytes,
        },
        "metrics": {"port": args.metrics_port},
    }
    return {f"{s}.{k}": v for s, f in pick.items() for k, v in f.items() if v is not None}


def _serve(args: argparse.Namespace) -> int:
    import zmq

    from hicache.daemon.heap import keep_freed_pages
    from hicache.daemon.server import DaemonServer
    from storage_backends import StorageError

    heap = keep_freed_pages()  # before the first page buffer is allocated
    logger.debug("malloc thresholds: %s", heap)
    try:
        check_override_keys(args)
        server = DaemonServer(load_daemon_config(args, _flag_overrides(args)))
    except (ValueError, OSError, StorageError) as exc:
        print(f"hicache serve: {exc}", file=sys.stderr)
        return 2
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = [signal.signal(signum, lambda *_: server.stop()) for signum in signals]
    try:
        server.start()
    except (zmq.ZMQError, OSError) as exc:
        server.close()
        print(f"hicache serve: cannot listen: {exc}", file=sys.stderr)
        return 2
    else:
        return 0 if server.serve() else 1
    finally:
        for signum, handler in zip(signals, previous, strict=True):
            signal.signal(signum, handler)


def _keygen(args: argparse.Namespace) -> int:
    from storage_backends.remote.keys import keygen

    directory: Path = args.directory
    existing = [
        p
        for p in (directory / f"{args.name}.key", directory / f"{args.name}.key_secret")
        if p.exists()
    ]
    if existing and not args.force:
        print(
            f"hicache keygen: {existing[0]} exists; keeping it (--force replaces the pair, "
            f"and every config that names its public key must then be updated)",
            file=sys.stderr,
        )
        return 2
    previous = os.umask(0o077)  # the secret file is never readable by others, not even briefly
    try:
        files = keygen(directory, args.name)
    finally:
        os.umask(previous)
    os.chmod(files.secret, 0o600)
    os.chmod(files.public, 0o644)
    print(f"public key: {files.public}\nsecret key: {files.secret} (mode 0600: keep it private)")
    return 0


def _stats(args: argparse.Namespace) -> int:
    from hicache.daemon.oneshot import DaemonCallError, call
    from storage_backends.remote.protocol import Op, StatsReply

    try:
        endpoint = args.connect
        if endpoint is None or args.overrides:
            endpoint = endpoint or load_daemon_config(args).server.endpoint
        reply = call(endpoint, Op.STATS, args.timeout, args.server_key, args.client_key)
    except (DaemonCallError, ValueError, OSError) as exc:
        print(f"hicache stats: {exc}", file=sys.stderr)
        return 1
    assert isinstance(reply, StatsReply)
    if args.json:
        print(json.dumps(dict(reply.stats), indent=2, sort_keys=True))
    else:
        print(stats_table(reply.stats))
    return 0


def stats_table(stats: Mapping[str, float]) -> str:
    """One line per counter, aligned: integers as integers, bytes and seconds with units."""
    width = max((len(name) for name in stats), default=0)
    return "\n".join(f"{name:<{width}}  {_value(name, v)}" for name, v in sorted(stats.items()))


def _number(value: float) -> str:
    if math.isfinite(value) and value == int(value):
        return f"{int(value):,}"
    return f"{value:,.6g}"


def _value(name: str, value: float) -> str:
    base = name.partition("{")[0]
    if base.endswith(("_bytes", "_bytes_total")):
        return f"{_number(value)} B{_binary(value)}"
    if base.endswith(("_seconds", "_seconds_sum")):
        return f"{value:.6g} s"
    return _number(value)


def _binary(value: float) -> str:
    """`` (1.5 GiB)`` for a byte count of 1 KiB or more, else nothing."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= size:
            return f" ({value / size:.1f} {unit})"
    return ""


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hicache.daemon serve|keygen|stats``: the same commands as ``hicache``'s."""
    parser = Parser(
        prog="python -m hicache.daemon", description=__doc__, parents=[verbose_parent()]
    )
    add_parsers(add_lazy_commands(parser, "command", "COMMAND"))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if getattr(args, "verbose", False) else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    run: Callable[[argparse.Namespace], int] = args.daemon_run
    return int(run(args))
