"""The engine-independent adapter parts: config resolution, namespaces and keys, failure log."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import pytest

from hicache.integrations.common import (
    ADAPTER_FINGERPRINT,
    FailureLog,
    Namespace,
    engine_key_from_hex,
    open_backend,
    resolve_storage_config,
)


def test_shipped_config_and_overrides() -> None:
    config = resolve_storage_config("remote", {"endpoint": "ipc:///tmp/x", "timeout_s": 1})
    assert config.backend == "remote"
    assert config.endpoint == "ipc:///tmp/x"
    assert config.timeout_s == 1.0
    assert config.fingerprint == ADAPTER_FINGERPRINT


def test_toml_path_and_ignored_engine_keys(tmp_path: Path) -> None:
    toml = tmp_path / "mine.toml"
    toml.write_text('[storage]\nbackend = "file"\npath = "/nowhere"\n')
    config = resolve_storage_config(
        str(toml), {"path": str(tmp_path), "module_path": "x"}, ignore={"module_path"}
    )
    assert (config.backend, config.path) == ("file", str(tmp_path))


def test_unknown_key_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match=r"unknown key 'endpiont'.*known:.*endpoint"):
        resolve_storage_config("remote", {"endpiont": "tcp://127.0.0.1:1"})


@pytest.mark.parametrize(
    ("name", "overrides", "match"),
    [
        ("no-such-config", {}, "no such file"),
        ("remote", {"timeout_s": "soon"}, "timeout_s"),
        ("remote", {"timeout_s": -1.0}, "timeout_s"),
        ("remote", {"endpoint": ["a"]}, "endpoint must be"),
        ("device-only", {}, "'none'"),
    ],
)
def test_bad_configs_raise_value_error(name: str, overrides: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        resolve_storage_config(name, overrides)


def test_namespace_keys_are_deterministic_and_separate() -> None:
    engine_key = engine_key_from_hex("ab" * 32)
    rank0 = Namespace.of({"model": "m", "tp_rank": 0})
    again = Namespace.of({"tp_rank": "0", "model": "m"})
    rank1 = Namespace.of({"model": "m", "tp_rank": 1})
    assert rank0.keyer().key(engine_key) == again.keyer().key(engine_key)
    assert rank0.keyer().key(engine_key) != rank1.keyer().key(engine_key)
    assert rank0.keyer().keys([engine_key]) == [hashlib.sha256(rank0.digest + engine_key).digest()]
    assert len(rank0.keyer().key(engine_key)) == 32
    assert "tp_rank=0" in rank0.describe()


@pytest.mark.parametrize("text", ["ab" * 31, "zz" * 32, ""])
def test_bad_engine_keys(text: str) -> None:
    with pytest.raises(ValueError):
        engine_key_from_hex(text)


def test_namespace_rejects_ambiguous_fields() -> None:
    with pytest.raises(ValueError):
        Namespace((("a", "1"), ("a", "2")))
    with pytest.raises(ValueError):
        Namespace.of({"a=b": "c"})


def test_failure_log_counts_and_falls_back(caplog: pytest.LogCaptureFixture) -> None:
    log = FailureLog(logging.getLogger("test.failures"))

    def boom() -> int:
        raise RuntimeError("down")

    with caplog.at_level(logging.WARNING):
        assert log.call("get failed", boom, 0) == 0
        assert log.call("get failed", boom, 0) == 0
        assert log.call("ok", lambda: 7, 0) == 7
    assert log.counts() == {"get failed": 2}
    assert log.total() == 2
    assert sum("get failed" in r.getMessage() for r in caplog.records) == 1


def test_open_backend_round_trip(tmp_path: Path) -> None:
    config = resolve_storage_config("default", {"path": str(tmp_path / "store")})
    backend = open_backend(config)
    try:
        key = b"k" * 32
        assert backend.put([key], [memoryview(b"page")]) == [True]
        dst = bytearray(4)
        assert backend.get([key], [memoryview(dst)]) == [True]
        assert bytes(dst) == b"page"
    finally:
        backend.close()
