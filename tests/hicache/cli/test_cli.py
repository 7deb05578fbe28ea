"""The ``hicache`` command line: flags, shipped configs, clear refusals."""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import hicache
from hicache.cli.app import build_parser, main
from hicache.config.flags import build_all
from hicache.config.loader import keys_of
from hicache.config.shipped import resolve_config, shipped_configs

REPO = Path(__file__).resolve().parents[3]
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
    from hicache.config.cache import CacheConfig

    keys = list(keys_of(CacheConfig))
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


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["bench", "tiering", "--clients", "-1"], "--clients"),
        (["bench", "tiering", "--rounds", "0"], "--rounds"),
        (["bench", "tiering", "--seed", "x"], "--seed"),
        (["bench", "tree", "--turns", "0"], "--turns"),
        (["bench", "transfer", "--repeat", "0"], "--repeat"),
        (["bench", "storage", "--total-mb", "-5"], "--total-mb"),
        (["bench", "engine", "--threads", "0"], "--threads"),
        (["bench", "daemon", "--clients", "0,4"], "--clients"),
        (["stats", "--timeout", "-1"], "--timeout"),
        (["serve", "--metrics-port", "-2"], "--metrics-port"),
    ],
)
def test_a_bad_argument_is_refused_in_one_line_naming_the_flag(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert f"argument {flag}" in last, last


def test_a_bench_offers_and_accepts_only_the_configs_it_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "tiering", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "a shipped cache config (default, device-only, remote)" in text
    assert main(["bench", "tiering", "--config", "daemon"]) == 2
    err = capsys.readouterr().err
    assert "--config daemon: a daemon config" in err and "default, device-only" in err
    assert "Traceback" not in err
    assert main(["bench", "daemon", "--config", "default"]) == 2
    assert "--config default: a cache config" in capsys.readouterr().err


def test_tiering_says_what_its_rows_are(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "tiering", "--config", "device-only", "--clients", "2", "--rounds", "1"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "storage tier: lmdb" not in out  # the old, misleading line
    assert "device+host+storage   device + host (2.0× the device pool) + storage (disk in a" in out
    assert "the config has no host tier: the host rows use host.ratio 2.0" in out
    assert "the config has no storage tier: the storage row uses disk" in out


def _commands() -> list[tuple[str, argparse.ArgumentParser]]:
    """Every leaf command of the tree, fully built."""
    parsers = build_all(build_parser())
    return [(prog, p) for prog, p in parsers if not p._subparsers]


def test_every_command_takes_v_and_every_config_reader_takes_config_and_set() -> None:
    no_config = {"hicache keygen", "hicache store verify", "hicache store migrate"}
    for prog, parser in _commands():
        options = {o for a in parser._actions for o in a.option_strings}
        assert "-v" in options, prog
        if prog in no_config:
            assert "--config" not in options and "--set" not in options, prog
        else:
            assert {"--config", "--set"} <= options, prog
    assert {prog for prog, _ in _commands()} >= no_config | {"hicache serve", "hicache stats"}


def test_every_option_has_help_and_shows_its_default() -> None:
    for prog, parser in build_all(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                assert all(c.help for c in action._choices_actions), prog
                continue
            assert action.help, f"{prog} {action.option_strings or action.dest}: no help"
            if not action.option_strings or action.nargs == 0:
                continue  # positionals; flags (off unless given)
            text = parser.formatter_class(prog)._get_help_string(action)  # type: ignore[attr-defined]
            assert "default" in text, f"{prog} {action.option_strings}: no default in {text!r}"


def test_top_level_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for command in ("serve", "keygen", "stats", "store inspect", "store verify", "store migrate"):
        assert f"hicache {command}" in out
    from hicache.cli.store import actions

    for action in actions():
        assert f"hicache store {action} PATH" in out
    from hicache.bench import BENCHMARKS

    for name in BENCHMARKS:
        assert f"hicache bench {name} " in out


def test_bench_help_is_for_users(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = capsys.readouterr().out
    assert "add_arguments" not in out and "module" not in out
    assert "tiering" in out and "What tiering buys" in out


def _modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code``."""
    script = f"import sys\n{code}\nprint(' '.join(sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    return set(out.stdout.split())


def test_help_version_and_serve_import_no_torch() -> None:
    help_ = "from hicache.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass"
    version = help_.replace("'--help'", "'--version'")
    # What ``hicache serve`` imports before it starts the daemon: its parser, its config.
    serve = (
        "from hicache.cli.app import build_parser\n"
        "args = build_parser().parse_args(['serve', '--set', 'store.memory_bytes=1'])\n"
        "from hicache.config.flags import load_daemon_config\n"
        "load_daemon_config(args)\n"
        "import hicache.daemon.server"
    )
    for code in (help_, version, serve):
        modules = _modules_after(code)
        assert "torch" not in modules, code
