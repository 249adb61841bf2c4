"""examples/quickstart.py runs from a fresh clone without the venv active (issue 35): it runs itself
with the project's .venv; with no venv to be found, it says how to make one, in one line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BARE_PYTHON = Path(sys.base_prefix) / "bin" / "python3"  # the interpreter under the venv: no toolspan in it


def _run(script: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    return subprocess.run([str(BARE_PYTHON), str(script)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_the_quickstart_runs_with_a_python_outside_the_venv(tmp_path: Path) -> None:
    bare = subprocess.run([str(BARE_PYTHON), "-c", "import gateway"], capture_output=True, cwd=tmp_path, check=False)
    assert bare.returncode != 0, "this interpreter must not have toolspan, or the test proves nothing"
    done = _run(ROOT / "examples" / "quickstart.py", tmp_path)
    assert done.returncode == 0, done.stderr
    assert "--- to_celsius({\"fahrenheit\": 98.6}) -> ok" in done.stdout
    assert "=== spans" in done.stdout
    assert "=== metrics" in done.stdout


def test_without_a_venv_it_says_how_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "examples").mkdir()
    script = tmp_path / "examples" / "quickstart.py"  # a copy with no .venv beside it
    shutil.copy(ROOT / "examples" / "quickstart.py", script)
    done = _run(script, tmp_path)
    assert done.returncode != 0
    assert done.stderr.count("\n") == 1
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("quickstart: ")
    assert " is not importable from " in done.stderr
    assert done.stderr.rstrip().endswith("then run .venv/bin/python examples/quickstart.py")
