"""Which hot path runs: the compiled modules (device_pool.native) or the pure ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from device_pool import native

ROOT = Path(__file__).resolve().parents[2]


def test_the_active_path_is_the_one_selected() -> None:
    """Compiled exactly when nothing rules it out; otherwise no hot module is."""
    import device_pool.page_table  # noqa: F401
    import hicache.cache  # noqa: F401

    hot = [f"{p}.{m}" for p, mods in native.HOT_MODULES.items() for m in mods]
    if native.why_pure("hicache.tree") is None and native.why_pure("device_pool") is None:
        assert native.compiled_modules() == hot, native.describe()
        assert native.describe().startswith("compiled")
    else:
        assert native.compiled_modules() == [], native.describe()
        assert native.describe().startswith("pure Python")


def test_hicache_pure_turns_the_compiled_path_off() -> None:
    env = {**os.environ, native.PURE_ENV: "1"}
    code = "import device_pool.native as n; print(n.describe())"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.startswith(f"pure Python ({native.PURE_ENV}=1)")


def _fake_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, digest: str | None) -> Path:
    build = tmp_path / "native"
    (build / "hicache" / "tree").mkdir(parents=True)
    for module in native.HOT_MODULES["hicache.tree"]:
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        (build / "hicache" / "tree" / f"{module}{suffix}").write_bytes(b"")
    manifest = {
        f"hicache.tree.{m}": digest or native.source_digest("hicache.tree", m)
        for m in native.HOT_MODULES["hicache.tree"]
    }
    (build / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setattr(native, "BUILD", build)
    monkeypatch.setattr(native, "MANIFEST", build / "manifest.json")
    monkeypatch.delenv(native.PURE_ENV, raising=False)
    return build


def test_a_current_build_goes_first_on_the_package_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build = _fake_build(tmp_path, monkeypatch, None)
    path = ["src"]
    native.use_compiled("hicache.tree", path)
    assert path == [str(build / "hicache" / "tree"), "src"]


def test_a_stale_build_is_never_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _fake_build(tmp_path, monkeypatch, "0" * 64)
    path = ["src"]
    native.use_compiled("hicache.tree", path)
    assert path == ["src"]
    assert "stale" in caplog.text


def test_no_build_and_pure_env_say_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "MANIFEST", tmp_path / "absent.json")
    monkeypatch.delenv(native.PURE_ENV, raising=False)
    assert "no compiled build" in str(native.why_pure("hicache.tree"))
    monkeypatch.setenv(native.PURE_ENV, "1")
    assert native.why_pure("device_pool") == f"{native.PURE_ENV}=1"
