"""The hicache command line.

  hicache bench tiering            the main job: what each tier buys (JSON + plot)
  hicache bench tree|transfer|storage|engine
  hicache store inspect|verify PATH
  hicache --version

Configs: --config default|device-only|... (shipped with the package) or a
TOML file; --set section.key=value overrides one field.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence
from types import MappingProxyType

import hicache
from hicache.bench import BENCH_EXTRA, config_flags, missing_extras
from hicache.cli_common import (
    HelpFormatter,
    add_command,
    load_config,
    port_in_use,
    verbose_parent,
)
from hicache.config import parse_override
from hicache.daemon.cli import add_parsers as add_daemon_parsers
from storage_backends import StorageError

# Sub-command name -> module exposing ``add_arguments(parser)`` (its docstring
# is the command's help). Each leaf parser sets ``run`` (``args -> exit
# status``); one that calls ``cli_common.add_config_flags`` gets ``args.config``
# as a loaded CacheConfig. Add a command with one line here.
COMMANDS: MappingProxyType[str, str] = MappingProxyType(
    {
        "bench": "hicache.bench",
        "store": "hicache.store_cli",
    }
)

# Loggers that ``-v`` turns to DEBUG (third-party ones stay at INFO).
PACKAGES = ("hicache", "storage_backends", "transfer", "device_pool", "host_pool")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hicache",
        description=__doc__,
        formatter_class=HelpFormatter,
        parents=[verbose_parent()],
    )
    parser.add_argument("--version", action="version", version=f"hicache {hicache.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        module.add_arguments(add_command(sub, name, module.__doc__))
    add_daemon_parsers(sub)  # serve, keygen, stats: they set ``daemon_run``
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    _logging(getattr(args, "verbose", False))
    if hasattr(args, "daemon_run"):
        return int(args.daemon_run(args))
    try:
        args = _prepare(parser, argv, args)
    except (ValueError, OSError) as e:
        print(f"hicache: {e}", file=sys.stderr)
        return 2
    return _run(args.run, args)


def _logging(verbose: bool) -> None:
    """INFO for everything; DEBUG for the project's own loggers with ``-v``."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for name in PACKAGES:
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.INFO)


def _prepare(
    parser: argparse.ArgumentParser, argv: list[str], args: argparse.Namespace
) -> argparse.Namespace:
    """Check extras, map ``--set`` keys onto benchmark flags, load the config."""
    bench = getattr(args, "bench", None)
    if bench is not None:
        missing = missing_extras(bench)
        if missing:
            raise ValueError(
                f"bench {bench} needs {', '.join(missing)}: "
                f"install {BENCH_EXTRA} (pip install -e '.[bench]')"
            )
        overrides = dict(parse_override(text) for text in args.overrides)
        flags = config_flags(bench, overrides)
        if flags:
            args = parser.parse_args([*argv, *flags])
    if hasattr(args, "config"):
        args.config = load_config(args)
    return args


def _run(run: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    try:
        return int(run(args))
    except StorageError as e:
        print(f"hicache: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        message = port_in_use(e, getattr(args, "config", None))
        if message is None:
            raise
        print(f"hicache: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
