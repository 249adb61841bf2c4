"""A WebSocket upgrade on the Responses routes, as the Codex CLI opens one first, is answered at
once with an OpenAI-shaped 426 (the Codex CLI then goes on over HTTP without retrying), and never
reaches the provider; a plain GET there is still the pass-through's."""

from __future__ import annotations

import aiohttp
import pytest

from tests.conftest import AUTH, Stack


@pytest.mark.parametrize("path", ["/v1/responses", "/openai/v1/responses"])
async def test_a_websocket_upgrade_is_a_426_at_once(stack: Stack, path: str) -> None:
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await session.ws_connect(f"{stack.url}{path}", headers=AUTH)
    assert refused.value.status == 426
    sent = await stack.http.get(path, headers={**AUTH, "Connection": "Upgrade", "Upgrade": "websocket",
                                                "Sec-WebSocket-Version": "13",
                                                "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})
    assert sent.status == 426
    error = (await sent.json())["error"]
    assert error["code"] == "websocket_not_supported"
    assert error["type"] == "invalid_request_error"
    assert stack.model.request_paths == []  # the provider never saw it
    roots = [s for s in stack.spans() if s.parent is None]
    assert [s.name for s in roots] == [f"GET {path}"] * 2
    plain = await stack.http.get(path, headers=AUTH)  # no upgrade: the pass-through's, as before
    assert plain.status in (404, 405)  # the scripted provider's answer: it takes only POST there
