"""Settings (gateway.settings.model): its defaults, then the config file, the environment and the
flags, each over the one before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.settings.load import load_settings


def write_config(tmp_path: Path, kind: str, values: dict[str, Any]) -> Path:
    path = tmp_path / f"toolspan.{kind}"
    if kind == "json":
        path.write_text(json.dumps(values))
    else:
        path.write_text("".join(f"{key} = {json.dumps(value)}\n" for key, value in values.items()))
    return path


CONFIG = {"host": "10.0.0.1", "port": 7001, "max_rounds": 3, "tools": ["a.b:c"], "upstream_api_key": "sk-file"}
CONFIG_KINDS = pytest.mark.parametrize("kind", ["toml", "json"])


def test_defaults(clean_env: pytest.MonkeyPatch) -> None:
    settings = load_settings()
    assert (settings.host, settings.port, settings.upstream, settings.max_rounds) == ("127.0.0.1", 8080, None, 10)
    assert settings.tools == []
    assert settings.upstream_api_key is None


@CONFIG_KINDS
def test_config_file_over_defaults(clean_env: pytest.MonkeyPatch, tmp_path: Path, kind: str) -> None:
    settings = load_settings(config=write_config(tmp_path, kind, CONFIG))
    assert (settings.host, settings.port, settings.max_rounds, settings.tools) == ("10.0.0.1", 7001, 3, ["a.b:c"])
    assert settings.upstream_api_key is not None
    assert settings.upstream_api_key.get_secret_value() == "sk-file"
    assert settings.tool_timeout_seconds == 30.0  # not in the file: the default


@CONFIG_KINDS
def test_environment_over_config_file(clean_env: pytest.MonkeyPatch, tmp_path: Path, kind: str) -> None:
    clean_env.setenv("TOOLSPAN_PORT", "7002")
    clean_env.setenv("TOOLSPAN_TOOLS", '["x.y:z"]')
    settings = load_settings(config=write_config(tmp_path, kind, CONFIG))
    assert (settings.port, settings.tools) == (7002, ["x.y:z"])
    assert (settings.host, settings.max_rounds) == ("10.0.0.1", 3)  # still from the file


@CONFIG_KINDS
def test_flags_over_environment_and_file(clean_env: pytest.MonkeyPatch, tmp_path: Path, kind: str) -> None:
    clean_env.setenv("TOOLSPAN_PORT", "7002")
    clean_env.setenv("TOOLSPAN_HOST", "10.0.0.2")
    flags = {"port": 7003, "host": None, "upstream": "http://provider/v1", "tools": None}
    settings = load_settings(flags, write_config(tmp_path, kind, CONFIG))
    assert settings.port == 7003
    assert settings.host == "10.0.0.2"  # a flag left out (None) does not hide the variable
    assert settings.upstream == "http://provider/v1"
    assert settings.tools == ["a.b:c"]  # neither flag nor variable: the file


def test_flags_over_environment_without_a_file(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("TOOLSPAN_PORT", "7002")
    clean_env.setenv("TOOLSPAN_MAX_ROUNDS", "4")
    settings = load_settings({"port": 8080})  # the default value, given on purpose, still wins
    assert (settings.port, settings.max_rounds) == (8080, 4)


def test_missing_config_file(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_settings(config=tmp_path / "nope.toml")


@CONFIG_KINDS
def test_unknown_key_in_config_file(clean_env: pytest.MonkeyPatch, tmp_path: Path, kind: str) -> None:
    with pytest.raises(ValueError, match="prot"):
        load_settings(config=write_config(tmp_path, kind, {"prot": 9000}))


def test_logging_settings(clean_env: pytest.MonkeyPatch) -> None:
    settings = load_settings()
    assert (settings.access_log, settings.log_level, settings.log_format) == (True, "info", "text")
    clean_env.setenv("TOOLSPAN_ACCESS_LOG", "false")
    clean_env.setenv("TOOLSPAN_LOG_LEVEL", "WARNING")  # any case
    clean_env.setenv("TOOLSPAN_LOG_FORMAT", "json")
    settings = load_settings()
    assert (settings.access_log, settings.log_level, settings.log_format) == (False, "warning", "json")
    assert load_settings({"log_level": "debug", "access_log": True}).log_level == "debug"  # flags win


def test_an_unknown_log_level_is_refused(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("TOOLSPAN_LOG_LEVEL", "verbose")
    with pytest.raises(ValueError, match="TOOLSPAN_LOG_LEVEL: 'verbose' is not accepted: expected one of debug, "):
        load_settings()
