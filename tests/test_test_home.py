"""The tests' own home: no test reads or writes the user's, so a user's own gateway running beside
the tests (writing ~/.local/share/toolspan) can neither be touched nor fail a test."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

from gateway.settings.model import Settings


def test_home_and_the_default_store_are_a_temporary_directory() -> None:
    real = Path(pwd.getpwuid(os.getuid()).pw_dir)
    assert Path.home() != real
    assert Path(os.environ["HOME"]) == Path.home()
    store = Settings().store_path()
    assert Path.home() in store.parents  # the test's home, not the user's


def test_a_subprocess_gets_the_same_home() -> None:
    seen = subprocess.run([sys.executable, "-c", "from pathlib import Path; print(Path.home())"],
                          capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    assert Path(seen) == Path.home()
    assert Path(seen) != Path(pwd.getpwuid(os.getuid()).pw_dir)
