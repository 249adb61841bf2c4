"""Where the settings come from: command-line flags, then TOOLSPAN_* variables, then a config
file (TOML or JSON), read into one Settings; a refusal names the flag, variable or key at fault.
Also the two values read from the environment apart from Settings: a key a command of the
gateway's own sends as a client, and the proxy variables."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import (
    BaseSettings,
    JsonConfigSettingsSource,
    PydanticBaseSettingsSource,
    TomlConfigSettingsSource,
)
from pydantic_settings import SettingsError as PydanticSettingsError

from gateway.provider.proxies import PROXY_VARIABLES
from gateway.settings.model import Settings
from gateway.settings.text import SettingsInvalid, explain


def client_key(variable: str) -> str | None:
    """A key a command of the gateway's own sends as a client (`toolspan approvals`), from the environment."""
    return os.environ.get(variable)


def proxy_environment() -> dict[str, str]:
    """The proxy variables of the environment, in either case (gateway.provider.proxies reads them)."""
    return {name: value for name, value in os.environ.items() if name.lower() in PROXY_VARIABLES}


def _file_source(settings_cls: type[BaseSettings], path: Path) -> PydanticBaseSettingsSource:
    if path.suffix == ".json":
        return JsonConfigSettingsSource(settings_cls, json_file=path)
    return TomlConfigSettingsSource(settings_cls, toml_file=path)


def load_settings(flags: dict[str, Any] | None = None, config: Path | None = None) -> Settings:
    """Flags (None means "not given") win over TOOLSPAN_* variables, which win over the file. A
    refusal is a SettingsInvalid: one line per problem, naming the flag, variable or key."""
    given = {k: v for k, v in (flags or {}).items() if v is not None}
    try:
        return _load(given, config)
    except (ValidationError, PydanticSettingsError) as exc:
        raise explain(exc, Settings, given, os.environ, config) from None
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        kind = "JSON" if config is not None and config.suffix == ".json" else "TOML"
        raise SettingsInvalid([f"config file {config}: not valid {kind}: {exc}"]) from None


def _load(given: dict[str, Any], config: Path | None) -> Settings:
    if config is None:
        return Settings(**given)
    if not config.is_file():
        raise FileNotFoundError(f"config file {config} does not exist")
    path = config

    class FromFile(Settings):
        @classmethod
        def settings_customise_sources(cls, settings_cls: type[BaseSettings],
                                       init_settings: PydanticBaseSettingsSource,
                                       env_settings: PydanticBaseSettingsSource,
                                       dotenv_settings: PydanticBaseSettingsSource,
                                       file_secret_settings: PydanticBaseSettingsSource,
                                       ) -> tuple[PydanticBaseSettingsSource, ...]:
            return init_settings, env_settings, _file_source(settings_cls, path)

    return Settings.model_validate(FromFile(**given).model_dump())
