"""`toolspan serve` and `toolspan demo` (gateway.cli.main) in a child process: what they answer, print
and log, and how they stop."""

from __future__ import annotations

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

import pytest
from openai import OpenAI

from tests.cli.test_main import FIXTURES

pytestmark = pytest.mark.slow  # toolspan serve and demo as processes of their own

ROOT = Path(__file__).resolve().parents[2]
LISTENING = re.compile(r"\blistening on (http://127\.0\.0\.1:\d+/v1)\b")  # in a text or a JSON log line
ACCESS = re.compile(r' INFO toolspan\.access: 127\.0\.0\.1 "(\w+) (\S+) HTTP/1\.1" (\d{3}) (\d+) ([\d.]+)ms '
                    r"trajectory=(\S+) trace=(\S+)$")
START_TIMEOUT = 30.0


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
