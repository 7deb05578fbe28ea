"""What every ``hicache`` sub-command shares: help layout, ``-v``, ``--config`` and ``--set``."""

from __future__ import annotations

import argparse
import difflib
import errno
import re
from collections.abc import Sequence

from hicache import config_doc
from hicache.config import CacheConfig, choice_fields, parse_override
from hicache.shipped import resolve_config, shipped_configs


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Descriptions kept as written; every option's default shown."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        unset = default is None or default is False or default == [] or default == ""
        if "%(default)" in text or not action.option_strings or unset:
            return text
        if default is argparse.SUPPRESS:
            return text
        return f"{text} (default: %(default)s)".strip()


def plain(doc: str | None) -> str:
    """A docstring as help text: reST literals (````x````) shown as plain x."""
    return re.sub(r"``(.+?)``", r"\1", (doc or "").strip())


def verbose_parent() -> argparse.ArgumentParser:
    """``-v`` for every level of the command tree; SUPPRESS keeps an outer
    ``-v`` from being reset by an inner parser that did not see one."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="debug logging"
    )
    return parent


def add_command(
    sub: argparse._SubParsersAction, name: str, doc: str | None
) -> argparse.ArgumentParser:
    """A sub-command parser with the shared layout: first line of ``doc`` as
    its one-line help, the whole of it as the description."""
    text = plain(doc)
    return sub.add_parser(
        name,
        help=text.splitlines()[0] if text else None,
        description=text,
        formatter_class=HelpFormatter,
        parents=[verbose_parent()],
    )


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        default="default",
        metavar="NAME|PATH",
        help=f"a shipped config ({', '.join(shipped_configs())}) or a TOML file",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one config field (repeatable); " + _choices_help(),
    )


def _choices_help() -> str:
    """The names each registry-backed key accepts, read from the registries."""
    fields = choice_fields()
    return "; ".join(f"{key}: {'|'.join(names)}" for key, names in fields.items())


def config_keys() -> list[str]:
    """Every ``section.key`` a config file or ``--set`` may name."""
    return sorted(config_doc.config_keys())


def check_override_keys(keys: Sequence[str]) -> None:
    """ValueError for a ``--set`` key that is no config key, with the nearest."""
    known = config_keys()
    for key in keys:
        if key not in known:
            near = difflib.get_close_matches(key, known, n=1, cutoff=0.5)
            hint = f"; did you mean {near[0]}?" if near else f"; known keys: {', '.join(known)}"
            raise ValueError(f"--set {key}: unknown config key{hint}")


def load_config(args: argparse.Namespace) -> CacheConfig:
    """The config ``--config`` names, with the ``--set`` overrides applied.
    ValueError (naming the flag or the file) or OSError."""
    overrides = dict(parse_override(text) for text in args.overrides)
    check_override_keys(list(overrides))
    return CacheConfig.from_toml(resolve_config(str(args.config)), overrides)


def port_in_use(error: OSError, config: object) -> str | None:
    """The message for a metrics port already taken, naming port and key; None
    when ``error`` is something else."""
    if error.errno != errno.EADDRINUSE or not isinstance(config, CacheConfig):
        return None
    m = config.metrics
    return (
        f"metrics.port {m.port}: {m.host}:{m.port} is already in use; "
        f"set another port (--set metrics.port=N) or 0 to turn metrics off"
    )
