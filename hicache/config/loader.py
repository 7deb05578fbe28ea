"""TOML into frozen config dataclasses: the one loader of the cache's and the daemon's configs.

Torch-free (standard library only), so that ``hicache serve`` and ``hicache --help`` start
fast. Every error is a ``ConfigError`` (a ValueError) worded one way::

    <source>: <section.key>: <problem>

where the source is the file, or ``--set`` when the value came from a ``--set`` override;
an unknown key gets the nearest known one ("did you mean ..."), a wrong type says what type
was expected in TOML terms (``expected a number, got true``). Range checks stay in each
dataclass's ``__post_init__``; their ValueErrors are reworded here to name the source.
"""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
import types
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path

Scalar = str | int | float | bool
_T = typing.TypeVar("_T")

SET_FLAG = "--set"
_TYPE_NAMES = {
    bool: "true or false",
    int: "an integer",
    float: "a number",
    str: "a string",
}


class ConfigError(ValueError):
    """A config value that cannot be used; the message names the source and the key."""


class Override(typing.NamedTuple):
    key: str
    value: Scalar


def parse_override(text: str) -> Override:
    """Parse a CLI ``--set section.key=value`` (value in TOML syntax, bare strings allowed)."""
    key, sep, raw = text.partition("=")
    if not sep or "." not in key:
        raise ConfigError(f"{SET_FLAG} {text!r}: expected section.key=value")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return Override(key.strip(), value)


def read_toml(path: str | Path) -> dict[str, object]:
    """The TOML document at ``path``; ConfigError for bad TOML, OSError if unreadable."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None


def keys_of(cls: type, prefix: str = "") -> Iterator[str]:
    """Every ``section.key`` of config dataclass ``cls``, in declaration order."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            yield from keys_of(kind, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}"


def sections_of(cls: type) -> tuple[str, ...]:
    """The top-level tables of config dataclass ``cls``."""
    return tuple(f.name for f in dataclasses.fields(cls))


def show(value: object) -> str:
    """``value`` as TOML writes it (``true``, ``"abc"``, ``1.5``)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return str(value)


def load(
    cls: type[_T],
    data: Mapping[str, object],
    source: str,
    overrides: Mapping[str, Scalar] | None = None,
) -> _T:
    """Build ``cls`` from the TOML tables ``data`` (read from ``source``), then the
    ``--set`` ``overrides`` (``"section.key" -> value``) on top. ConfigError otherwise."""
    loader = _Loader(cls, source, dict(overrides or {}))
    return loader.build(cls, loader.merge(data), "")


def check_keys(cls: type, overrides: Mapping[str, Scalar]) -> None:
    """ConfigError for a ``--set`` key that ``cls`` does not have (with the nearest one)."""
    _Loader(cls, SET_FLAG, dict(overrides)).merge({})


def _union_member(members: tuple[object, ...], value: object) -> object:
    """The member of a union type that ``value`` is (a bool is never taken for an int),
    else the first one (whose name the type error gives)."""
    for member in members:
        if isinstance(value, bool) != (member is bool):
            continue
        if isinstance(member, type) and isinstance(value, member):
            return member
    return members[0]


class _Loader:
    """One load: knows which keys came from ``--set`` so that errors blame the right source."""

    def __init__(self, cls: type, source: str, overrides: dict[str, Scalar]) -> None:
        self.cls = cls
        self.source = source
        self.overrides = overrides
        self.known = list(keys_of(cls))

    def fail(self, key: str, problem: str) -> typing.NoReturn:
        if key in self.overrides or any(k.startswith(f"{key}.") for k in self.overrides):
            raise ConfigError(f"{SET_FLAG} {key}: {problem}")
        raise ConfigError(
            f"{self.source}: {key}: {problem}" if key else f"{self.source}: {problem}"
        )

    def unknown(self, key: str, candidates: list[str]) -> typing.NoReturn:
        """Unknown ``key``: name the same key in another table, else the nearest of
        ``candidates`` (the keys beside it), else the nearest key anywhere, else list
        ``candidates``."""
        import difflib  # only on this error path: not worth its import at every start

        name = key.rpartition(".")[2]
        elsewhere = [k for k in self.known if k.rpartition(".")[2] == name and "." in key]
        if elsewhere:
            self.fail(key, f"unknown key; did you mean {elsewhere[0]}?")
        for pool in (candidates, self.known):  # beside it first; names compared without tables
            bare = {k.rpartition(".")[2]: k for k in reversed(pool)}
            near = difflib.get_close_matches(name, list(bare), n=1, cutoff=0.6)
            if near:
                self.fail(key, f"unknown key; did you mean {bare[near[0]]}?")
        self.fail(key, f"unknown key; known: {', '.join(candidates)}")

    def merge(self, data: Mapping[str, object]) -> dict[str, object]:
        merged = {k: dict(v) if isinstance(v, Mapping) else v for k, v in data.items()}
        sections = sections_of(self.cls)
        for dotted, value in self.overrides.items():
            section, _, key = dotted.partition(".")
            if section not in sections:
                self.unknown(dotted, list(sections))
            if dotted not in self.known:
                self.unknown(dotted, [k for k in self.known if k.startswith(f"{section}.")])
            table = merged.setdefault(section, {})
            if not isinstance(table, dict):
                self.fail(section, "expected a table")
            table[key] = value
        return merged

    def build(self, cls: type[_T], table: Mapping[str, object], prefix: str) -> _T:
        hints = typing.get_type_hints(cls)
        names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
        for name in table:
            if name not in names:
                self.unknown(f"{prefix}{name}", [f"{prefix}{n}" for n in names])
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            required = f.default is f.default_factory is dataclasses.MISSING
            if required and f.name not in table:
                self.fail(f"{prefix}{f.name}", "missing; this key is required")
        kwargs = {name: self.value(hints[name], v, f"{prefix}{name}") for name, v in table.items()}
        try:
            return cls(**kwargs)
        except ValueError as e:
            self.blame(str(e), prefix, names)

    def value(self, kind: object, value: object, key: str) -> object:
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            if not isinstance(value, Mapping):
                self.fail(key, f"expected a table, got {show(value)}")
            return self.build(kind, value, f"{key}.")
        if typing.get_origin(kind) is tuple:
            item = typing.get_args(kind)[0]
            if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
                self.fail(key, f"expected an array of tables ([[{key}]]), got {show(value)}")
            return tuple(self.build(item, v, f"{key}.") for v in value)
        return self.scalar(kind, value, key)

    def scalar(self, kind: object, value: object, key: str) -> object:
        if isinstance(kind, types.UnionType):
            kind = _union_member(typing.get_args(kind), value)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        wrong_bool = isinstance(value, bool) and kind is not bool
        if wrong_bool or not isinstance(value, kind):  # type: ignore[arg-type]
            wanted = _TYPE_NAMES.get(kind, getattr(kind, "__name__", str(kind)))  # type: ignore[call-overload]
            self.fail(key, f"expected {wanted}, got {show(value)}")
        # Sizes and ratios become integers (token counts, bytes): inf and nan never make sense.
        if isinstance(value, float) and not math.isfinite(value):
            self.fail(key, f"must be a finite number, got {show(value)}")
        return value

    def blame(self, message: str, prefix: str, names: list[str]) -> typing.NoReturn:
        """Reword a ``__post_init__`` ValueError as ``source: key: problem``: the key is the
        longest key of this table (or below it) that the message starts with, with or
        without its section; else the first field it mentions; else the table."""
        below = [k for k in self.known if k.startswith(prefix)] + [prefix + n for n in names]
        for dotted in sorted(set(below), key=len, reverse=True):
            for said in (dotted, dotted[len(prefix) :]):
                match = re.match(rf"{re.escape(said)}(?![\w.])[:\s]*", message)
                if match:
                    self.fail(dotted, message[match.end() :])
        for name in names:
            if re.search(rf"\b{re.escape(name)}\b", message):
                self.fail(f"{prefix}{name}", message)
        self.fail(prefix.rstrip("."), message)
