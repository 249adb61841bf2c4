"""The upstreams table in the settings (gateway.settings.upstreams, issue 55): read from the config
file (`[upstreams.azure-east]`) and from TOOLSPAN_UPSTREAMS (a JSON object by name); a bad table
refused at start-up in one line naming the entry and the field, wherever it came from."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from gateway.cli.main import main
from gateway.settings.load import load_settings
from gateway.settings.text import SettingsInvalid

SECRET = "sk-do-not-repeat-me"
EAST = {"url": "https://east.openai.azure.example/openai/v1", "kind": "azure", "api_key_env": "AZURE_EAST_KEY",
        "models": ["gpt-4o", "gpt-4o-mini*"], "aliases": {"fast": "gpt-4o-mini"}, "fallbacks": ["west"],
        "apis": ["chat"], "timeout_seconds": 40}
WEST = {"url": "https://west.openai.azure.example/openai/v1", "kind": "azure", "models": ["gpt-4o"]}


def toml_file(tmp_path: Path, text: str) -> Path:
    config = tmp_path / "gateway.toml"
    config.write_text(text)
    return config


def refused(config: Path | None = None) -> list[str]:
    with pytest.raises(SettingsInvalid) as caught:
        load_settings(config=config)
    return caught.value.lines


def test_the_config_file_table_loads(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = toml_file(tmp_path, """
default_upstream = "west"
load_balancing = "least_in_flight"

[upstreams.azure-east]
url = "https://east.openai.azure.example/openai/v1/"
kind = "azure"
api_key_env = "AZURE_EAST_KEY"
models = ["gpt-4o", "gpt-4o-mini*"]
aliases = { fast = "gpt-4o-mini" }
fallbacks = ["west"]
apis = ["chat"]
timeout_seconds = 40

[upstreams.west]
url = "https://west.openai.azure.example/openai/v1"
kind = "azure"
models = ["gpt-4o"]
""")
    clean_env.setenv("AZURE_EAST_KEY", "sk-east")
    settings = load_settings(config=config)
    assert list(settings.upstreams) == ["azure-east", "west"]  # in the file's order: patterns match in it
    east = settings.upstreams["azure-east"]
    assert east.url == "https://east.openai.azure.example/openai/v1"  # the trailing slash gone
    assert (east.kind, east.models, east.aliases, east.fallbacks) == (
        "azure", ["gpt-4o", "gpt-4o-mini*"], {"fast": "gpt-4o-mini"}, ["west"])
    assert (east.served_apis(), settings.upstreams["west"].served_apis()) == (("chat",), ("chat", "responses"))
    assert east.timeout_seconds == 40.0
    key = east.key()
    assert key is not None
    assert key.get_secret_value() == "sk-east"
    assert (settings.default_upstream, settings.load_balancing) == ("west", "least_in_flight")


def test_the_environment_table_loads_as_a_json_object_by_name(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("TOOLSPAN_UPSTREAMS", json.dumps({"azure-east": EAST, "west": WEST}))
    clean_env.setenv("TOOLSPAN_COOLDOWN_FAILURES", "5")
    clean_env.setenv("AZURE_EAST_KEY", "sk-east")
    settings = load_settings()
    assert list(settings.upstreams) == ["azure-east", "west"]
    assert settings.upstreams["azure-east"].aliases == {"fast": "gpt-4o-mini"}
    assert settings.upstreams["west"].models == ["gpt-4o"]
    assert (settings.cooldown_failures, settings.cooldown_window_seconds, settings.cooldown_seconds) == (5, 30.0, 30.0)


def test_the_upstream_setting_and_a_table_live_side_by_side(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("TOOLSPAN_UPSTREAM", "https://api.openai.example/v1")
    clean_env.setenv("TOOLSPAN_UPSTREAMS", json.dumps({"west": {**WEST, "fallbacks": ["default"]}}))
    settings = load_settings()  # `default` names the `upstream` setting's, so west may fall back to it
    assert settings.upstreams["west"].fallbacks == ["default"]


def test_an_environment_key_named_but_unset_is_said(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("TOOLSPAN_UPSTREAMS", json.dumps({"azure-east": EAST, "west": WEST}))
    clean_env.delenv("AZURE_EAST_KEY", raising=False)
    line = ("TOOLSPAN_UPSTREAMS (at azure-east.api_key_env): (hidden) is not accepted: "
            "api_key_env names AZURE_EAST_KEY, which is not set")
    with pytest.raises(ValueError, match=f"^{re.escape(line)}$"):  # at start-up, not on the first call
        load_settings()


# --- a bad table: one line, naming the entry and the field -----------------------------------------

BAD_TABLES: list[tuple[str, str, str]] = [
    ('[upstreams.azure-east]\nurl = "https://east.example/v1"\nfallbacks = ["nowhere"]\n',
     "key upstreams.azure-east.fallbacks: ['nowhere'] is not accepted: 'nowhere' is not an upstream", "unknown"),
    ('[upstreams.azure-east]\nurl = "https://east.example/v1"\nfallbacks = ["azure-east"]\n',
     "key upstreams.azure-east.fallbacks: ['azure-east'] is not accepted: an upstream cannot fall back to itself",
     "self"),
    ('[upstreams.azure-east]\nurl = "https://east.example/v1"\naliases = { "fast*" = "gpt-4o-mini" }\n',
     "key upstreams.azure-east.aliases: not accepted: 'fast*' is a pattern; an alias is a name", "alias"),
    ('[upstreams.azure-east]\nurl = "ftp://east.example/v1"\n',
     "key upstreams.azure-east.url: 'ftp://east.example/v1' is not accepted: it must be an http:// or https:// "
     "URL", "url"),
    ('[upstreams.azure-east]\nkind = "azure"\n',
     "key upstreams.azure-east.url: required, and not given (expected text)", "no-url"),
    (f'[upstreams.azure-east]\nurl = "https://east.example/v1"\napi_key = "{SECRET}"\napi_key_env = "EAST"\n',
     "key upstreams.azure-east.api_key_env: (hidden) is not accepted: give api_key or api_key_env, not both",
     "both-keys"),
    ('default_upstream = "nowhere"\n[upstreams.azure-east]\nurl = "https://east.example/v1"\n',
     "key default_upstream: 'nowhere' is not accepted: 'nowhere' is not an upstream", "default"),
    ('upstream = "https://api.openai.example/v1"\n[upstreams.default]\nurl = "https://east.example/v1"\n',
     "key upstreams.default: not accepted: that name is the `upstream` setting's; give the entry another name",
     "default-clash"),
    ('[upstreams."azure east"]\nurl = "https://east.example/v1"\n',
     "key upstreams.azure east: not accepted: a name is letters, digits, '.', '_' and '-' (64 at most)", "name"),
    ('[upstreams.azure-east]\nurl = "https://east.example/v1"\nkind = "bedrock"\n',
     "key upstreams.azure-east.kind: 'bedrock' is not accepted: expected one of openai, azure, anthropic, vllm, "
     "ollama, deepseek, compatible", "kind"),
    ('[upstreams.azure-east]\nurl = "https://east.example/v1"\napis = ["completions"]\n',
     "key upstreams.azure-east.apis.0: 'completions' is not accepted: expected one of chat, responses, messages",
     "apis"),
]


@pytest.mark.parametrize(("text", "said"), [(text, said) for text, said, _ in BAD_TABLES],
                         ids=[name for _, _, name in BAD_TABLES])
def test_a_bad_table_in_the_config_file_is_one_line_naming_the_entry_and_field(
        clean_env: pytest.MonkeyPatch, tmp_path: Path, text: str, said: str) -> None:
    config = toml_file(tmp_path, text)
    assert refused(config) == [f"config file {config}, {said}"]


def test_a_bad_table_in_the_variable_names_the_variable_and_the_place_in_it(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("TOOLSPAN_UPSTREAMS", json.dumps({"azure-east": {**EAST, "fallbacks": ["nowhere"]}}))
    assert refused() == ["TOOLSPAN_UPSTREAMS (at azure-east.fallbacks): ['nowhere'] is not accepted: "
                         "'nowhere' is not an upstream"]
    entry: dict[str, Any] = {"url": "https://east.example/v1", "api_key": SECRET, "api_key_env": "EAST"}
    clean_env.setenv("TOOLSPAN_UPSTREAMS", json.dumps({"azure-east": entry}))
    [line] = refused()
    assert line == ("TOOLSPAN_UPSTREAMS (at azure-east.api_key_env): (hidden) is not accepted: give api_key or "
                    "api_key_env, not both")


def test_a_default_upstream_from_the_environment_names_its_variable(clean_env: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    config = toml_file(tmp_path, '[upstreams.azure-east]\nurl = "https://east.example/v1"\n')
    clean_env.setenv("TOOLSPAN_DEFAULT_UPSTREAM", "west")
    assert refused(config) == ["TOOLSPAN_DEFAULT_UPSTREAM: 'west' is not accepted: 'west' is not an upstream"]


def test_serve_stops_at_a_bad_table_with_the_one_line(clean_env: pytest.MonkeyPatch, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    config = toml_file(tmp_path, f'[upstreams.azure-east]\nurl = "https://east.example/v1"\napi_key = "{SECRET}"\n'
                                 'fallbacks = ["west"]\n')
    assert main(["serve", "--port", "0", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err == (f"toolspan: config file {config}, key upstreams.azure-east.fallbacks: ['west'] is not accepted: "
                   "'west' is not an upstream\n")
    assert SECRET not in err


def test_a_check_over_all_settings_is_said_without_repeating_them(clean_env: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    """A refusal by a check of the settings as a whole names no key it cannot point at, and does not
    repeat every setting given (as pydantic's input would)."""
    cert = tmp_path / "client.pem"
    config = toml_file(tmp_path, f'upstream = "https://api.openai.example/v1"\nupstream_client_key = "{cert}"\n'
                                 f'upstream_api_key = "{SECRET}"\n')
    [line] = refused(config)
    assert line == f"config file {config}: upstream_client_key is set without upstream_client_cert"


def test_a_models_fallbacks_must_name_upstreams(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("TOOLSPAN_UPSTREAMS", json.dumps({"west": WEST}))
    clean_env.setenv("TOOLSPAN_MODEL_FALLBACKS", json.dumps({"gpt-4o": ["west", "nowhere"]}))
    refusal = r"^TOOLSPAN_MODEL_FALLBACKS \(at gpt-4o\): .* is not accepted: 'nowhere' is not an upstream$"
    with pytest.raises(ValueError, match=refusal):
        load_settings()
    clean_env.setenv("TOOLSPAN_MODEL_FALLBACKS", json.dumps({"gpt-4o": ["west"]}))
    assert load_settings().routing_table().model_fallbacks == {"gpt-4o": ("west",)}
