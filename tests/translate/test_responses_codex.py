"""The pinned Codex CLI (tests/e2e/codex) reading what the Responses side writes: a server that
reads each of Codex's requests with RESPONSES.read_request and answers with a scripted neutral
answer streamed through RESPONSES.stream_writing. Codex runs the call it is given with its own
shell tool, sends the result back under the call's id, and prints the answer: the written events
are a stream Codex takes, and Codex's follow-up reads back into the conversation it continues."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from gateway.translate.neutral import (
    ArgumentsDelta,
    Finished,
    PartEnded,
    PartStarted,
    Request,
    Started,
    StreamEvent,
    Text,
    TextDelta,
    ToolCall,
    ToolResult,
    Usage,
)
from gateway.translate.responses import RESPONSES
from tests.translate.responses_cases import sse

CODEX = Path(__file__).parents[1] / "e2e" / "codex" / "node_modules" / ".bin" / "codex"
CALL = ToolCall("call_translated_1", "exec_command", '{"cmd": "echo translated-run"}')

pytestmark = pytest.mark.slow


def _result_text(request: Request) -> str | None:
    """The text of the result of CALL, once the request carries it."""
    for turn in request.turns:
        for part in turn.parts:
            if isinstance(part, ToolResult) and part.call_id == CALL.call_id:
                return "".join(piece.text for piece in part.content if isinstance(piece, Text))
    return None


def _scripted(request: Request, turn: int) -> list[StreamEvent]:
    """Run CALL first (its arguments in two pieces); then say what its result said."""
    said = _result_text(request)
    opening = Started(f"chatcmpl-{turn}", request.model, Usage(input_tokens=12))
    if said is None:
        middle: list[StreamEvent] = [PartStarted(0, ToolCall(CALL.call_id, CALL.name, "")),
                                     ArgumentsDelta(0, CALL.arguments[:9]), ArgumentsDelta(0, CALL.arguments[9:]),
                                     PartEnded(0)]
        return [opening, *middle, Finished("tool_calls", Usage(output_tokens=7))]
    answer = f"The command said: {'translated-run' if 'translated-run' in said else 'nothing'}."
    middle = [PartStarted(0, Text("")), TextDelta(0, answer[:10]), TextDelta(0, answer[10:]), PartEnded(0)]
    return [opening, *middle, Finished("end", Usage(output_tokens=9))]


async def _serve(aiohttp_server: AiohttpServer, read: list[Request]) -> str:
    async def respond(request: web.Request) -> web.StreamResponse:
        neutral = RESPONSES.read_request(await request.json())
        read.append(neutral)
        writing = RESPONSES.stream_writing()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(sse(e for event in _scripted(neutral, len(read)) for e in writing.write(event)))
        return response

    async def no_socket(_: web.Request) -> web.Response:
        return web.Response(status=426)  # no WebSocket here: Codex goes on over HTTP

    app = web.Application()
    app.router.add_post("/v1/responses", respond)
    app.router.add_get("/v1/responses", no_socket)
    server = await aiohttp_server(app)
    return str(server.make_url("/v1"))


async def test_codex_runs_on_what_the_responses_side_writes(aiohttp_server: AiohttpServer, tmp_path: Path) -> None:
    assert CODEX.exists(), f"the Codex CLI is not installed: run npm ci --prefix {CODEX.parents[2]}"
    read: list[Request] = []
    url = await _serve(aiohttp_server, read)
    codex_home, work = tmp_path / "codex-home", tmp_path / "work"
    codex_home.mkdir()
    work.mkdir()
    (codex_home / "config.toml").write_text(f'model = "test-model"\nopenai_base_url = "{url}"\n')
    env = {name: value for name, value in os.environ.items() if not name.startswith(("OPENAI_", "CODEX_"))}
    env.update(CODEX_HOME=str(codex_home), OPENAI_API_KEY="test", NO_COLOR="1")
    process = await asyncio.create_subprocess_exec(
        str(CODEX), "exec", "--skip-git-repo-check", "-s", "read-only", "Run a command and say what it said.",
        cwd=work, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    output, _ = await asyncio.wait_for(process.communicate(), timeout=120)
    text = output.decode(errors="replace")
    assert process.returncode == 0, text
    assert "The command said: translated-run." in text
    first, second = read
    assert _result_text(first) is None
    assert first.turns[-1].parts[-1] == Text("Run a command and say what it said.")
    # The follow-up carries the call as it was written, then its result under the same id.
    [called] = [turn for turn in second.turns if turn.role == "assistant"]
    assert called.parts == (CALL,)
    assert "translated-run" in (_result_text(second) or "")
    assert "tools.web_search" in second.dropped
