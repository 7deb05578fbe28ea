"""The configs that ship inside the package, by name (``--config NAME|PATH``).

Kept free of heavy imports: the daemon's command line starts without torch.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

CONFIG_SUFFIX = ".toml"


def shipped_configs() -> list[str]:
    """Names of the configs that ship inside the package (``--config NAME``)."""
    folder = resources.files("hicache") / "configs"
    return sorted(
        entry.name.removesuffix(CONFIG_SUFFIX)
        for entry in folder.iterdir()
        if entry.name.endswith(CONFIG_SUFFIX)
    )


def resolve_config(text: str) -> Path:
    """``text`` as a file path if that file exists, else a shipped config's
    name (``default``, ``device-only``, ...). ValueError naming both readings."""
    path = Path(text)
    if path.is_file():
        return path
    shipped = resources.files("hicache") / "configs" / f"{text.removesuffix(CONFIG_SUFFIX)}.toml"
    if shipped.is_file():
        return Path(str(shipped))
    raise ValueError(
        f"--config {text}: no such file, and no shipped config of that name "
        f"(shipped: {', '.join(shipped_configs())})"
    )
