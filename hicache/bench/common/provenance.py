"""Where a benchmark's figures came from: hicache version, git commit, Python, torch."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

import torch

import hicache

_GIT_TIMEOUT_S = 5.0


def git_commit(where: Path) -> str | None:
    """The commit checked out at ``where`` (``+dirty`` when files differ), or
    None outside a git checkout or without git. Bounded by a timeout."""
    try:
        head = _git(where, "rev-parse", "HEAD")
        dirty = _git(where, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}+dirty" if dirty else head


def _git(where: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(where), *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=_GIT_TIMEOUT_S,
    )
    return done.stdout.strip()


def provenance() -> dict[str, str | None]:
    """The record a benchmark writes next to its figures."""
    source = Path(hicache.__file__).resolve().parent
    return {
        "hicache_version": str(hicache.__version__),
        "git_commit": git_commit(source),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "machine": platform.machine(),
    }
