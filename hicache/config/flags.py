"""What every ``hicache`` sub-command shares: help layout, ``-v``, ``--config`` and ``--set``,
sub-commands built on first use, and argument types with their range.

Standard library only at import: ``hicache --help`` and ``hicache serve`` must not pay for
torch. A sub-command's own module is imported only when that sub-command is parsed.
"""

from __future__ import annotations

import argparse
import ast
import errno
import importlib.util
import inspect
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from hicache.config.loader import Override, Scalar, check_keys, parse_override
from hicache.config.shipped import CACHE, DAEMON, resolve_config, shipped_configs

if TYPE_CHECKING:
    from hicache.config.cache import CacheConfig
    from hicache.config.daemon import DaemonConfig

Builder = Callable[[argparse.ArgumentParser], None]


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Descriptions kept as written; every option that takes a value shows its default
    (an option without one says in its help what it does when left out)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        unset = default is None or default is False or default == [] or default == ""
        if "%(default)" in text or not action.option_strings or unset:
            return text
        if default is argparse.SUPPRESS:
            return text
        return f"{text} (default: %(default)s)".strip()


class Parser(argparse.ArgumentParser):
    """A parser that refuses a bad argument in one line naming it (no usage dump)."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def plain(doc: str | None) -> str:
    """A docstring as help text: reST literals (````x````) shown as plain x."""
    return re.sub(r"``(.+?)``", r"\1", (doc or "").strip())


def first_line(doc: str | None) -> str:
    text = plain(doc)
    return text.splitlines()[0] if text else ""


# A module's docstring: the first statement, after comments and blank lines.
_DOCSTRING = re.compile(r'\A(?:[ \t]*(?:#[^\n]*)?\n)*[ \t]*[rR]?("""|\'\'\')(.*?)\1', re.S)


def module_doc(module: str) -> str:
    """The docstring of ``module``, read from its source without importing it (a
    benchmark's module imports torch; its one-line help should not) and without
    parsing all of it."""
    spec = importlib.util.find_spec(module)
    origin = spec.origin if spec is not None else None
    if origin is None or not origin.endswith(".py"):
        return importlib.import_module(module).__doc__ or ""
    with open(origin, encoding="utf-8") as f:
        source = f.read()
    found = _DOCSTRING.match(source)
    if found is None:
        return ast.get_docstring(ast.parse(source)) or ""
    return inspect.cleandoc(ast.literal_eval(found.group(0).strip()))


def verbose_parent() -> argparse.ArgumentParser:
    """``-v`` for every level of the command tree; SUPPRESS keeps an outer
    ``-v`` from being reset by an inner parser that did not see one."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="debug logging"
    )
    return parent


class LazySubParsers(argparse._SubParsersAction):  # type: ignore[type-arg]
    """Sub-commands whose arguments are added when the sub-command is parsed (or
    ``build_all``), so that listing them imports nothing of theirs."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._builders: dict[str, Builder] = {}

    def add_lazy(self, name: str, doc: str, build: Builder) -> argparse.ArgumentParser:
        """Sub-command ``name``: the first line of ``doc`` is its help, the whole its
        description; ``build(parser)`` adds its arguments when it is used."""
        text = plain(doc)
        parser = self.add_parser(
            name,
            help=first_line(text),
            description=text,
            formatter_class=HelpFormatter,
            parents=[verbose_parent()],
        )
        self._builders[name] = build
        return parser

    def build(self, name: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = self._name_parser_map[name]
        builder = self._builders.pop(name, None)
        if builder is not None:
            builder(parser)
        return parser

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[object] | None,
        option_string: str | None = None,
    ) -> None:
        if isinstance(values, list) and values and values[0] in self._name_parser_map:
            self.build(str(values[0]))
        super().__call__(parser, namespace, values, option_string)


def add_lazy_commands(parser: argparse.ArgumentParser, dest: str, metavar: str) -> LazySubParsers:
    sub = parser.add_subparsers(dest=dest, required=True, metavar=metavar, action=LazySubParsers)
    assert isinstance(sub, LazySubParsers)
    return sub


def build_all(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    """Every parser of the command tree, fully built, as ``(command path, parser)``."""
    out = [(parser.prog, parser)]
    for action in parser._actions:
        if isinstance(action, LazySubParsers):
            for name in list(action._name_parser_map):
                out += build_all(action.build(name))
    return out


def add_config_flags(
    parser: argparse.ArgumentParser, kind: str = CACHE, default: str = "default", note: str = ""
) -> None:
    """``--config NAME|PATH`` (a config of ``kind``) and ``--set SECTION.KEY=VALUE``."""
    parser.set_defaults(config_kind=kind)
    parser.add_argument(
        "--config",
        default=default,
        metavar="NAME|PATH",
        help=f"a shipped {kind} config ({', '.join(shipped_configs(kind))}) or a TOML file" + note,
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one config field (repeatable; none by default)" + _choices_help(kind),
    )


def _choices_help(kind: str) -> str:
    """The names each registry-backed key accepts, read from the registries."""
    if kind != CACHE:
        return ""
    from hicache.config.cache import choice_fields

    return "; " + "; ".join(f"{k}: {'|'.join(names)}" for k, names in choice_fields().items())


def overrides_of(args: argparse.Namespace) -> dict[str, object]:
    """The ``--set`` flags as ``{"section.key": value}``; ValueError for a malformed one."""
    pairs: list[Override] = [parse_override(text) for text in getattr(args, "overrides", [])]
    return dict(pairs)


def load_config(args: argparse.Namespace) -> CacheConfig:
    """The cache config ``--config`` names, with the ``--set`` overrides applied.
    ValueError (naming the flag or the file, and the key) or OSError."""
    from hicache.config.cache import CacheConfig

    path = resolve_config(str(args.config), CACHE)
    return CacheConfig.from_toml(path, overrides_of(args))  # type: ignore[arg-type]


def load_daemon_config(
    args: argparse.Namespace, flags: Mapping[str, Scalar] | None = None
) -> DaemonConfig:
    """The daemon config ``--config`` names, with the ``--set`` overrides and then the
    command's own ``flags`` (``"section.key" -> value``) applied before it is validated,
    so a check across keys sees them all (``--endpoint ipc://…`` with shared memory)."""
    from hicache.config.daemon import DaemonConfig

    path = resolve_config(str(args.config), DAEMON)
    overrides = {**overrides_of(args), **(flags or {})}
    return DaemonConfig.from_toml(path, overrides)  # type: ignore[arg-type]


def load_any(args: argparse.Namespace) -> CacheConfig | DaemonConfig:
    """The config of the kind the command runs (``add_config_flags``'s ``kind``)."""
    if getattr(args, "config_kind", CACHE) == DAEMON:
        return load_daemon_config(args)
    return load_config(args)


def check_override_keys(args: argparse.Namespace) -> None:
    """ValueError for a ``--set`` key that is no key of the command's config, with the nearest."""
    if getattr(args, "config_kind", CACHE) == DAEMON:
        from hicache.config.daemon import DaemonConfig as cls
    else:
        from hicache.config.cache import CacheConfig as cls  # type: ignore[assignment]
    check_keys(cls, overrides_of(args))  # type: ignore[arg-type]


def at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``low`` (argparse names the flag when refused)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def port_in_use(error: OSError, config: object) -> str | None:
    """The message for a metrics port already taken, naming port and key; None
    when ``error`` is something else."""
    m = getattr(config, "metrics", None)
    if error.errno != errno.EADDRINUSE or m is None or not hasattr(m, "port"):
        return None
    return (
        f"metrics.port {m.port}: {m.host}:{m.port} is already in use; "
        f"set another port (--set metrics.port=N) or 0 to turn metrics off"
    )
