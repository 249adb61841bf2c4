"""The composition root: loading tools, settings precedence, and the `toolspan` command itself."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from gateway.cli import StartupError, load_tools, main, run
from gateway.settings import load_settings

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = "tests.fixtures_tools"
LISTENING = re.compile(r"^toolspan listening on (http://127\.0\.0\.1:\d+/v1) ")
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

@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No TOOLSPAN_* or OTEL_* variable from the machine running the tests."""
    for name in list(os.environ):
        if name.upper().startswith(("TOOLSPAN_", "OTEL_")):
            monkeypatch.delenv(name)
    return monkeypatch


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


# --- the command, in a subprocess -----------------------------------------------------------------

def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(("TOOLSPAN_", "OTEL_"))}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_toolspan(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", *args], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=timeout, check=False)


class Server:
    """`toolspan serve` in a child process; its stdout read on a thread, line by line."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--port", "0", *args],
                                        cwd=ROOT, env=child_env(), stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def url(self) -> str:
        """The base URL from the "listening" line, waiting at most START_TIMEOUT for it."""
        seen: list[str] = []
        while True:
            try:
                line = self.lines.get(timeout=START_TIMEOUT)
            except queue.Empty:
                pytest.fail(f"no 'listening' line within {START_TIMEOUT} s; stdout so far: {seen}")
            if line is None:
                pytest.fail(f"toolspan serve exited ({self.process.wait()}) before listening: {seen}")
            seen.append(line)
            if match := LISTENING.match(line):
                return match.group(1)

    def stop(self) -> tuple[int, str]:
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=20)
        assert self.process.stderr is not None
        return code, self.process.stderr.read()


@pytest.fixture
def serve() -> Iterator[type[Server]]:
    started: list[Server] = []

    class Tracked(Server):
        def __init__(self, *args: str) -> None:
            super().__init__(*args)
            started.append(self)

    yield Tracked
    for server in started:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait(timeout=20)
        for stream in (server.process.stdout, server.process.stderr):
            if stream is not None:
                stream.close()


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


def test_serve_with_unloadable_tools_exits_2() -> None:
    done = run_toolspan("serve", "--port", "0", "--tools", "nosuch:thing")
    assert done.returncode == 2
    assert "toolspan: --tools 'nosuch:thing': cannot import 'nosuch'" in done.stderr
    assert "Traceback" not in done.stderr
    assert "listening" not in done.stdout


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_demo_prints_the_trajectory(api: str) -> None:
    done = run_toolspan("demo", "--api", api)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert ("Responses API" in out) is (api == "responses")
    assert out.count("model turn  chat toolspan-demo") == 4
    assert "tool call get_weather: ok" in out
    assert "rejected (missing_arguments)" in out
    assert "did you mean 'city'" in out
    assert re.search(r"^assistant: In \w+ it is .+$", out, re.MULTILINE)
    assert re.search(r"trace id: [0-9a-f]{32}$", out, re.MULTILINE)
    assert out.index("rejected (missing_arguments)") < out.index("assistant:")


def test_the_gateway_runs_on_uvloop_where_it_is_installed() -> None:
    """uvloop is a dependency on this platform, so `toolspan serve` and `demo` run on its loop."""
    async def loop_module() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert run(loop_module()).startswith("uvloop")
