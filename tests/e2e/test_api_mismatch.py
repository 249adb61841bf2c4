"""A request for a wire API the upstream's kind does not serve is answered at once, in the client's
API's shape, saying which kind of upstream serves which API: Messages (Claude Code, the `anthropic`
client) against an OpenAI or Azure upstream, Chat Completions or Responses against an Anthropic one.
Sent on, it got the provider's 404 ("the provider answered 404 to POST /v1/messages"), which Claude
Code reads as a model that does not exist. Nothing reaches the provider; the kinds that may serve
any of the three (the OpenAI-compatible servers) are not refused."""

from __future__ import annotations

from pathlib import Path

import anthropic
import openai
import pytest
from aiohttp import web
from aiohttp.typedefs import Handler
from pytest_aiohttp import AiohttpServer

from gateway.demo.model import Reply, ScriptedModel
from gateway.settings.model import Settings
from tests.conftest import USER, GatewayFactory, Script, StackFactory
from tests.e2e.test_claude_code import MODEL, claude

MESSAGES_REFUSED = ("this gateway's upstream is of kind {kind}, which serves Chat Completions (/v1/chat/completions) "
                    "and Responses (/v1/responses), not Anthropic's Messages (/v1/messages): that API needs an "
                    'upstream of kind anthropic (upstream_kind = "anthropic")')
OPENAI_REFUSED = ("this gateway's upstream is of kind anthropic, which serves Anthropic's Messages (/v1/messages), "
                  "not {api}: that API needs an upstream of kind openai or azure")


async def test_claude_code_against_an_openai_upstream_is_told_which_upstream_serves_messages(
        aiohttp_server: AiohttpServer, make_gateway: GatewayFactory, tmp_path: Path) -> None:
    """OpenAI's API has no /v1/messages: the scripted upstream plays it, serving Chat and Responses only,
    and records every request that reaches it."""
    reached: list[str] = []

    @web.middleware
    async def record(request: web.Request, handler: Handler) -> web.StreamResponse:
        reached.append(request.path_qs)
        return await handler(request)

    app = ScriptedModel(Script().then(Reply(content="never asked")), apis=("chat", "responses")).app()
    app.middlewares.append(record)
    upstream = await aiohttp_server(app)
    gateway = await make_gateway(Settings(port=0, upstream=str(upstream.make_url("/v1")), upstream_kind="openai",
                                          trajectory_store=False))

    status, output, errors = await claude(gateway.url, tmp_path, "-p", "hello", "--model", MODEL, "--max-turns", "2")

    assert status == 1, output + errors
    assert output.strip() == f"API Error: 400 {MESSAGES_REFUSED.format(kind='openai')}, or an OpenAI-compatible " \
                             "server that speaks it (upstream_kind vllm, ollama, deepseek or compatible)"
    assert "issue with the selected model" not in output + errors
    assert reached == []


@pytest.mark.parametrize("kind", ["openai", "azure"])
async def test_the_anthropic_client_against_an_openai_upstream_gets_an_anthropic_error(
        make_stack: StackFactory, kind: str) -> None:
    stack = await make_stack(upstream_kind=kind)
    async with stack.anthropic() as client:
        with pytest.raises(anthropic.BadRequestError) as created:
            await client.messages.create(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(anthropic.BadRequestError) as counted:
            await client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    for refused in (created.value, counted.value):
        assert isinstance(refused.body, dict)
        assert (refused.body["type"], refused.body["error"]["type"]) == ("error", "invalid_request_error")
        assert refused.body["error"]["message"].startswith(MESSAGES_REFUSED.format(kind=kind))
    assert stack.model.request_paths == []


async def test_openai_clients_against_an_anthropic_upstream_get_an_openai_error(make_stack: StackFactory) -> None:
    stack = await make_stack(upstream_kind="anthropic")
    with pytest.raises(openai.BadRequestError) as chat:
        await stack.client.chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError) as responses:
        await stack.client.responses.create(model="m", input="hi")
    with pytest.raises(openai.BadRequestError) as stored:
        await stack.client.responses.retrieve("resp_abc")
    for refused, api in ((chat.value, "Chat Completions (/v1/chat/completions)"),
                         (responses.value, "Responses (/v1/responses)"), (stored.value, "Responses (/v1/responses)")):
        assert refused.code == "api_not_served"
        assert refused.type == "invalid_request_error"
        assert str(refused.body["message"]).startswith(OPENAI_REFUSED.format(api=api))  # type: ignore[index]
    assert stack.model.request_paths == []


@pytest.mark.parametrize("kind", ["compatible", "vllm", "ollama", "deepseek"])
async def test_an_openai_compatible_upstream_is_asked_for_every_api(make_stack: StackFactory, kind: str) -> None:
    """Such a server may serve Messages beside OpenAI's APIs: the gateway leaves it to say."""
    stack = await make_stack(upstream_kind=kind)
    stack.script.then(Reply(content="chat"), Reply(content="messages"))
    assert (await stack.ask(False, messages=USER)).content == "chat"
    async with stack.anthropic() as client:
        message = await client.messages.create(model=MODEL, max_tokens=64,
                                               messages=[{"role": "user", "content": "hi"}])
    assert [block.text for block in message.content if block.type == "text"] == ["messages"]
