"""The ``hicache`` command line: flags, shipped configs, clear refusals."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

import hicache
from hicache.cli import main
from hicache.cli_common import config_keys, resolve_config, shipped_configs

REPO = Path(__file__).resolve().parents[2]
TINY_TREE = ["--conversations", "2", "--turns", "1"]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"hicache {hicache.__version__}"


def test_shipped_configs_match_the_top_level_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    top = sorted(p.stem for p in (REPO / "configs").glob("*.toml"))
    assert shipped_configs() == top and "default" in top and "device-only" in top
    monkeypatch.chdir(tmp_path)  # far from the repository
    for name in top:
        assert resolve_config(name).read_bytes() == (REPO / "configs" / f"{name}.toml").read_bytes()


def test_config_by_name_works_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("default", "device-only"):
        assert main(["bench", "tree", "--config", name, *TINY_TREE]) == 0


def test_verbose_after_the_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "tree", "-v", *TINY_TREE]) == 0
    assert main(["-v", "bench", "tree", *TINY_TREE]) == 0


def test_help_shows_defaults_and_no_rest(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "tiering", "--help"])
    text = capsys.readouterr().out
    assert "``" not in text
    assert "(default: 48)" in text and "(default: default)" in text


def test_unknown_set_key_names_the_flag_and_the_nearest_key(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench", "tiering", "--set", "policy.prefetch_treshold=3"]) == 2
    err = capsys.readouterr().err
    assert "--set policy.prefetch_treshold" in err and "policy.prefetch_threshold" in err


def test_every_config_key_is_known() -> None:
    keys = config_keys()
    assert "storage.backend" in keys and "model.num_layers" in keys and "metrics.port" in keys


def test_missing_config_lists_the_shipped_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "tree", "--config", "no-such-config"]) == 2
    assert "device-only" in capsys.readouterr().err


def test_transfer_bench_honours_model_overrides(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "transfer", "--set", "model.num_layers=4", "--set", "device.device=cpu"]
    argv += ["--op-mb", "1", "--page-tokens", "16", "--layouts", "page_first", "--repeat", "1"]
    assert main(argv) == 0
    assert "(4 layers)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("bench", "key"),
    [
        ("transfer", "storage.backend=file"),
        ("tree", "model.num_layers=4"),
        ("storage", "host.ratio=3"),
    ],
)
def test_a_set_that_a_bench_would_ignore_is_refused(
    bench: str, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", bench, "--set", key]) == 2
    err = capsys.readouterr().err
    assert f"--set {key.split('=')[0]}" in err and "does not read" in err


def test_missing_extra_gives_a_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    out = tmp_path / "out"
    assert main(["bench", "tiering", "--out", str(out)]) == 2
    assert "hicache[bench]" in capsys.readouterr().err
    assert not out.exists()  # refused before any work, nothing half-written


def test_metrics_port_in_use_names_port_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv = ["bench", "tiering", "--clients", "2", "--rounds", "1", "--out", str(tmp_path)]
        assert main([*argv, "--set", f"metrics.port={port}"]) == 2
    err = capsys.readouterr().err
    assert f"metrics.port {port}" in err and "in use" in err


def test_the_wheel_ships_the_configs(tmp_path: Path) -> None:
    """Built as users get it (a wheel), the package carries every config. The build
    runs on a copy: setuptools writes build/ and *.egg-info next to the sources."""
    import shutil
    import subprocess
    import zipfile

    source = tmp_path / "src"
    skip = shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", ".*cache", "bench-out", "tests"
    )
    shutil.copytree(REPO, source, symlinks=True, ignore=skip)
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    subprocess.run(
        [*cmd, "--quiet", "-w", str(tmp_path), str(source)],
        check=True,
        timeout=240,
        capture_output=True,
        cwd=tmp_path,
    )
    (wheel,) = tmp_path.glob("hicache-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for config in (REPO / "configs").glob("*.toml"):
        assert f"hicache/configs/{config.name}" in names
