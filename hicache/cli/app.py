"""hicache: a tiered KV cache for LLM inference (device, host and storage tiers).

Every command takes -v (debug logging); those that read a config take
--config NAME|PATH (a config shipped with the package, or a TOML file) and
--set section.key=value (repeatable). `hicache COMMAND --help` says more.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import shutil
import sys
import textwrap
from collections.abc import Callable, Sequence
from types import MappingProxyType

from hicache.config.flags import (
    HelpFormatter,
    LazySubParsers,
    Parser,
    add_lazy_commands,
    check_override_keys,
    first_line,
    load_any,
    module_doc,
    overrides_of,
    port_in_use,
    verbose_parent,
)
from hicache.config.shipped import resolve_config

# Sub-command name -> module exposing ``add_arguments(parser)`` (its docstring's
# first line is the command's help, the whole its description). A module is
# imported only when its command is parsed: ``hicache --help`` stays torch-free.
# Each leaf parser sets ``run`` (``args -> exit status``); one that calls
# ``cli_common.add_config_flags`` gets ``args.config`` as a loaded config.
# Add a command with one line here. ``serve``, ``keygen`` and ``stats`` come from
# ``hicache.daemon.cli`` (they set ``daemon_run``).
COMMANDS: MappingProxyType[str, str] = MappingProxyType(
    {
        "bench": "hicache.bench",
        "store": "hicache.cli.store",
    }
)

# Loggers that ``-v`` turns to DEBUG (third-party ones stay at INFO).
PACKAGES = ("hicache", "storage_backends", "transfer", "device_pool", "host_pool")


def overview() -> str:
    """The top-level description: every command, down to each benchmark, with its help."""
    from hicache.bench import summaries
    from hicache.cli.store import actions
    from hicache.daemon import cli as daemon_cli

    leaves = [(f"bench {name}", first_line(doc)) for name, doc in summaries().items()]
    leaves += [(f"store {name} PATH", first_line(run.__doc__)) for name, run in actions().items()]
    leaves += [
        ("serve", first_line(daemon_cli.SERVE_DOC)),
        ("keygen DIRECTORY", first_line(daemon_cli.KEYGEN_DOC)),
        ("stats", first_line(daemon_cli.STATS_DOC)),
    ]
    width = max(len(name) for name, _ in leaves)
    indent = " " * (width + 12)
    columns = max(shutil.get_terminal_size().columns - 2, len(indent) + 30)
    lines = [
        textwrap.fill(f"  hicache {name:<{width}}  {text}", columns, subsequent_indent=indent)
        for name, text in leaves
    ]
    return f"{first_line(__doc__)}\n\ncommands:\n" + "\n".join(lines) + "\n\n" + _rest_of_doc()


def _rest_of_doc() -> str:
    return "\n".join((__doc__ or "").strip().splitlines()[2:])


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="hicache",
        description=overview(),
        formatter_class=HelpFormatter,
        parents=[verbose_parent()],
    )
    parser.add_argument("--version", action=_Version, nargs=0, help="print the version")
    sub = add_lazy_commands(parser, "command", "COMMAND")
    for name, module_name in COMMANDS.items():
        sub.add_lazy(name, module_doc(module_name), _builder(module_name))
    from hicache.daemon.cli import add_parsers

    add_parsers(sub)
    return parser


class _Version(argparse.Action):
    """``--version``: the installed version, looked up only when asked for (the lookup
    imports importlib.metadata)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        import hicache

        print(f"hicache {hicache.__version__}")
        parser.exit()


def _builder(module_name: str) -> Callable[[argparse.ArgumentParser], None]:
    def build(parser: argparse.ArgumentParser) -> None:
        importlib.import_module(module_name).add_arguments(parser)

    return build


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
    """Check extras and ``--set`` keys, map them onto benchmark flags, load the config."""
    if hasattr(args, "config"):
        check_override_keys(args)
    bench = getattr(args, "bench", None)
    if bench is not None:
        from hicache.bench import BENCH_EXTRA, config_flags, missing_extras

        missing = missing_extras(bench)
        if missing:
            raise ValueError(
                f"bench {bench} needs {', '.join(missing)}: "
                f"install {BENCH_EXTRA} (pip install -e '.[bench]')"
            )
        flags = config_flags(bench, overrides_of(args))  # type: ignore[arg-type]
        if flags:
            args = parser.parse_args([*argv, *flags])
    if hasattr(args, "config"):
        args.config_path = resolve_config(str(args.config), args.config_kind)
        args.config = load_any(args)
    return args


def _run(run: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    from storage_backends import StorageError

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


__all__ = ["COMMANDS", "LazySubParsers", "build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
