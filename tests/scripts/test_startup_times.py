"""scripts/startup_times.py runs and prints a figure for every command it times."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "startup_times.py"


def test_startup_times_prints_every_row(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--runs", "1"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.endswith("×")]
    names = ("python -c pass", "hicache --help", "hicache --version", "hicache serve")
    assert len(rows) == len(names)
    for row, name in zip(rows, names, strict=True):
        assert row.startswith(name)
