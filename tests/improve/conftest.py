"""The two-model session (tests.improve.session), run through the gateway into a store of its own."""

from __future__ import annotations

import json
import sqlite3
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from openai import AsyncOpenAI
from pytest_aiohttp import AiohttpServer

from gateway.cli.main import main
from gateway.demo.model import ScriptedModel
from gateway.settings.model import Settings
from telemetry.store.dataset_schema import dataset_schema
from tests.conftest import USER, Gateway, GatewayFactory, Script
from tests.improve import session as scripted
from tests.improve.changed_tools import CHANGED_TOOLS

VALIDATOR = Draft202012Validator(dataset_schema())


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def export(store: Path, out: Path, capsys: pytest.CaptureFixture[str], *options: str) -> list[dict[str, Any]]:
    """The dataset (`--format chat-jsonl`) the CLI writes, read back: every line JSON (no NaN or
    Infinity, which JSON has not) valid against the schema, and no secret in the file."""
    assert main(["trajectories", "export", "--db", str(store), "--format", "chat-jsonl", *options, str(out)]) == 0
    assert capsys.readouterr().err.startswith(f"{out}: ")
    text = out.read_text(encoding="utf-8")
    assert scripted.SECRET not in text
    lines = [json.loads(line, parse_constant=_not_json) for line in text.splitlines()]
    for line in lines:
        errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in VALIDATOR.iter_errors(line)]
        assert not errors, errors
    return lines


@dataclass
class Session:
    gateway: Gateway
    path: Path  # the store's file
    db: sqlite3.Connection
    upstreams: dict[str, ScriptedModel]


async def run_session(gateway: Gateway, scripts: dict[str, Script]) -> None:
    """Each trajectory of the session, as one request of its key's client to its model's upstream."""
    clients = {name: AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=entry["key"], max_retries=0, timeout=20)
               for name, entry in scripted.KEYS.items()}
    try:
        for key, model, turns in scripted.TRAJECTORIES:
            scripts[model].then(*scripted.replies(turns))
            await clients[key].chat.completions.create(model=model, messages=USER)  # type: ignore[arg-type]
    finally:
        for client in clients.values():
            await client.close()


@asynccontextmanager
async def recorded_session(aiohttp_server: AiohttpServer, make_gateway: GatewayFactory, path: Path,
                           **settings: Any) -> AsyncIterator[Session]:
    """The session, recorded into a store at `path` with every call's arguments and the messages (for
    an export); `settings`: more of the gateway's (the keys' included)."""
    scripts = {scripted.MODEL_A: Script(), scripted.MODEL_B: Script()}
    upstreams = {model: ScriptedModel(script) for model, script in scripts.items()}
    urls = {}
    for model, upstream in upstreams.items():
        server = await aiohttp_server(upstream.app())
        urls[model] = str(server.make_url("/v1")).rstrip("/")
    settings.setdefault("keys", scripted.KEYS)
    gateway = await make_gateway(Settings(
        port=0, trajectory_store_path=path, record_tool_arguments=True, capture_message_content=True, upstreams={
            "primary": {"url": urls[scripted.MODEL_A], "kind": "compatible", "models": [scripted.MODEL_A]},
            "secondary": {"url": urls[scripted.MODEL_B], "kind": "compatible", "models": [scripted.MODEL_B]}},
        **settings), registry=scripted.registry())
    await run_session(gateway, scripts)
    assert gateway.observability.store is not None
    await gateway.observability.store.flushed()
    db = sqlite3.connect(path)
    try:
        yield Session(gateway, path, db, upstreams)
    finally:
        db.close()


@pytest.fixture
async def mended_session(aiohttp_server: AiohttpServer, make_gateway: GatewayFactory,
                         tmp_path: Path) -> AsyncIterator[Session]:
    """The session with argument repair and an alias on (tests.improve.session.MENDED_SETTINGS)."""
    async with recorded_session(aiohttp_server, make_gateway, tmp_path / "mended.sqlite3",
                                **scripted.MENDED_SETTINGS) as session:
        yield session


@pytest.fixture
async def improve_session(aiohttp_server: AiohttpServer, make_gateway: GatewayFactory,
                          tmp_path: Path) -> AsyncIterator[Session]:
    """The session, recorded with every call's arguments and the messages (for an export)."""
    async with recorded_session(aiohttp_server, make_gateway, tmp_path / "session.sqlite3") as session:
        yield session


@dataclass
class ToolFile:
    module: str  # its name: `--against {module}:tools` (changed) or `{module}:unchanged`
    ran: Path  # where a body notes that it ran


@pytest.fixture
def tool_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ToolFile]:
    """tests.improve.changed_tools written as a module in a folder of the test's own, which is the
    current one (`--against` imports from there, as `toolspan serve --tools` does); a name of the
    test's own, so that no other test's import of it is reused."""
    folder = tmp_path / "tool-file"
    folder.mkdir()
    module = f"changed_tools_{tmp_path.name.replace('-', '_')}"
    (folder / f"{module}.py").write_text(CHANGED_TOOLS, encoding="utf-8")
    monkeypatch.chdir(folder)
    monkeypatch.setattr(sys, "path", [*sys.path])  # the import puts the folder first: this test's only
    try:
        yield ToolFile(module, folder / "bodies-ran")
    finally:
        sys.modules.pop(module, None)
