"""A refused setting is repeated in its start-up error, which lands on a terminal, in a log and in CI
output: the credentials of a URL in it (a proxy's, an MCP server's) and an MCP server's headers are
masked there, wherever the value came from, while the line still says what is wrong and where."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.cli.main import main

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
