"""Arize Phoenix, the trace backend from PyPI, for the tests that check what a user sees there: its
own virtual environment (.ci/run makes `.phoenix-venv`; TOOLSPAN_PHOENIX may name another
`phoenix` executable), `phoenix serve` on loopback with everything it keeps in temporary
directories, and its GraphQL API (the one its pages use) read over HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import free_port

PHOENIX_VERSION = "20.26.1"  # the version .ci/run installs
PHOENIX_VARIABLE = "TOOLSPAN_PHOENIX"
PHOENIX_VENV = Path(__file__).resolve().parents[2] / ".phoenix-venv"
INSTALL = (f"python3 -m venv .phoenix-venv && .phoenix-venv/bin/pip install -q arize-phoenix=={PHOENIX_VERSION}"
           " (from the repository's root; .ci/run does this)")
READY_LINE = "Uvicorn running on"  # after the lifespan startup, once it listens
START_SECONDS = 90.0  # most of it is Phoenix importing its modules on a busy machine
HTTP_TIMEOUT = aiohttp.ClientTimeout(total=20)

SPAN_FIELDS = """name startTime spanKind statusCode statusMessage parentId context { traceId spanId } attributes
  input { value mimeType } output { value mimeType }"""
SPANS_QUERY = ("query ($project: String!, $filter: String) { getProjectByName(name: $project) {"
               " spans(first: 1000, filterCondition: $filter) { edges { node { " + SPAN_FIELDS + " } } } } }")
SESSION_QUERY = """query ($session: String!) { getProjectSessionById(sessionId: $session) {
  sessionId numTraces traces(first: 100) { edges { node { traceId } } } } }"""


def phoenix_executable() -> Path:
    """The `phoenix` to run: TOOLSPAN_PHOENIX's, else the repository's `.phoenix-venv`. Without
    one the test fails, saying how to install it."""
    named = os.environ.get(PHOENIX_VARIABLE)
    executable = Path(named) if named else PHOENIX_VENV / "bin" / "phoenix"
    if not (executable.is_file() and os.access(executable, os.X_OK)):
        pytest.fail(f"Arize Phoenix is not installed: no executable {executable}. Install it with {INSTALL},"
                    f" or name a `phoenix` executable in {PHOENIX_VARIABLE}.", pytrace=False)
    return executable


@dataclass
class Span:
    """A span as Phoenix keeps it: its attributes are Phoenix's nested form (`a.b.c` is a["b"]["c"])."""

    name: str
    start: str  # ISO 8601, in UTC
    kind: str  # Phoenix's span kind: AGENT, LLM, TOOL, ... or UNKNOWN
    status: str  # OK, ERROR or UNSET
    status_message: str
    trace_id: str
    span_id: str
    parent_id: str | None
    attributes: dict[str, Any]
    input: str | None
    output: str | None

    @classmethod
    def read(cls, node: dict[str, Any]) -> Span:
        return cls(node["name"], node["startTime"], node["spanKind"].upper(), node["statusCode"], node["statusMessage"],
                   node["context"]["traceId"], node["context"]["spanId"], node["parentId"],
                   json.loads(node["attributes"]), (node["input"] or {}).get("value"),
                   (node["output"] or {}).get("value"))

    def attribute(self, dotted: str) -> Any:
        """The value of attribute `dotted` (None when absent), looked up in the nested form."""
        found: Any = self.attributes
        for part in dotted.split("."):
            if not isinstance(found, dict) or part not in found:
                return None
            found = found[part]
        return found


@dataclass
class Phoenix:
    """A running `phoenix serve`; `traces_url` is the OTLP/HTTP endpoint it advertises."""

    url: str
    http: aiohttp.ClientSession

    @property
    def traces_url(self) -> str:
        return f"{self.url}/v1/traces"

    async def graphql(self, query: str, **variables: Any) -> dict[str, Any]:
        async with self.http.post(f"{self.url}/graphql", json={"query": query, "variables": variables}) as response:
            assert response.status == 200, await response.text()
            answer: dict[str, Any] = await response.json()
        assert not answer.get("errors"), answer["errors"]
        data: dict[str, Any] = answer["data"]
        return data

    async def spans(self, project: str, filter_condition: str | None = None) -> list[Span]:
        """The project's spans (those `filter_condition` selects, in Phoenix's filter language: the
        span filter box of its pages), in the order they started."""
        data = await self.graphql(SPANS_QUERY, project=project, filter=filter_condition)
        if data["getProjectByName"] is None:  # no span arrived yet
            return []
        found = [Span.read(edge["node"]) for edge in data["getProjectByName"]["spans"]["edges"]]
        return sorted(found, key=lambda span: span.start)

    async def session_traces(self, session_id: str) -> set[str]:
        """The trace ids Phoenix groups under the session `session_id`."""
        data = await self.graphql(SESSION_QUERY, session=session_id)
        session = data["getProjectSessionById"]
        return set() if session is None else {edge["node"]["traceId"] for edge in session["traces"]["edges"]}

    async def until(self, ready: Callable[[], Any], what: str, seconds: float = 20.0) -> Any:
        """`await ready()` until it answers something true. Phoenix writes the spans it receives to
        its database in batches of its own timing, and tells nobody: there is nothing to await but
        the data, so this asks again, bounded by `seconds`, and fails naming what it waited for."""
        deadline = time.monotonic() + seconds
        while not (found := await ready()):
            assert time.monotonic() < deadline, f"Phoenix never showed {what}"
            await asyncio.sleep(0.2)
        return found


async def _started(process: asyncio.subprocess.Process, kept: deque[str]) -> None:
    """Read Phoenix's output until it says it serves (or it exits)."""
    assert process.stdout is not None
    async for raw in process.stdout:
        line = raw.decode(errors="replace").rstrip()
        kept.append(line)
        if READY_LINE in line:
            return
    raise AssertionError(f"phoenix serve exited ({await process.wait()}):\n" + "\n".join(kept))


async def _drain(process: asyncio.subprocess.Process, kept: deque[str]) -> None:
    """Keep reading its output (a full pipe would stop it), the last lines kept for a failure."""
    assert process.stdout is not None
    async for raw in process.stdout:
        kept.append(raw.decode(errors="replace").rstrip())


def phoenix_environment(home: Path, port: int) -> dict[str, str]:
    """Phoenix on 127.0.0.1:`port`, its gRPC receiver on another free port, its SQLite database
    and every file under `home`, and nothing sent anywhere."""
    inherited = {k: v for k, v in os.environ.items()
                 if not k.upper().startswith(("PHOENIX_", "OTEL_")) and k not in ("HOME", "PYTHONPATH")}
    return {**inherited, "HOME": str(home), "PHOENIX_WORKING_DIR": str(home / "phoenix"),
            "PHOENIX_HOST": "127.0.0.1", "PHOENIX_PORT": str(port), "PHOENIX_GRPC_PORT": str(free_port()),
            "PHOENIX_TELEMETRY_ENABLED": "false", "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false"}


@pytest.fixture
async def phoenix(tmp_path: Path) -> AsyncIterator[Phoenix]:
    """`phoenix serve`, ready: it said so and answers its health check. Stopped at the end."""
    executable = phoenix_executable()
    home = tmp_path / "phoenix-home"
    home.mkdir()
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        str(executable), "serve", cwd=home, env=phoenix_environment(home, port),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    kept: deque[str] = deque(maxlen=60)
    drained: asyncio.Task[None] | None = None
    try:
        await asyncio.wait_for(_started(process, kept), START_SECONDS)
        drained = asyncio.create_task(_drain(process, kept))
        async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as http:
            served = Phoenix(f"http://127.0.0.1:{port}", http)
            async with http.get(f"{served.url}/healthz") as health:
                assert health.status == 200, await health.text()
            async with http.get(f"{served.url}/arize_phoenix_version") as version:
                found = (await version.text()).strip()
                assert found == PHOENIX_VERSION, f"{executable} is Phoenix {found}, not {PHOENIX_VERSION}: {INSTALL}"
            yield served
    finally:
        if process.returncode is None:
            process.terminate()
            await asyncio.wait_for(process.wait(), 30)
        if drained is not None:
            await drained
