"""What a newcomer meets first (issue 35), from the `toolspan` console script (gateway.cli.main): tools
from the current folder, import failures with their traceback, --version, the start-up notice about
message capture. (The settings errors in one line each and --help: tests/settings/test_text.py.)"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
from importlib import metadata
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the toolspan console script, run as a process

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


# --- --version --------------------------------------------------------------------------------------


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
