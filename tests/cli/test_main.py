"""The composition root: loading tools, settings precedence, and the `toolspan` command itself."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from gateway.cli.main import StartupError, describe_traces, load_tools, main, run, startup_lines
from gateway.demo.tools import demo_registry
from gateway.settings.model import Settings, load_settings
from gateway.tools import Tool, ToolRegistry

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = "tests.fixtures_tools"
LISTENING = re.compile(r"\blistening on (http://127\.0\.0\.1:\d+/v1)\b")  # in a text or a JSON log line
ACCESS = re.compile(r' INFO toolspan\.access: 127\.0\.0\.1 "(\w+) (\S+) HTTP/1\.1" (\d{3}) (\d+) ([\d.]+)ms '
                    r"trajectory=(\S+) trace=(\S+)$")
START_TIMEOUT = 30.0


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


# --- the command, in a subprocess -----------------------------------------------------------------

def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(("TOOLSPAN_", "OTEL_"))}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_toolspan(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", *args], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=timeout, check=False)


class Server:
    """`toolspan serve` in a child process; its output (stdout, and stderr where the logs go) read
    on a thread, line by line."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--port", "0", *args],
                                        cwd=ROOT, env={**child_env(), **(env or {})}, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, pattern: re.Pattern[str], what: str) -> re.Match[str]:
        """The first line from here on that `pattern` finds, waiting at most START_TIMEOUT."""
        seen: list[str] = []
        while True:
            try:
                line = self.lines.get(timeout=START_TIMEOUT)
            except queue.Empty:
                pytest.fail(f"no {what} line within {START_TIMEOUT} s; output so far: {seen}")
            if line is None:
                pytest.fail(f"toolspan serve exited ({self.process.wait()}) before a {what} line: {seen}")
            seen.append(line)
            if match := pattern.search(line):
                return match

    def url(self) -> str:
        """The base URL from the "listening" line."""
        return self.wait_for(LISTENING, "'listening'").group(1)

    def stop(self) -> tuple[int, str]:
        """SIGTERM; the exit code and everything the process wrote."""
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=20)
        self.reader.join(timeout=20)
        return code, "".join(self.output)


@pytest.fixture
def serve() -> Iterator[type[Server]]:
    started: list[Server] = []

    class Tracked(Server):
        def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
            super().__init__(*args, env=env)
            started.append(self)

    yield Tracked
    for server in started:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait(timeout=20)
        if server.process.stdout is not None:
            server.process.stdout.close()


def ask(url: str) -> tuple[str, str]:
    """One chat completion through the gateway at `url`; the trajectory and trace ids it answers with."""
    question = {"role": "user", "content": "What is the weather in Oslo?"}
    body = json.dumps({"model": "m", "messages": [question]}).encode()
    request = urllib.request.Request(f"{url}/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()
        return response.headers["X-Trajectory-Id"], response.headers["X-Trace-Id"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_until_up(server: Server, url: str) -> None:
    """For a server that says nothing: poll /healthz until it answers."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            pytest.fail(f"toolspan serve exited ({server.process.returncode}): {''.join(server.output)}")
        try:
            with urllib.request.urlopen(f"{url.removesuffix('/v1')}/healthz", timeout=5):
                return
        except OSError:
            time.sleep(0.1)
    pytest.fail(f"{url} did not answer within {START_TIMEOUT} s")


def test_serve_answers_through_the_builtin_model_and_stops_on_sigterm(serve: type[Server]) -> None:
    server = serve()
    url = server.url()
    with OpenAI(base_url=url, api_key="x", max_retries=0, timeout=30) as client:
        completion = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "What is the weather in Oslo?"}])
    answer = completion.choices[0].message.content or ""
    assert "Oslo" in answer
    assert completion.choices[0].finish_reason == "stop"
    code, err = server.stop()
    assert code == 0
    assert "Traceback" not in err


def test_serve_offers_the_tools_named_on_the_command_line(serve: type[Server]) -> None:
    server = serve("--tools", f"{FIXTURES}:registry", f"{FIXTURES}:tool_list")
    url = server.url()
    with urllib.request.urlopen(f"{url}/tools", timeout=30) as response:
        listing = json.load(response)
    assert [t["function"]["name"] for t in listing["data"]] == ["shout", "whisper", "count_words"]
    assert server.stop()[0] == 0


def test_serve_offers_the_example_tools_through_mcp(serve: type[Server]) -> None:
    server = serve("--mcp-examples")
    url = server.url()
    with urllib.request.urlopen(f"{url}/tools", timeout=30) as response:
        listing = json.load(response)
    assert [t["function"]["name"] for t in listing["data"]] == [
        "examples__get_weather", "examples__to_fahrenheit", "examples__echo"]
    with urllib.request.urlopen(f"{url.removesuffix('/v1')}/readyz", timeout=30) as response:
        ready = json.load(response)
    [examples] = ready["mcp_servers"]
    assert (examples["name"], examples["state"], examples["tools"]) == ("examples", "up", 3)
    assert server.stop()[0] == 0


def test_serve_with_unloadable_tools_exits_2() -> None:
    done = run_toolspan("serve", "--port", "0", "--tools", "nosuch:thing")
    assert done.returncode == 2
    assert "toolspan: --tools 'nosuch:thing': cannot import 'nosuch'" in done.stderr
    assert "Traceback" not in done.stderr
    assert "listening" not in done.stdout


@pytest.mark.parametrize(("api", "mcp"), [("chat", False), ("chat", True), ("responses", False), ("responses", True),
                                          ("messages", False)], ids=lambda value: str(value))
def test_demo_prints_the_trajectory(api: str, mcp: bool) -> None:
    done = run_toolspan("demo", "--api", api, *(["--mcp"] if mcp else []))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert ("Responses API" in out) is (api == "responses")
    assert ("Messages API" in out) is (api == "messages")
    assert out.count("model turn  chat toolspan-demo") == 4
    if mcp:  # the same session, its tools served by `toolspan mcp-examples` over stdio
        assert "tools: an MCP server over stdio (toolspan mcp-examples)" in out
        assert "tool call examples__get_weather: ok" in out
        assert "tool call examples__to_fahrenheit: ok" in out
        assert out.count("[MCP server 'examples', tools/call]") == 3
    else:
        assert "tool call get_weather: ok" in out
        assert "MCP server" not in out
    assert "rejected (missing_arguments)" in out
    assert "did you mean 'city'" in out
    assert re.search(r"^assistant: In \w+ it is .+$", out, re.MULTILINE)
    assert re.search(r"trace id: [0-9a-f]{32}$", out, re.MULTILINE)
    assert out.index("rejected (missing_arguments)") < out.index("\nassistant:")
    assert "toolspan.access" not in done.stderr  # no log lines: the trajectory is the output
    # Then the hand-back: the client's own tool is called, run by the client, and its result quoted.
    hand_back = out.split("\n--- a tool of the client's own (search_notes): the gateway hands its call back\n")[1]
    assert hand_back.startswith("user: What did I note about Lisbon?\n"
                                'gateway -> client: call search_notes({"query": "What did I note about Lisbon?"})')
    assert hand_back.rstrip().endswith("assistant: (scripted model) Your tool search_notes answered: Lisbon: the "
                                       "tram 28 leaves from Martim Moniz; go before 9.")


def test_the_gateway_runs_on_uvloop_where_it_is_installed() -> None:
    """uvloop is a dependency on this platform, so `toolspan serve` and `demo` run on its loop."""
    async def loop_module() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert run(loop_module()).startswith("uvloop")


# --- operating it: bind failures, the access log, log level and format ------------------------------

def test_serve_on_a_port_in_use_exits_2_with_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_toolspan("serve", "--port", str(port))
    assert done.returncode == 2
    assert re.fullmatch(rf"toolspan: cannot listen on 127\.0\.0\.1:{port}: [^\n]+\n", done.stderr), done.stderr
    assert "listening" not in done.stdout


def test_serve_logs_one_access_line_per_request(serve: type[Server]) -> None:
    server = serve()
    trajectory, trace = ask(server.url())
    method, path, status, size, ms, logged_trajectory, logged_trace = server.wait_for(ACCESS, "access").groups()
    assert (method, path, status) == ("POST", "/v1/chat/completions", "200")
    assert int(size) > 0
    assert float(ms) >= 0
    assert (logged_trajectory, logged_trace) == (trajectory, trace)
    assert re.fullmatch(r"[0-9a-f]{32}", trace)
    code, output = server.stop()
    assert code == 0
    assert sum(1 for line in output.splitlines() if ACCESS.search(line)) == 1  # not the built-in model's own


@pytest.mark.parametrize(("args", "env"), [((), {"TOOLSPAN_ACCESS_LOG": "false"}), (("--no-access-log",), {})],
                         ids=["env", "flag"])
def test_the_access_log_can_be_turned_off(serve: type[Server], args: tuple[str, ...], env: dict[str, str]) -> None:
    server = serve(*args, env=env)
    ask(server.url())
    code, output = server.stop()
    assert code == 0
    assert "toolspan.access" not in output
    assert " INFO toolspan: listening on " in output  # the other logs are still there


@pytest.mark.parametrize(("args", "env"), [(("--log-format", "json"), {}), ((), {"TOOLSPAN_LOG_FORMAT": "json"})],
                         ids=["flag", "env"])
def test_json_logs_are_one_object_a_line(serve: type[Server], args: tuple[str, ...], env: dict[str, str]) -> None:
    server = serve(*args, env=env)
    trajectory, trace = ask(server.url())
    server.wait_for(re.compile(r'"logger": "toolspan\.access"'), "access")
    code, output = server.stop()
    assert code == 0
    entries = [json.loads(line) for line in output.splitlines()]
    assert all({"time", "level", "logger", "message"} <= entry.keys() for entry in entries)
    said = {entry["message"].partition(":")[0] for entry in entries if entry["logger"] == "toolspan"}
    assert {"upstream", "tools", "traces", "metrics"} <= said
    [access] = [entry for entry in entries if entry["logger"] == "toolspan.access"]
    assert (access["level"], access["method"], access["path"], access["status"]) == (
        "info", "POST", "/v1/chat/completions", 200)
    assert (access["trajectory_id"], access["trace_id"]) == (trajectory, trace)


def test_log_level_warning_hides_info_lines(serve: type[Server]) -> None:
    port = free_port()
    server = serve("--port", str(port), "--log-level", "warning")
    url = f"http://127.0.0.1:{port}/v1"
    wait_until_up(server, url)
    ask(url)
    code, output = server.stop()
    assert code == 0
    assert "INFO" not in output
    assert "listening" not in output
    assert "toolspan.access" not in output


def test_startup_lines_name_the_upstream_the_tools_and_where_traces_go(serve: type[Server]) -> None:
    server = serve("--upstream", "http://127.0.0.1:9/v1", "--tools", f"{FIXTURES}:registry",
                   env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    base = server.url().removesuffix("/v1")
    server.wait_for(re.compile("metrics: "), "metrics")
    code, output = server.stop()
    assert code == 0
    for line in ("upstream: openai at http://127.0.0.1:9/v1", "tools: shout, whisper",
                 "traces: OTLP to http://127.0.0.1:9/v1/traces", f"metrics: {base}/metrics"):
        assert f" INFO toolspan: {line}\n" in output


# --- toolspan trajectories ------------------------------------------------------------------------

def test_trajectories_after_the_demo(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The demo records its trajectory; the report shows its rename, rejection, corrected retry and
    recovery; `show` prints the timeline the demo printed."""
    store = tmp_path / "demo.sqlite3"
    monkeypatch.setenv("TOOLSPAN_TRAJECTORY_STORE_PATH", str(store))
    assert main(["demo"]) == 0
    demo = capsys.readouterr().out
    assert main(["trajectories", "report", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    weather = next(t for t in figures["tools"] if t["tool"] == "get_weather")
    assert weather["renames"] == [{"from": "city_name", "to": "city", "count": 1}]
    assert (weather["rejections"], weather["retries"]["corrected"], weather["recoveries"]) == (1, 1, 1)
    assert figures["overall"]["rejections"] == 1
    # The weather story's trajectory (the hand-back after it is one of its own).
    listed = next(t for t in json.loads(_run_cli(capsys, "trajectories", "list", "--json"))
                  if f"trajectory: {t['id']}" in demo)
    assert f"trajectory: {listed['id']}" in demo
    shown = _run_cli(capsys, "trajectories", "show", listed["id"])
    timeline = [line for line in demo.splitlines() if line.startswith(("model turn", "  tool call", "    "))]
    assert len(timeline) > 8
    assert "\n".join(timeline) in shown
    # Content capture is on in the demo: the question, the model's calls and its final answer.
    assert "    user: What is the weather in Lisbon right now, in Fahrenheit?" in shown
    assert 'assistant: calls get_weather({"city_name": "Lisbon"})' in shown
    final = demo.split("\nassistant: ", 1)[1].splitlines()[0]
    assert shown.rstrip().endswith(f"      assistant: {final}")
    assert "city_name" in _run_cli(capsys, "trajectories", "report")


def _run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_trajectories_export_and_import(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TOOLSPAN_TRAJECTORY_STORE_PATH", str(tmp_path / "a.sqlite3"))
    assert main(["demo"]) == 0
    capsys.readouterr()
    _run_cli(capsys, "trajectories", "export", str(tmp_path / "traces.jsonl"))
    copy = str(tmp_path / "b.sqlite3")
    assert "spans recorded" in _run_cli(capsys, "trajectories", "import", "--db", copy, str(tmp_path / "traces.jsonl"))
    assert _run_cli(capsys, "trajectories", "list", "--db", copy) == _run_cli(capsys, "trajectories", "list")


def test_trajectories_without_a_store_or_trajectory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trajectories", "list", "--db", str(tmp_path / "none.sqlite3")]) == 2
    assert "no trajectory store at" in capsys.readouterr().err
    assert not (tmp_path / "none.sqlite3").exists()
    assert main(["trajectories", "import", "--db", str(tmp_path / "x.sqlite3"), str(tmp_path / "x.sqlite3")]) == 2
    assert main(["trajectories", "show", "nope", "--db", str(tmp_path / "x.sqlite3")]) == 1


def _otlp_line(attributes: list[dict[str, Any]], **span: Any) -> str:
    call = {"traceId": "0" * 31 + "1", "spanId": "0" * 15 + "a", "parentSpanId": "0" * 15 + "b", "name": "tool.call",
            "kind": 1, "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000001000000000",
            "attributes": [{"key": "gen_ai.conversation.id", "value": {"stringValue": "t1"}},
                           {"key": "gen_ai.tool.name", "value": {"stringValue": "x"}}, *attributes]} | span
    request = {"traceId": "0" * 31 + "1", "spanId": "0" * 15 + "b", "name": "POST /v1/chat/completions", "kind": 2,
               "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000002000000000",
               "attributes": [{"key": "gen_ai.conversation.id", "value": {"stringValue": "t1"}}]}
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [call, request]}]}]})


@pytest.mark.parametrize(("attribute", "span"), [
    ({"key": "toolspan.args.missing", "value": {"boolValue": True}}, {}),
    ({"key": "toolspan.round", "value": {"intValue": "99999999999999999999"}}, {}),
    ({"key": "toolspan.args.suggestions", "value": {"arrayValue": {"values": [{"intValue": "3"}]}}}, {}),
    ({"key": "toolspan.args.unrecognized",
      "value": {"arrayValue": {"values": [{"arrayValue": {"values": [{"stringValue": "a"}]}}]}}}, {}),
    ({"key": "gen_ai.conversation.id", "value": {"intValue": "7"}}, {}),
    ({"key": "toolspan.outcome", "value": {"stringValue": 5}}, {}),
    (None, {"name": 5}),
    (None, {"endTimeUnixNano": "9" * 30}),
], ids=["bool-names", "huge-round", "int-names", "nested-names", "int-id", "bad-string", "int-name", "huge-time"])
def test_trajectories_import_refuses_attributes_of_the_wrong_type(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], attribute: dict[str, Any] | None,
        span: dict[str, Any]) -> None:
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_text(_otlp_line([]) + "\n")
    bad.write_text("\n" + _otlp_line([attribute] if attribute else [], **span) + "\n")
    db = tmp_path / "s.sqlite3"
    assert main(["trajectories", "import", "--db", str(db), str(good)]) == 0
    capsys.readouterr()
    assert main(["trajectories", "import", "--db", str(db), str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"toolspan: {bad}: line 2: ")
    assert err.count("\n") == 1
    for command in (["report"], ["list"], ["show", "t1"]):
        assert main(["trajectories", *command, "--db", str(db)]) == 0
    capsys.readouterr()
    [listed] = json.loads(_run_cli(capsys, "trajectories", "list", "--json", "--db", str(db)))
    assert listed["tool_calls"] == 1  # the good file's call, and nothing of the bad one's


def test_trajectories_import_of_a_directory_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trajectories", "import", "--db", str(tmp_path / "s.sqlite3"), str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"toolspan: {tmp_path}: cannot read it")
    assert err.count("\n") == 1
