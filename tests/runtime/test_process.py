"""The library's entry point leaves its host's garbage collector alone: only `toolspan serve`,
a process of the gateway's own, freezes start-up's objects and raises the collection threshold."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HOST = """
import asyncio, gc
from gateway.runtime.process import gateway
from gateway.settings.model import Settings

async def main() -> None:
    before = gc.get_threshold()
    async with gateway(Settings(port=0, trajectory_store=False, access_log=False)):
        print(gc.get_threshold() == before, gc.get_freeze_count())

asyncio.run(main())
"""


def test_an_application_embedding_the_gateway_keeps_its_collector_as_it_was(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "data")}
    run = subprocess.run([sys.executable, "-c", HOST], env=env, capture_output=True, text=True, timeout=60,
                         check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["True", "0"]  # thresholds unchanged, nothing frozen
