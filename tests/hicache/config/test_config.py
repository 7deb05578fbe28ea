from __future__ import annotations

from pathlib import Path

import pytest

from hicache.config.cache import CacheConfig, parse_override

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("name", ["default.toml", "device-only.toml"])
def test_shipped_configs_load(name: str) -> None:
    cfg = CacheConfig.from_toml(REPO / "configs" / name)
    assert cfg.device.page_size >= 1
    assert cfg.model.kv_shape().num_layers == cfg.model.num_layers


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def test_unknown_key_names_file_key_and_the_nearest(tmp_path: Path) -> None:
    path = _write(tmp_path, "[device]\npage_sise = 16\n")
    with pytest.raises(ValueError) as info:
        CacheConfig.from_toml(path)
    assert (
        str(info.value) == f"{path}: device.page_sise: unknown key; did you mean device.page_size?"
    )
    with pytest.raises(ValueError, match=r"c\.toml: devise: unknown key; did you mean device\?"):
        CacheConfig.from_toml(_write(tmp_path, "[devise]\npage_size = 16\n"))
    # A key in the wrong table: the nearest key anywhere.
    with pytest.raises(ValueError, match=r"host\.page_size: unknown key; did you mean device\."):
        CacheConfig.from_toml(_write(tmp_path, "[host]\npage_size = 16\n"))
    with pytest.raises(ValueError, match=r"device\.zzz: unknown key; known: device\.device, "):
        CacheConfig.from_toml(_write(tmp_path, "[device]\nzzz = 16\n"))


def test_set_errors_name_the_flag_not_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "[device]\npage_size = 16\n")
    cases = {
        "device.page_size": ("abc", '--set device.page_size: expected an integer, got "abc"'),
        "host.ratio": (True, "--set host.ratio: expected a number, got true"),
        "host.enabled": (1, "--set host.enabled: expected true or false, got 1"),
        "device.num_tokens": (-16, "--set device.num_tokens: must be >= 0"),
        "policy.prefetch_treshold": (3, "--set policy.prefetch_treshold: unknown key; did you "),
    }
    for key, (value, message) in cases.items():
        with pytest.raises(ValueError) as info:
            CacheConfig.from_toml(path, {key: value})
        assert str(info.value).startswith(message), info.value
        assert str(path) not in str(info.value)


def test_wrong_type_and_range(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"c\.toml: device\.page_size: expected an integer"):
        CacheConfig.from_toml(_write(tmp_path, '[device]\npage_size = "16"\n'))
    with pytest.raises(ValueError, match=r"device\.page_size"):
        CacheConfig.from_toml(_write(tmp_path, "[device]\npage_size = 0\n"))
    with pytest.raises(ValueError, match=r"policy\.eviction"):
        CacheConfig.from_toml(_write(tmp_path, '[policy]\neviction = "mru"\n'))
    with pytest.raises(ValueError, match=r"c\.toml: host\.enabled: expected true or false"):
        CacheConfig.from_toml(_write(tmp_path, "[host]\nenabled = 1\n"))
    with pytest.raises(ValueError, match=r"c\.toml: host\.ratio: expected a number, got true"):
        CacheConfig.from_toml(_write(tmp_path, "[host]\nratio = true\n"))
    with pytest.raises(ValueError, match=r"c\.toml: host: expected a table, got 3"):
        CacheConfig.from_toml(_write(tmp_path, "host = 3\n"))
    with pytest.raises(ValueError, match="invalid TOML"):
        CacheConfig.from_toml(_write(tmp_path, "[device\n"))


def test_overrides_win_and_are_validated(tmp_path: Path) -> None:
    path = _write(tmp_path, "[device]\npage_size = 16\nnum_tokens = 1024\n")
    cfg = CacheConfig.from_toml(path, {"device.page_size": 64, "policy.eviction": "lfu"})
    assert cfg.device.page_size == 64 and cfg.policy.eviction == "lfu"
    with pytest.raises(ValueError, match=r"c\.toml: device\.num_tokens: must be a multiple"):
        CacheConfig.from_toml(path, {"device.page_size": 48})
    with pytest.raises(ValueError):
        CacheConfig.from_toml(path, {"nosection": 1})


def test_parse_override() -> None:
    assert parse_override("device.page_size=64") == ("device.page_size", 64)
    assert parse_override("host.layout=page_first").value == "page_first"
    assert parse_override('storage.path="/tmp/x"').value == "/tmp/x"
    assert parse_override("host.enabled=false").value is False
    with pytest.raises(ValueError, match=r"--set 'page_size': expected section\.key=value"):
        parse_override("page_size")


@pytest.mark.parametrize("name", ["default", "device-only", "remote"])
def test_shipped_configs_load_by_name_from_anywhere(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert CacheConfig.shipped(name) == CacheConfig.from_toml(REPO / "configs" / f"{name}.toml")
    assert CacheConfig.shipped(name, {"device.page_size": 32}).device.page_size == 32


def test_a_daemon_config_is_no_shipped_cache_config() -> None:
    with pytest.raises(ValueError, match="no shipped cache config 'daemon'; shipped: default"):
        CacheConfig.shipped("daemon")


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
    with pytest.raises(ValueError, match=rf"c\.toml: {key}: must be a finite number"):
        CacheConfig.from_toml(_write(tmp_path, text))


def test_non_finite_override_names_key() -> None:
    with pytest.raises(ValueError, match=r"--set host\.ratio: must be a finite number"):
        CacheConfig.from_mapping({}, {"host.ratio": float("inf")})
