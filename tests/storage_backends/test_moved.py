"""Module paths of ``storage_backends`` that moved into a sub-package per backend (and the store
tools into ``tools``) keep importing for one release, with a warning, whether or not ``hicache``
was imported: ``storage_backends`` installs the finder for its own map."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from storage_backends import _moved


def _fresh(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        monkeypatch.delitem(sys.modules, loaded)


@pytest.mark.parametrize("old", sorted(_moved.MOVED))
def test_an_old_path_warns_and_is_the_module_at_its_new_path(
    old: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    new = importlib.import_module(_moved.MOVED[old])
    _fresh(old, monkeypatch)
    with pytest.warns(DeprecationWarning, match=_moved.MOVED[old]):
        module = importlib.import_module(old)
    assert module is new
    assert module.__spec__ is not None and module.__spec__.name == new.__name__


def test_an_old_path_works_without_hicache() -> None:
    """The layer rule: ``storage_backends`` imports nothing of ``hicache``, aliases included."""
    code = (
        "import sys, warnings\n"
        "warnings.simplefilter('error', DeprecationWarning)\n"
        "try:\n"
        "    import storage_backends.lmdb_backend\n"
        "except DeprecationWarning as w:\n"
        "    assert 'storage_backends.lmdb.backend' in str(w), w\n"
        "warnings.simplefilter('ignore', DeprecationWarning)\n"
        "from storage_backends.lmdb_backend import LmdbBackend\n"
        "from storage_backends.lmdb.backend import LmdbBackend as new\n"
        "assert LmdbBackend is new\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'hicache'], 'hicache imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_python_m_with_an_old_path_runs_the_module_at_its_new_path(tmp_path: Path) -> None:
    """``python -m storage_backends.lmdb_check DIR`` (the child-process check's old command)."""
    command = [sys.executable, "-W", "default", "-m", "storage_backends.lmdb_check", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert "moved to storage_backends.lmdb.check" in done.stderr
    assert "FileNotFoundError" in done.stderr and "data.mdb" in done.stderr  # no store there
    assert done.returncode == 1


def test_public_names_and_registered_backends_need_no_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        from storage_backends import BACKENDS, StorageConfig, create
        from storage_backends.builtins import BUILTIN_BACKENDS

        for target in BUILTIN_BACKENDS.values():
            module, _, cls = target.partition(":")
            if "mooncake" not in module:  # an optional extra: its module imports it
                assert isinstance(getattr(importlib.import_module(module), cls), type)
    assert set(BUILTIN_BACKENDS) <= set(BACKENDS)
    assert callable(create) and StorageConfig.__name__ == "StorageConfig"


def test_a_path_that_never_existed_still_fails() -> None:
    assert _moved.new_name("storage_backends.no_such_module", _moved.MOVED) is None
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("storage_backends.no_such_module")
