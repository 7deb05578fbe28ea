"""The tree bench's SGLang loader: a clear reason when SGLang is missing, and
stand-ins for its unused GPU imports that libraries probing them see as absent."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from hicache.bench.tree import sglang_trees


def test_missing_sglang_is_a_clear_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        sglang_trees.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "sglang" else real(name, *a),
    )
    with pytest.raises(sglang_trees.SglangUnavailable, match="SGLang is not installed"):
        sglang_trees.load()


def test_stand_in_modules_import_and_look_absent() -> None:
    finder = sglang_trees._StubFinder(["hicache_test_absent_pkg"])
    sys.meta_path.insert(0, finder)
    try:
        import hicache_test_absent_pkg.sub as sub  # type: ignore[import-not-found]
        from hicache_test_absent_pkg import anything  # type: ignore[import-not-found]
    finally:
        sys.meta_path.remove(finder)
        for name in ("hicache_test_absent_pkg.sub", "hicache_test_absent_pkg"):
            sys.modules.pop(name, None)
    assert callable(anything) and sub.Whatever() is not None
    assert getattr(sub, "__file__", None) is None  # what transformers reads as "not installed"
