from __future__ import annotations

from pathlib import Path

import pytest

from hicache.config import CacheConfig, parse_override

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["default.toml", "device-only.toml"])
def test_shipped_configs_load(name: str) -> None:
    cfg = CacheConfig.from_toml(REPO / "configs" / name)
    assert cfg.device.page_size >= 1
    assert cfg.model.kv_shape().num_layers == cfg.model.num_layers


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def test_unknown_key_names_key_and_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "[device]\npage_sise = 16\n")
    with pytest.raises(ValueError, match=r"c\.toml.*device\.'?page_sise"):
        CacheConfig.from_toml(path)
    with pytest.raises(ValueError, match="unknown key 'devise'"):
        CacheConfig.from_toml(_write(tmp_path, "[devise]\npage_size = 16\n"))


def test_wrong_type_and_range(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"device\.page_size: expected an integer"):
        CacheConfig.from_toml(_write(tmp_path, '[device]\npage_size = "16"\n'))
    with pytest.raises(ValueError, match=r"device\.page_size"):
        CacheConfig.from_toml(_write(tmp_path, "[device]\npage_size = 0\n"))
    with pytest.raises(ValueError, match=r"policy\.eviction"):
        CacheConfig.from_toml(_write(tmp_path, '[policy]\neviction = "mru"\n'))
    with pytest.raises(ValueError, match=r"host\.enabled"):
        CacheConfig.from_toml(_write(tmp_path, "[host]\nenabled = 1\n"))
    with pytest.raises(ValueError, match="invalid TOML"):
        CacheConfig.from_toml(_write(tmp_path, "[device\n"))


def test_overrides_win_and_are_validated(tmp_path: Path) -> None:
    path = _write(tmp_path, "[device]\npage_size = 16\nnum_tokens = 1024\n")
    cfg = CacheConfig.from_toml(path, {"device.page_size": 64, "policy.eviction": "lfu"})
    assert cfg.device.page_size == 64 and cfg.policy.eviction == "lfu"
    with pytest.raises(ValueError, match="num_tokens"):
        CacheConfig.from_toml(path, {"device.page_size": 48})
    with pytest.raises(ValueError):
        CacheConfig.from_toml(path, {"nosection": 1})


def test_parse_override() -> None:
    assert parse_override("device.page_size=64") == ("device.page_size", 64)
    assert parse_override("host.layout=page_first").value == "page_first"
    assert parse_override('storage.path="/tmp/x"').value == "/tmp/x"
    assert parse_override("host.enabled=false").value is False
    with pytest.raises(ValueError):
        parse_override("page_size")


def test_float_fields_accept_ints() -> None:
    cfg = CacheConfig.from_mapping({"host": {"ratio": 3}})
    assert cfg.host.ratio == 3.0 and isinstance(cfg.host.ratio, float)


@pytest.mark.parametrize(
    "text",
    [
        "[host]\nratio = inf\n",
        "[device]\nsize_gb = inf\n",
        "[host]\nsize_gb = nan\n",
        "[storage]\ntimeout_s = inf\n",
        "[policy]\nprefetch_timeout_base_s = -inf\n",
    ],
)
def test_non_finite_numbers_name_key_and_file(tmp_path: Path, text: str) -> None:
    key = ".".join(part.strip("[] ") for part in text.split("=")[0].split("\n"))
    with pytest.raises(ValueError, match=rf"c\.toml.*{key}: must be a finite number"):
        CacheConfig.from_toml(_write(tmp_path, text))


def test_non_finite_override_names_key() -> None:
    with pytest.raises(ValueError, match=r"host\.ratio: must be a finite number"):
        CacheConfig.from_mapping({}, {"host.ratio": float("inf")})
