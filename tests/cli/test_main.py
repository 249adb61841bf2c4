"""The composition root (gateway.cli.main), in this process: loading tools, a bad config file, what
`toolspan serve` says when it starts. The command as a process of its own is
tests/cli/test_main_process.py's; settings precedence, tests/settings/test_model.py's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.cli.loading import StartupError, load_tools
from gateway.cli.main import describe_traces, main, startup_lines
from gateway.demo.tools import demo_registry
from gateway.settings.load import load_settings
from gateway.settings.model import Settings
from gateway.tools import Tool, ToolRegistry

FIXTURES = "tests.fixtures_tools"


# --- load_tools -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("specs", "expected"), [
    ([f"{FIXTURES}:registry"], ["shout", "whisper"]),
    ([f"{FIXTURES}:shout"], ["shout"]),
    ([f"{FIXTURES}:tool_list"], ["count_words"]),
    ([f"{FIXTURES}:tool_tuple"], ["count_words", "whisper"]),
    ([f"{FIXTURES}:tool_values"], ["shout", "count_words"]),
    ([f"{FIXTURES}:registry", f"{FIXTURES}:tool_list"], ["shout", "whisper", "count_words"]),
    ([], []),
], ids=["registry", "tool", "list", "tuple", "dict-values", "two-specs", "none"])
def test_load_tools(specs: list[str], expected: list[str]) -> None:
    registry = load_tools(specs)
    assert registry.names() == expected
    assert all(registry.get(name) is not None for name in expected)


@pytest.mark.parametrize(("specs", "message"), [
    (["no_colon_here"], "expected module:attribute"),
    ([":registry"], "expected module:attribute"),
    ([f"{FIXTURES}:"], "expected module:attribute"),
    (["tests.no_such_module_here:registry"], "cannot import 'tests.no_such_module_here'"),
    ([f"{FIXTURES}:missing"], f"module '{FIXTURES}' has no attribute 'missing'"),
    ([f"{FIXTURES}:not_a_tool"], "got int"),
    ([f"{FIXTURES}:mixed"], "got list"),
    ([f"{FIXTURES}:a_string"], "got str"),
    ([f"{FIXTURES}:by_name"], "got dict"),
    ([f"{FIXTURES}:registry", f"{FIXTURES}:shout"], "'shout' is already registered"),
], ids=["no-colon", "no-module-name", "no-attribute-name", "missing-module", "missing-attribute", "int",
        "list-with-a-string", "string", "dict", "duplicate-name"])
def test_bad_tool_specs_fail_naming_the_spec(specs: list[str], message: str) -> None:
    with pytest.raises(StartupError) as caught:
        load_tools(specs)
    text = str(caught.value)
    assert text.startswith(f"--tools {specs[-1]!r}: ")  # the spec at fault, not its neighbours
    assert message in text


# --- settings -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "content", "message"), [
    ("missing.toml", None, "does not exist"),
    ("typo.toml", 'prot = 9000\n', "prot"),
    ("bad.json", '{"port": "many"}', "port"),
], ids=["missing", "unknown-key", "wrong-type"])
def test_serve_with_a_bad_config_exits_2(clean_env: pytest.MonkeyPatch, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str], name: str, content: str | None,
                                         message: str) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    assert main(["serve", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("toolspan: ")
    assert message in err
    assert "Traceback" not in err


# --- what `toolspan serve` says when it starts ----------------------------------------------------

def _noop(args: dict[str, Any]) -> str:
    return ""


@pytest.mark.parametrize(("env", "expected"), [
    ({}, "not exported (set OTEL_EXPORTER_OTLP_ENDPOINT to send them to a collector)"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"}, "OTLP to http://collector:4318/v1/traces"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t/x"},
     "OTLP to http://t/x"),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, "OTLP to http://localhost:4318/v1/traces"),
    ({"OTEL_TRACES_EXPORTER": "console"}, "the console (stdout)"),
    ({"OTEL_TRACES_EXPORTER": "OTLP, console", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"},
     "OTLP to http://c:4318/v1/traces and the console (stdout)"),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"},
     "not exported (OTEL_TRACES_EXPORTER=none)"),
    ({"TOOLSPAN_TELEMETRY": "false", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, "off (telemetry = false)"),
    ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, "off (OTEL_SDK_DISABLED=true)"),
], ids=["nothing-set", "endpoint", "traces-endpoint", "otlp-default-endpoint", "console", "both", "none",
        "telemetry-off", "sdk-disabled"])
def test_the_traces_line_follows_the_otel_variables(clean_env: pytest.MonkeyPatch, env: dict[str, str],
                                                    expected: str) -> None:
    for name, value in env.items():
        clean_env.setenv(name, value)
    assert describe_traces(load_settings()) == expected


def test_startup_lines_with_the_builtin_model(clean_env: pytest.MonkeyPatch) -> None:
    registry = demo_registry()
    assert startup_lines("http://127.0.0.1:8080", load_settings(), registry, builtin_model=True) == [
        "listening on http://127.0.0.1:8080/v1",
        "upstream: the built-in scripted model (set --upstream for a provider)",
        f"tools: {', '.join(registry.names())}",
        "traces: not exported (set OTEL_EXPORTER_OTLP_ENDPOINT to send them to a collector)",
        "metrics: http://127.0.0.1:8080/metrics",
        f"trajectories: {load_settings().store_path()} (toolspan trajectories; the page: http://127.0.0.1:8080/ui)",
        "messages: not captured (spans and the page show tool calls, not the conversation); "
        "capture_message_content = true, or TOOLSPAN_CAPTURE_MESSAGE_CONTENT=true, keeps them",
        "mcp: http://127.0.0.1:8080/mcp",
    ]


def test_startup_lines_with_a_provider(clean_env: pytest.MonkeyPatch) -> None:
    settings = Settings(upstream="https://example.openai.azure.com", upstream_kind="azure", telemetry=False)
    many = ToolRegistry()
    for n in range(12):
        many.register(Tool(name=f"tool_{n}", description="does nothing", function=_noop))
    lines = startup_lines("http://0.0.0.0:8080", settings, many, builtin_model=False)
    assert lines[1:] == ["upstream: azure at https://example.openai.azure.com",
                         "tools: 12 loaded (GET /v1/tools lists them)",
                         "traces: off (telemetry = false)",
                         "metrics: off (telemetry = false)",
                         "trajectories: not recorded",
                         "mcp: http://0.0.0.0:8080/mcp"]
    assert startup_lines("http://h:1", settings, ToolRegistry(), builtin_model=False)[2] == (
        "tools: none (every tool call goes back to the client)")


def test_startup_lines_name_the_guardrails_only_when_some_are_set(clean_env: pytest.MonkeyPatch) -> None:
    guarded = Settings(telemetry=False, guardrails=["secrets", "injection"])
    assert startup_lines("http://h:1", guarded, ToolRegistry(), builtin_model=False)[3] == (
        "guardrails: secrets, injection (client results: mask, failure: deny)")
    keyed = Settings(telemetry=False, client_result_guardrails="block",
                     keys={"ci": {"key": "sk-ci-key-0001", "guardrails": ["url_hosts"]}})
    assert startup_lines("http://h:1", keyed, ToolRegistry(), builtin_model=False)[3] == (
        "guardrails: none for every call; more on some tools, keys or MCP servers (client results: block, "
        "failure: deny)")
    plain = Settings(telemetry=False)
    assert not [line for line in startup_lines("http://h:1", plain, ToolRegistry(), builtin_model=False)
                if line.startswith("guardrails")]



def test_startup_lines_print_the_routing_table(clean_env: pytest.MonkeyPatch) -> None:
    settings = Settings(upstream="https://api.openai.com/v1", telemetry=False, upstreams={
        "claude": {"url": "https://api.anthropic.com/v1", "kind": "anthropic", "models": ["claude-*"],
                   "aliases": {"sonnet": "claude-sonnet-4-5"}, "fallbacks": ["default"]}})
    lines = startup_lines("http://h:1", settings, ToolRegistry(), builtin_model=False)
    assert lines[1:4] == [
        "upstreams: 2, a request's model picks one; other models go to default",
        "  default (default): openai https://api.openai.com/v1: (no models)",
        "  claude: anthropic https://api.anthropic.com/v1: claude-*, sonnet -> claude-sonnet-4-5; falls back to "
        "default"]
    alone = Settings(telemetry=False, upstreams={"local": {"url": "http://vllm:8000/v1", "kind": "vllm"}})
    assert startup_lines("http://h:1", alone, ToolRegistry(), builtin_model=False)[1] == (
        "upstreams: 1, a request's model picks one; other models: 404 model_not_found (no default_upstream)")
