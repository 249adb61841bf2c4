"""Running the gateway (gateway.runtime.process): the library's entry point leaves its host's garbage
collector alone (only `toolspan serve`, a process of the gateway's own, freezes start-up's objects and
raises the collection threshold); the event loop is uvloop's where it is installed; a bind failure is
one clear error; the state store's up gauge is exported only when there is a shared store."""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gateway.runtime.process import CannotListen, build_state, run, serving
from gateway.settings.model import Settings
from telemetry import names
from telemetry.metrics import Metrics
from tests.runtime.conftest import tiny_app

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


@pytest.mark.slow  # a host application as a process of its own
def test_an_application_embedding_the_gateway_keeps_its_collector_as_it_was(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "data")}
    run = subprocess.run([sys.executable, "-c", HOST], env=env, capture_output=True, text=True, timeout=60,
                         check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["True", "0"]  # thresholds unchanged, nothing frozen


def test_the_gateway_runs_on_uvloop_where_it_is_installed() -> None:
    """uvloop is a dependency on this platform, so `toolspan serve` and `demo` run on its loop."""
    async def loop_module() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert run(loop_module()).startswith("uvloop")


async def test_a_port_in_use_is_one_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CannotListen) as caught:
            async with serving(tiny_app(), "127.0.0.1", port):
                pytest.fail("listening on a port that is taken")
    assert str(caught.value) == f"cannot listen on 127.0.0.1:{port}: Address already in use"


@pytest.mark.parametrize(("host", "error", "message"), [
    ("::1", OSError(errno.EADDRINUSE, "error while attempting to bind on address ('::1', 80): address already in use"),
     "cannot listen on [::1]:80: Address already in use"),
    ("no.such.host", socket.gaierror(-2, "Name or service not known"),
     "cannot listen on no.such.host:80: Name or service not known"),
], ids=["ipv6", "unknown-host"])
def test_the_bind_error_names_the_address_and_the_reason(host: str, error: OSError, message: str) -> None:
    assert str(CannotListen(host, 80, error)) == message


@pytest.mark.parametrize(("state_url", "exported"), [(None, []), ("redis://127.0.0.1:6379/0", [1.0])],
                         ids=["memory", "redis"])
async def test_the_state_store_gauge_is_exported_only_with_a_shared_store(state_url: str | None,
                                                                         exported: list[float]) -> None:
    """Without Redis the gauge is absent, which the Tools dashboard reads as "not configured" (with
    it, 1 from the start: nothing is asked of Redis before the first request)."""
    metrics = Metrics(CollectorRegistry())
    state = build_state(Settings(state_url=state_url), metrics)
    await state.aclose()
    assert [s.value for f in metrics.registry.collect() for s in f.samples
            if s.name == names.METRIC_STATE_STORE_UP] == exported
