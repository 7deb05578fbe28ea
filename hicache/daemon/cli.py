"""``hicache serve``, ``hicache keygen`` and ``hicache stats``: the daemon's command line.

``add_parsers`` adds the three subcommands to the top-level parser; each sets
``daemon_run`` (args → exit status), which ``hicache.cli.main`` calls.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from hicache.shipped import resolve_config

logger = logging.getLogger(__name__)


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = sub.add_parser("serve", help="run the cache daemon")
    serve.add_argument(
        "--config", default="daemon", metavar="NAME|PATH", help="a shipped config or a TOML file"
    )
    serve.add_argument("--endpoint", help="override server.endpoint (port 0: OS-picked)")
    serve.add_argument("--allow-remote", action="store_true", default=None)
    serve.add_argument("--ready-file", help="override server.ready_file")
    serve.add_argument("--store", dest="store_path", help="override store.path")
    serve.add_argument("--store-bytes", type=int, help="override store.max_bytes")
    serve.add_argument("--memory-bytes", type=int, help="override store.memory_bytes")
    serve.add_argument("--metrics-port", type=int, help="override metrics.port (-1: off)")
    serve.set_defaults(daemon_run=_serve)

    keygen = sub.add_parser("keygen", help="write a CURVE key pair (NAME.key, NAME.key_secret)")
    keygen.add_argument("directory", type=Path)
    keygen.add_argument("--name", default="client")
    keygen.set_defaults(daemon_run=_keygen)

    stats = sub.add_parser("stats", help="print the STATS reply of a running daemon")
    stats.add_argument("--connect", required=True, metavar="ADDR")
    stats.add_argument("--timeout", type=float, default=5.0)
    stats.add_argument("--server-key", help="the daemon's public key (CURVE)")
    stats.add_argument("--client-key", help="this client's .key_secret file (CURVE)")
    stats.add_argument("--json", action="store_true", help="print JSON")
    stats.set_defaults(daemon_run=_stats)


def _overrides(args: argparse.Namespace) -> dict[str, dict[str, object]]:
    pick = {
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
    return {s: {k: v for k, v in f.items() if v is not None} for s, f in pick.items()}


def _serve(args: argparse.Namespace) -> int:
    import zmq

    from hicache.daemon.config import DaemonConfig
    from hicache.daemon.server import DaemonServer
    from storage_backends import StorageError

    try:
        config = DaemonConfig.from_toml(resolve_config(args.config)).with_overrides(
            **_overrides(args)
        )
        server = DaemonServer(config)
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
    from hicache.daemon.auth import keygen

    files = keygen(args.directory, args.name)
    print(f"public key: {files.public}\nsecret key: {files.secret}")
    return 0


def _stats(args: argparse.Namespace) -> int:
    from hicache.daemon.oneshot import DaemonCallError, call
    from hicache.daemon.protocol import Op, StatsReply

    try:
        reply = call(args.connect, Op.STATS, args.timeout, args.server_key, args.client_key)
    except (DaemonCallError, ValueError) as exc:
        print(f"hicache stats: {exc}", file=sys.stderr)
        return 1
    assert isinstance(reply, StatsReply)
    if args.json:
        print(json.dumps(dict(reply.stats), indent=2, sort_keys=True))
    else:
        for name, value in sorted(reply.stats.items()):
            print(f"{name} {value}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hicache.daemon serve|keygen|stats``: the same commands without importing the
    cache (and torch), so a daemon starts in a fraction of a second."""
    parser = argparse.ArgumentParser(prog="python -m hicache.daemon", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    add_parsers(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    return int(args.daemon_run(args))
