"""scripts/gpu_check.sh, checked without a GPU: syntax, arguments and the dry-run plan."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.sh"
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60, env=env
    )


def test_script_parses() -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)], timeout=30).returncode == 0


def test_dry_run_plans_every_step_into_one_folder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = run("--dry-run", "--out", str(out))
    assert done.returncode == 0, done.stderr
    plan = (out / "commands.log").read_text()
    assert "-m pytest -m gpu" in plan
    assert "tests/hicache/engine/test_cuda.py" in plan
    assert "bench transfer --device cuda --io-backend direct --json" in plan
    assert f"--json {out.resolve()}/transfer_direct.json" in plan
    summary = (out / "summary.txt").read_text().splitlines()
    assert {line.split()[0] for line in summary} >= {"pytest_gpu", "engine_cuda", "environment"}
    assert all("skipped" in line for line in summary)  # a dry run runs nothing


def test_missing_modules_install_from_the_wheel_dir(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    fake = tmp_path / "python"  # an interpreter on which every import fails
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    out = tmp_path / "out"
    done = run("--dry-run", "--wheels", str(wheels), "--python", str(fake), "--out", str(out))
    assert done.returncode == 0, done.stderr
    install = next(
        line
        for line in (out / "commands.log").read_text().splitlines()
        if line.startswith("install:")
    )
    assert f"--no-index --find-links {wheels}" in install
    assert "lmdb" in install and "pyzmq" in install


def test_out_defaults_to_the_env_var(tmp_path: Path) -> None:
    import os

    env = {**os.environ, "OUT": str(tmp_path / "from-env")}
    assert run("--dry-run", env=env).returncode == 0
    assert (tmp_path / "from-env" / "commands.log").exists()


@pytest.mark.parametrize(
    "args",
    [["--bogus"], ["--wheels", "/nonexistent/wheels"], ["--step-timeout", "soon"], ["--out"]],
)
def test_bad_arguments_are_refused(tmp_path: Path, args: list[str]) -> None:
    done = run(*args, "--dry-run") if args != ["--out"] else run(*args)
    assert done.returncode == 2
    assert "gpu_check.sh" in done.stderr or "needs" in done.stderr
