"""docs/toolspan.example.toml is what gateway.cli.config_example makes from Settings, and every line of
it means what it says: uncommented, each setting's line gives that setting's default."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from gateway.cli import config_example
from gateway.settings.load import load_settings
from gateway.settings.model import Settings
from gateway.settings.parts import GatewayKey, McpServer

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "toolspan.example.toml"
REGENERATE = "python -m gateway.cli.config_example docs/toolspan.example.toml"
ASSIGNMENT = re.compile(r"^#(?=[a-z])(.*)$")  # "#name = value"; prose is "# ..."


def uncommented(block: str) -> str:
    return "\n".join(m.group(1) for line in block.splitlines() if (m := ASSIGNMENT.match(line)))


def top_level(text: str) -> str:
    return text.split("# " + "-" * 98)[0]


def table(text: str, name: str) -> str:
    return text.split(f"#[{name}.NAME]\n")[1].split("\n\n")[0]


def test_the_checked_in_example_is_what_the_generator_makes() -> None:
    assert EXAMPLE.read_text(encoding="utf-8") == config_example.render(), (
        f"docs/toolspan.example.toml is out of date with gateway/settings/model.py: run `{REGENERATE}`")


def test_every_setting_is_there_with_its_variable_and_a_description() -> None:
    text = config_example.render()
    for name, field in Settings.model_fields.items():
        assert field.description, f"setting {name} has no description (the example file shows it)"
        assert re.search(rf"^(#{name} = |# {name}: |# none by default: one \[{name}\.NAME\]|# a \[{name}\] table)",
                         text, re.M), name
    for variable in ("TOOLSPAN_HOST", "TOOLSPAN_UPSTREAM_API_KEY", "TOOLSPAN_KEYS (JSON)", "OTEL_SERVICE_NAME",
                     "TOOLSPAN_REDACT_KEYS (JSON)"):
        assert f"# variable: {variable}\n" in text
    for model, name in ((McpServer, "mcp_servers"), (GatewayKey, "keys")):
        block = table(text, name)
        for field_name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{field_name} has no description"
            assert re.search(rf"^(#{field_name} = |# {field_name}: )", block, re.M), field_name


def test_uncommenting_every_setting_changes_nothing(tmp_path: Path) -> None:
    config = tmp_path / "toolspan.toml"
    config.write_text(uncommented(top_level(config_example.render())), encoding="utf-8")
    written = tomllib.loads(config.read_text(encoding="utf-8"))
    assert {"host", "port", "redact_keys", "max_body_bytes", "otel_propagators"} <= written.keys()
    assert load_settings(None, config).model_dump() == Settings().model_dump()


def test_uncommenting_the_example_tables_gives_their_defaults() -> None:
    text = config_example.render()
    server = tomllib.loads(uncommented(table(text, "mcp_servers")) + '\ncommand = "npx"')
    assert McpServer.model_validate(server) == McpServer(command="npx")
    key = tomllib.loads(uncommented(table(text, "keys")) + '\nkey = "tsk-0123456789"')
    assert GatewayKey.model_validate(key) == GatewayKey(key="tsk-0123456789")


def test_the_command_writes_the_file_or_prints_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "example.toml"
    assert config_example.main([str(target)]) == 0
    assert target.read_text(encoding="utf-8") == config_example.render()
    assert config_example.main([]) == 0
    assert capsys.readouterr().out == config_example.render()
    assert config_example.main(["--bogus"]) == 2
    assert "usage: python -m gateway.cli.config_example" in capsys.readouterr().err
