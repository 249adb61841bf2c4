"""responses_mcp_servers and responses_mcp_runner: the servers a Responses request may declare as
`mcp` tools, as the settings take them, and what stops start-up."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.settings.load import load_settings

URL = "http://files.internal:8000/mcp"
AT_B = r"responses-mcp-servers \(at b\): not accepted: "  # how a refused entry's line starts


def servers(**entries: dict[str, Any]) -> dict[str, Any]:
    return {"responses_mcp_servers": entries}


def test_an_entry_takes_its_url_label_and_headers_from_the_environment(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("FILES_TOKEN", "Bearer s3cret")
    settings = load_settings(servers(files={"url": URL, "label": "docs", "headers": {"X-Team": "a"},
                                            "headers_env": {"Authorization": "FILES_TOKEN"}}))
    entry = settings.responses_mcp_servers["files"]
    assert (entry.url, entry.server_label("files"), entry.transport) == (URL, "docs", "streamable_http")
    assert {name: value.get_secret_value() for name, value in entry.headers.items()} == {
        "X-Team": "a", "Authorization": "Bearer s3cret"}
    assert "s3cret" not in repr(settings)
    assert load_settings(servers(files={"url": URL})).responses_mcp_servers["files"].server_label("files") == "files"


def test_the_runner_is_the_gateway_unless_set(clean_env: pytest.MonkeyPatch) -> None:
    assert load_settings().responses_mcp_runner == "gateway"
    assert load_settings().responses_mcp_servers == {}
    clean_env.setenv("TOOLSPAN_RESPONSES_MCP_RUNNER", "provider")
    assert load_settings().responses_mcp_runner == "provider"
    clean_env.setenv("TOOLSPAN_RESPONSES_MCP_RUNNER", "openai")
    with pytest.raises(ValueError, match=r"TOOLSPAN_RESPONSES_MCP_RUNNER: .openai. is not accepted"):
        load_settings()


def test_the_table_is_read_from_the_environment_and_a_config_file(clean_env: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    clean_env.setenv("TOOLSPAN_RESPONSES_MCP_SERVERS", f'{{"files": {{"url": "{URL}"}}}}')
    assert load_settings().responses_mcp_servers["files"].url == URL
    clean_env.delenv("TOOLSPAN_RESPONSES_MCP_SERVERS")
    config = tmp_path / "toolspan.toml"
    config.write_text(f'[responses_mcp_servers.files]\nurl = "{URL}"\nlabel = "docs"\n')
    assert load_settings(config=config).responses_mcp_servers["files"].label == "docs"


@pytest.mark.parametrize(("entries", "refusal"), [
    ({"files": {}}, "url"),
    ({"files": {"url": URL, "command": "python"}}, "command is for mcp_servers"),
    ({"files": {"url": URL, "args": ["-m", "x"]}}, "args is for mcp_servers"),
    ({"files": {"url": "ftp://files.internal/mcp"}}, "give an http"),
    ({"files": {"url": "http://user:pw@files.internal/mcp"}}, "no user info"),
    ({"files": {"url": URL + "?team=a"}}, "no user info, query"),
    ({"files": {"url": URL, "label": "has space"}}, "label 'has space'"),
    ({"a__b": {"url": URL}}, "MCP server name 'a__b'"),
    ({"x" * 33: {"url": URL}}, "up to 32"),
    ({"a": {"url": URL}, "b": {"url": "HTTP://Files.Internal:8000/mcp/"}}, AT_B + "its url is a's"),
    ({"a": {"url": URL}, "b": {"url": "http://other/mcp", "label": "a"}}, AT_B + "its label 'a' is a's"),
    ({"files": {"url": URL, "headers": {"Authorization": "x"}, "headers_env": {"Authorization": "FILES_TOKEN"}}},
     "both headers and headers_env"),
])
def test_bad_entries_stop_start_up(clean_env: pytest.MonkeyPatch, entries: dict[str, Any], refusal: str) -> None:
    clean_env.setenv("FILES_TOKEN", "t")
    with pytest.raises(ValueError, match=refusal):
        load_settings(servers(**entries))


@pytest.mark.parametrize("value", [None, ""])
def test_a_header_variable_not_set_stops_start_up_with_its_name(clean_env: pytest.MonkeyPatch,
                                                                value: str | None) -> None:
    clean_env.delenv("FILES_TOKEN", raising=False)
    if value is not None:
        clean_env.setenv("FILES_TOKEN", value)
    with pytest.raises(ValueError, match="headers_env names FILES_TOKEN for header 'Authorization', and it is not set"):
        load_settings(servers(files={"url": URL, "headers_env": {"Authorization": "FILES_TOKEN"}}))


def test_a_name_of_mcp_servers_too_stops_start_up(clean_env: pytest.MonkeyPatch) -> None:
    refusal = r"responses-mcp-servers \(at files\): not accepted: mcp_servers has a server of that name too"
    with pytest.raises(ValueError, match=refusal):
        load_settings({"mcp_servers": {"files": {"command": "python"}}, **servers(files={"url": URL})})
