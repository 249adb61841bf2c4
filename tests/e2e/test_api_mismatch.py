"""A route of a wire API the upstream's kind does not serve, and that cannot be translated (a route
passed on as it is: Messages' count_tokens, a stored response), is answered at once, in the
client's API's shape, saying which kind of upstream serves which API. Sent on, it got the
provider's 404, which Claude Code reads as a model that does not exist. Nothing reaches the
provider; the kinds that may serve any of the three (the OpenAI-compatible servers) are not
refused. The tool loop's own requests are translated (tests/e2e/test_translation.py)."""

from __future__ import annotations

import anthropic
import openai
import pytest

from gateway.demo.model import Reply
from tests.conftest import USER, StackFactory
from tests.e2e.test_claude_code import MODEL

MESSAGES_REFUSED = ("this gateway's upstream is of kind {kind}, which serves Chat Completions (/v1/chat/completions) "
                    "and Responses (/v1/responses), not Anthropic's Messages (/v1/messages): that API needs an "
                    'upstream of kind anthropic (upstream_kind = "anthropic")')
OPENAI_REFUSED = ("this gateway's upstream is of kind anthropic, which serves Anthropic's Messages (/v1/messages), "
                  "not {api}: that API needs an upstream of kind openai or azure")


@pytest.mark.parametrize("kind", ["openai", "azure"])
async def test_the_anthropic_clients_count_on_an_openai_upstream_gets_an_anthropic_error(
        make_stack: StackFactory, kind: str) -> None:
    """Messages' own routes passed on as they are (count_tokens) cannot be translated: refused at once.
    Messages itself is translated to Chat Completions (tests/e2e/test_translation.py)."""
    stack = await make_stack(upstream_kind=kind)
    async with stack.anthropic() as client:
        with pytest.raises(anthropic.BadRequestError) as counted:
            await client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    for refused in (counted.value,):
        assert isinstance(refused.body, dict)
        assert (refused.body["type"], refused.body["error"]["type"]) == ("error", "invalid_request_error")
        assert refused.body["error"]["message"].startswith(MESSAGES_REFUSED.format(kind=kind))
    assert stack.model.request_paths == []


async def test_openai_clients_routes_passed_on_to_an_anthropic_upstream_get_an_openai_error(
        make_stack: StackFactory) -> None:
    """A stored response cannot be translated: refused at once. Chat Completions and Responses
    requests themselves are translated to Messages (tests/e2e/test_translation.py)."""
    stack = await make_stack(upstream_kind="anthropic")
    with pytest.raises(openai.BadRequestError) as stored:
        await stack.client.responses.retrieve("resp_abc")
    for refused, api in ((stored.value, "Responses (/v1/responses)"),):
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
