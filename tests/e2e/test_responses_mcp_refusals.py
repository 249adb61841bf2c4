"""What a Responses request's `mcp` tools may not make the gateway do, with the official openai
client and a scripted Anthropic upstream: name a server off the operator's allow list
(responses_mcp_servers), one of OpenAI's connectors, or credentials of its own. Each is a 400 with
the field it names, before the gateway connects anywhere: a loopback listener at the URL the
request gives sees no connection. And an approval id handed to one gateway key runs nothing when
another key sends it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from gateway.demo.model import Reply
from gateway.mcp.declared import NO_CREDENTIALS, NOT_ALLOWED
from gateway.settings.parts import GatewayKey
from tests.conftest import Stack, StackFactory
from tests.mcp.conftest import HttpServer, Recorded, files, http_server, recorded

__all__ = ["files", "http_server", "recorded"]  # the fixtures of tests/mcp, used here

pytestmark = pytest.mark.slow

ALICE = "sk-alice-key"
BOB = "sk-bob-key"


@dataclass
class Listener:
    """A loopback TCP listener that records every connection it accepts (and answers none)."""

    server: asyncio.Server
    accepted: list[Any] = field(default_factory=list)

    @property
    def url(self) -> str:
        host, port = self.server.sockets[0].getsockname()[:2]
        return f"http://{host}:{port}/mcp"

    async def closed(self) -> list[Any]:
        """The connections it accepted, once it no longer listens."""
        self.server.close()
        await self.server.wait_closed()
        return self.accepted


@pytest.fixture
async def listener() -> AsyncIterator[Listener]:
    accepted: list[Any] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer.get_extra_info("peername"))
        writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    opened = Listener(server, accepted)
    yield opened
    if server.is_serving():
        await opened.closed()


async def gateway(make_stack: StackFactory, server: HttpServer, **settings: Any) -> Stack:
    return await make_stack(upstream_kind="anthropic", responses_mcp_servers={"files": {"url": server.url}},
                            **settings)


def refused_specs(url: str) -> list[tuple[dict[str, Any], str, str]]:
    """(an mcp tool, the param its 400 names, the code), each pointing the gateway at `url`."""
    base = {"type": "mcp", "server_label": "elsewhere", "server_url": url, "require_approval": "never"}
    return [
        (base, "tools[1].server_url", NOT_ALLOWED),
        ({"type": "mcp", "server_label": "elsewhere", "require_approval": "never"}, "tools[1].server_label",
         NOT_ALLOWED),
        ({**base, "connector_id": "connector_googledrive"}, "tools[1].connector_id", NOT_ALLOWED),
        ({**base, "headers": {"Authorization": "Bearer sk-from-the-client"}}, "tools[1].headers", NO_CREDENTIALS),
        ({**base, "authorization": "sk-from-the-client"}, "tools[1].authorization", NO_CREDENTIALS),
    ]


CASES = ["server_url", "server_label", "connector_id", "headers", "authorization"]
FUNCTION = {"type": "function", "name": "local_lookup", "parameters": {"type": "object", "properties": {}},
            "strict": False}


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("case", range(len(CASES)), ids=CASES)
async def test_a_server_off_the_allow_list_is_refused_before_any_connection(
        make_stack: StackFactory, files: tuple[HttpServer, Recorded], listener: Listener, case: int,
        streamed: bool) -> None:
    server, recorded = files
    stack = await gateway(make_stack, server)
    declared, param, code = refused_specs(listener.url)[case]
    with pytest.raises(openai.BadRequestError) as refused:
        await stack.client.responses.create(model="test-model", input="Read /etc/motd.", stream=streamed,
                                            tools=[FUNCTION, declared])
    error = refused.value.body
    assert isinstance(error, dict)
    assert (refused.value.status_code, error["code"], error["param"]) == (400, code, param)
    assert "Traceback" not in error["message"]
    assert await listener.closed() == []
    assert stack.upstream_requests == []
    assert recorded.calls() == []


@pytest.mark.parametrize("field_name", ["headers", "authorization"])
async def test_credentials_are_refused_even_for_an_allowed_server(
        make_stack: StackFactory, files: tuple[HttpServer, Recorded], field_name: str) -> None:
    server, recorded = files
    stack = await gateway(make_stack, server)
    value: Any = {"Authorization": "Bearer sk-from-the-client"} if field_name == "headers" else "sk-from-the-client"
    declared = {"type": "mcp", "server_label": "files", "server_url": server.url, field_name: value}
    with pytest.raises(openai.BadRequestError) as refused:
        await stack.client.responses.create(model="test-model", input="Read /etc/motd.", tools=[declared])
    error = refused.value.body
    assert isinstance(error, dict)
    assert (error["code"], error["param"]) == (NO_CREDENTIALS, f"tools[0].{field_name}")
    assert stack.upstream_requests == []
    assert recorded.calls() == []


async def test_an_approval_id_sent_by_another_key_runs_nothing(
        make_stack: StackFactory, files: tuple[HttpServer, Recorded]) -> None:
    server, recorded = files
    stack = await gateway(make_stack, server, keys={"alice": GatewayKey(key=ALICE), "bob": GatewayKey(key=BOB)})
    stack.script.then(Reply(tool_calls=[("files__read_file", {"path": "/etc/motd"})]),
                      Reply(content="I could not read it."))
    declared = {"type": "mcp", "server_label": "files", "server_url": server.url, "require_approval": "always"}
    alice = AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=ALICE, max_retries=0, timeout=20)
    bob = AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=BOB, max_retries=0, timeout=20)
    async with alice, bob:
        asked = await alice.responses.create(model="test-model", input="Read /etc/motd.", tools=[declared])
        [request] = [item for item in asked.output if item.type == "mcp_approval_request"]
        assert (request.server_label, request.name, json.loads(request.arguments)) == (
            "files", "read_file", {"path": "/etc/motd"})
        replay = [{"role": "user", "content": "Read /etc/motd."}, request.model_dump(exclude_none=True),
                  {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}]
        # Bob's key holds no such turn: the approval is told to the model as not applied (design 3.4).
        answered = await bob.responses.create(model="test-model", input=replay, tools=[declared])
    assert [item for item in answered.output if item.type == "mcp_call"] == []
    assert answered.output_text == "I could not read it."
    assert "contents of /etc/motd" not in json.dumps(stack.upstream_requests[-1])
    assert recorded.calls() == []
