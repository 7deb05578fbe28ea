"""The configs that ship inside the package, by name (``--config NAME|PATH``), and their kind.

A config is for the cache (engines and most benches: ``[model]``, ``[device]``, ...) or
for the daemon (``hicache serve``: ``[server]``, ``[store]``, ...); a command offers and
accepts only the kind it runs. Kept free of heavy imports: the daemon's command line and
``hicache --help`` start without torch.
"""

from __future__ import annotations

from pathlib import Path

from hicache.config.loader import read_toml

CONFIG_SUFFIX = ".toml"
CACHE = "cache"
DAEMON = "daemon"
# What each kind of config is run by, for the messages.
RUN_BY = {CACHE: "engines and benchmarks", DAEMON: "hicache serve and bench daemon"}


def _folder() -> Path:
    # Inside the hicache package (a link to the top-level configs/ in a source tree); not
    # importlib.resources, which costs a zipfile import at every start.
    return Path(__file__).resolve().parent.parent / "configs"


def sections(kind: str) -> tuple[str, ...]:
    """The top-level tables a config of ``kind`` may hold."""
    from hicache.config.loader import sections_of

    if kind == DAEMON:
        from hicache.config.daemon import DaemonConfig

        return sections_of(DaemonConfig)
    from hicache.config.cache import CacheConfig

    return sections_of(CacheConfig)


def fits(path: Path, kind: str) -> bool:
    """Whether the file's tables are all tables of a ``kind`` config (False if unreadable).
    Only ``kind``'s dataclasses are imported: the daemon's start never imports the cache's."""
    try:
        tables = set(read_toml(path))
    except (OSError, ValueError):
        return False
    return tables <= set(sections(kind))


def _other(kind: str) -> str:
    return DAEMON if kind == CACHE else CACHE


def shipped_configs(kind: str | None = None) -> list[str]:
    """Names of the configs that ship inside the package (of ``kind``, when given)."""
    names = sorted(
        entry.name.removesuffix(CONFIG_SUFFIX)
        for entry in _folder().iterdir()
        if entry.name.endswith(CONFIG_SUFFIX)
    )
    if kind is None:
        return names
    return [n for n in names if fits(_folder() / f"{n}{CONFIG_SUFFIX}", kind)]


def resolve_config(text: str, kind: str | None = None) -> Path:
    """``text`` as a file path if that file exists, else a shipped config's name
    (``default``, ``device-only``, ...). ValueError naming both readings, or naming
    the config's kind when it is not ``kind``."""
    path = Path(text)
    if not path.is_file():
        shipped = _folder() / f"{text.removesuffix(CONFIG_SUFFIX)}{CONFIG_SUFFIX}"
        if not shipped.is_file():
            offered = shipped_configs(kind)
            raise ValueError(
                f"--config {text}: no such file, and no shipped config of that name "
                f"(shipped: {', '.join(offered)})"
            )
        path = shipped
    if kind is not None and not fits(path, kind) and fits(path, _other(kind)):
        raise ValueError(
            f"--config {text}: a {_other(kind)} config (for {RUN_BY[_other(kind)]}); this "
            f"command runs {kind} configs: {', '.join(shipped_configs(kind))} or a TOML file"
        )
    return path
