"""The ``hicache`` command line: ``hicache bench <name>``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from hicache.bench import add_parsers
from hicache.config import CacheConfig, choice_fields, parse_override


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hicache", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="run a benchmark")
    add_parsers(bench.add_subparsers(dest="bench", required=True), _add_config_flags)
    return parser


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=Path("configs/default.toml"))
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one config field (repeatable); " + _choices_help(),
    )


def _choices_help() -> str:
    fields = choice_fields()
    return "; ".join(f"{key}: {'|'.join(names)}" for key, names in fields.items())


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        overrides = dict(parse_override(text) for text in args.overrides)
        args.config = CacheConfig.from_toml(args.config, overrides)
    except (ValueError, OSError) as e:
        print(f"hicache: {e}", file=sys.stderr)
        return 2
    return int(args.bench_run(args))


if __name__ == "__main__":
    sys.exit(main())
