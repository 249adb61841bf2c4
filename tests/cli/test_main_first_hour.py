"""What a newcomer meets first (issue 35): tools from the current folder, import failures with
their traceback, settings errors in one line each, --help and --version, the start-up notice
about message capture."""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
from importlib import metadata
from pathlib import Path

import pytest

from gateway.cli.main import main

TOOLSPAN = str(Path(sys.executable).parent / "toolspan")  # the console script: no cwd on its path
START_TIMEOUT = 30.0
MY_TOOLS = '''
from gateway.tools import ToolRegistry, tool


@tool
def greet(name: str) -> str:
    """Greet someone.

    Args:
        name: who
    """
    return "hello " + name


registry = ToolRegistry([greet])
'''
BROKEN = 'import os\n\nKEY = os.environ["api_key"]  # not set\n'
PYDANTIC_TEXT = ("validation error for", "EnvSettingsSource", "errors.pydantic.dev", "input_value", "[type=")


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(("TOOLSPAN_", "OTEL_"))}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def toolspan(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TOOLSPAN, *args], cwd=cwd, env=child_env(**env), capture_output=True, text=True,
                          timeout=60, check=False)


def first_lines(args: list[str], cwd: Path, until: str) -> list[str]:
    """`toolspan serve` in `cwd`: its output up to the first line containing `until`, then it is
    stopped (SIGTERM)."""
    process = subprocess.Popen([TOOLSPAN, *args], cwd=cwd, env=child_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    seen: list[str] = []
    try:
        while (line := lines.get(timeout=START_TIMEOUT)) is not None:
            seen.append(line)
            if until in line:
                return seen
        pytest.fail(f"toolspan exited ({process.wait()}) before a line with {until!r}: {seen}")
    finally:
        process.terminate()
        process.wait(timeout=20)
        assert process.stdout is not None
        process.stdout.close()


# --- --tools from the current folder, --app-dir ----------------------------------------------------

def test_serve_imports_tools_from_the_current_folder(tmp_path: Path) -> None:
    (tmp_path / "mytools.py").write_text(MY_TOOLS)
    seen = first_lines(["serve", "--port", "0", "--tools", "mytools:registry"], tmp_path, "tools: ")
    assert seen[-1].rstrip().endswith("INFO toolspan: tools: greet"), seen


@pytest.mark.parametrize("how", ["flag", "env"])
def test_app_dir_names_another_folder(tmp_path: Path, how: str) -> None:
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    (folder / "othertools.py").write_text("registry = 42\n")  # found and imported: then refused as no tools
    args = ["serve", "--port", "0", "--tools", "othertools:registry"]
    done = (toolspan(*args, "--app-dir", str(folder), cwd=tmp_path) if how == "flag"
            else toolspan(*args, cwd=tmp_path, TOOLSPAN_APP_DIR=str(folder)))
    assert done.returncode == 2
    assert done.stderr == ("toolspan: --tools 'othertools:registry': expected a ToolRegistry, a Tool or an "
                           "iterable of tools, got int\n")


def test_a_module_not_found_says_where_it_was_looked_for(tmp_path: Path) -> None:
    done = toolspan("serve", "--port", "0", "--tools", "nosuch:registry", cwd=tmp_path)
    assert done.returncode == 2
    assert f"cannot import 'nosuch': no module 'nosuch' in {tmp_path.resolve()}" in done.stderr
    assert "--app-dir" in done.stderr


@pytest.mark.parametrize("level", ["debug", "info", "error"])
def test_a_tools_module_failing_at_import_shows_its_last_frames(tmp_path: Path, level: str) -> None:
    (tmp_path / "broken.py").write_text(BROKEN)
    done = toolspan("serve", "--port", "0", "--tools", "broken:registry", "--log-level", level, cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert lines[0] == "toolspan: --tools 'broken:registry': importing 'broken' failed: KeyError: 'api_key'"
    at = lines.index(f'  File "{tmp_path.resolve() / "broken.py"}", line 3, in <module>')
    assert lines[at + 1] == '    KEY = os.environ["api_key"]  # not set'
    assert "importlib" not in done.stderr
    assert "gateway/cli/main.py" not in done.stderr
    assert "listening" not in done.stdout + done.stderr


# --- settings errors --------------------------------------------------------------------------------

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


def test_version(tmp_path: Path) -> None:
    done = toolspan("--version", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, f"toolspan {metadata.version('toolspan')}\n")


# --- the capture notice -----------------------------------------------------------------------------

def test_serve_says_when_messages_are_not_captured(tmp_path: Path) -> None:
    seen = first_lines(["serve", "--port", "0"], tmp_path, "mcp: ")
    [notice] = [line for line in seen if "messages:" in line]
    assert notice.rstrip().endswith("INFO toolspan: messages: not captured (spans and the page show tool calls, "
                                    "not the conversation); capture_message_content = true, or "
                                    "TOOLSPAN_CAPTURE_MESSAGE_CONTENT=true, keeps them")
