"""Settings in words (gateway.settings.text), as `toolspan serve` says them: a refused setting is one
line naming where it came from, in words rather than pydantic's (issue 35), and --help shows each
option's default and variable.

A refused setting is repeated in its start-up error, which lands on a terminal, in a log and in CI
output: the credentials of a URL in it (a proxy's, an MCP server's) and an MCP server's headers are
masked there, wherever the value came from, while the line still says what is wrong and where."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gateway.cli.main import main
from gateway.demo.tools import demo_registry

SECRET = "hunter2"


@pytest.mark.parametrize(("variable", "value", "said"), [
    ("TOOLSPAN_UPSTREAM_PROXY", f"http://bob:{SECRET}@proxy.internal:99999",
     "'http://***@proxy.internal:99999' is not a proxy URL"),
    ("TOOLSPAN_UPSTREAM_PROXY", f"bob:{SECRET}@proxy.internal:x", "'***@proxy.internal:x' is not a proxy URL"),
    ("TOOLSPAN_UPSTREAM_PROXY", f"socks5://bob:{SECRET}@proxy.internal:1080", "only http:// proxies"),
    ("TOOLSPAN_UPSTREAM_PROXY", f"http://bob:{SECRET}@:3128", "is not a proxy URL"),
    ("HTTPS_PROXY", f"http://bob:{SECRET}@proxy.internal:99999", "HTTPS_PROXY: 'http://***@proxy.internal:99999'"),
    ("TOOLSPAN_MCP_SERVERS", json.dumps({"docs": {"url": f"http://bob:{SECRET}@mcp.internal/mcp", "command": "x",
                                                  "headers": {"Authorization": f"Bearer {SECRET}"}}}),
     "an MCP server needs exactly one of"),
], ids=["proxy-port", "proxy-without-scheme", "proxy-scheme", "proxy-host",
        "https_proxy-variable", "mcp-server"])
def test_a_refused_setting_is_said_without_its_credentials(
        clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], variable: str, value: str,
        said: str) -> None:
    clean_env.setenv(variable, value)
    assert main(["serve", "--port", "0", "--upstream", "https://provider.internal/v1"]) == 2
    err = capsys.readouterr().err
    assert SECRET not in err
    assert err.startswith(f"toolspan: {variable}")
    assert said in err
    assert "Traceback" not in err


def test_a_refused_proxy_in_the_config_file_is_said_without_its_credentials(
        clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(f'upstream = "https://provider.internal/v1"\nupstream_proxy = "http://bob:{SECRET}@:3128"\n')
    assert main(["serve", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert SECRET not in err
    assert f"toolspan: config file {config}, key upstream_proxy: 'http://***@:3128' is not accepted" in err


def test_a_refused_provider_url_is_said_without_its_credentials(
        clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--port", "0", "--upstream", f"ftp://bob:{SECRET}@provider.internal/v1"]) == 2
    err = capsys.readouterr().err
    assert SECRET not in err
    assert err == "toolspan: the provider's URL must be http(s)://host...: ftp://***@provider.internal/v1\n"


# --- settings errors in one line each (issue 35) ----------------------------------------------------

PYDANTIC_TEXT = ("validation error for", "EnvSettingsSource", "errors.pydantic.dev", "input_value", "[type=")


def refusal(capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    for text in PYDANTIC_TEXT:
        assert text not in err
    lines = err.splitlines()
    assert all(line.startswith("toolspan: ") for line in lines), lines
    return lines


def test_a_bad_environment_value_names_the_variable(clean_env: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    clean_env.setenv("TOOLSPAN_PORT", "many")
    clean_env.setenv("TOOLSPAN_LOG_FORMAT", "xml")
    assert refusal(capsys, "serve") == [
        "toolspan: TOOLSPAN_PORT: 'many' is not accepted: expected an integer from 0 to 65535",
        "toolspan: TOOLSPAN_LOG_FORMAT: 'xml' is not accepted: expected one of text, json"]


def test_a_bad_json_variable_names_it(clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    clean_env.setenv("TOOLSPAN_MCP_SERVERS", "{not json")
    [line] = refusal(capsys, "serve")
    assert line.startswith("toolspan: TOOLSPAN_MCP_SERVERS: '{not json' is not accepted: expected JSON, ")


def test_a_bad_config_value_names_the_key_and_hides_secrets(clean_env: pytest.MonkeyPatch, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "gw.toml"
    config.write_text('max_rounds = 0\n[keys.alice]\nkey = "short"\n')
    assert refusal(capsys, "serve", "--config", str(config)) == [
        f"toolspan: config file {config}, key keys.alice.key: (hidden) is not accepted: expected text of at "
        "least 8 characters",
        f"toolspan: config file {config}, key max_rounds: 0 is not accepted: expected an integer 1 or more"]
    assert "short" not in str(capsys.readouterr())


@pytest.mark.parametrize("kind", ["toml", "json"])
def test_an_unknown_config_key_gets_the_likely_one(clean_env: pytest.MonkeyPatch, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str], kind: str) -> None:
    config = tmp_path / f"gw.{kind}"
    config.write_text('{"prot": 9000, "mcp_servers": {"fs": {"comand": "x"}}}' if kind == "json"
                      else 'prot = 9000\n[mcp_servers.fs]\ncomand = "x"\n')
    lines = refusal(capsys, "serve", "--config", str(config))
    assert f"toolspan: config file {config}: unknown key 'prot': did you mean 'port'?" in lines
    assert f"toolspan: config file {config}: unknown key 'comand' in mcp_servers.fs: did you mean 'command'?" in lines


def test_a_validator_refusal_keeps_its_own_words(clean_env: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    clean_env.setenv("TOOLSPAN_TRACE_UI_URL", "ftp://x")
    assert refusal(capsys, "serve") == [
        "toolspan: TOOLSPAN_TRACE_UI_URL: 'ftp://x' is not accepted: trace_ui_url must be an http(s) URL "
        "containing {trace_id}"]


def test_a_bad_command_line_value_names_the_flag(clean_env: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    clean_env.setenv("TOOLSPAN_PORT", "8081")  # the flag wins, so the flag is named
    assert refusal(capsys, "serve", "--port", "70000") == [
        "toolspan: --port: 70000 is not accepted: expected an integer from 0 to 65535"]


def test_serve_help_shows_defaults_and_variables(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for option, shown in [("--port PORT", "(default: 8080; env TOOLSPAN_PORT)"),
                          ("--host HOST", "(default: 127.0.0.1; env TOOLSPAN_HOST)"),
                          ("--app-dir DIR", "(default: unset; env TOOLSPAN_APP_DIR)"),
                          ("--workers N", "(default: 1; env TOOLSPAN_WORKERS)")]:
        assert re.search(re.escape(option) + r" [^-]*" + re.escape(shown), text), (option, text)


def test_serve_help_says_which_tools_are_served_without_tools(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps at the terminal's width, hyphens too
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--help"])
    assert exited.value.code == 0
    said = re.search(r"--tools MODULE:ATTR \[MODULE:ATTR \.\.\.\] (.+?) --app-dir DIR ",
                     " ".join(capsys.readouterr().out.split()))
    assert said is not None
    served = demo_registry().names()
    assert said.group(1).endswith(f"(default: the example tools {', '.join(served[:-1])} and {served[-1]} without "
                                  "--upstream, none with it; env TOOLSPAN_TOOLS)")
