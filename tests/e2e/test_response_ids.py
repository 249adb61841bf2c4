"""A Responses answer for which the gateway ran tools goes by an id of the gateway's (resp_tspan_...),
which the provider does not know. Through the real `openai` client: retrieving it gives the response
the client was given, listing its input items gives the input the client sent (paged as the API
pages), deleting it deletes every provider response behind it, and cancelling it says why it cannot
be; each for the key that made it alone, in memory and across replicas sharing a real Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp.pytest_plugin import AiohttpServer
from redis.asyncio import Redis

from gateway.demo.model import Reply, ScriptedModel
from gateway.settings.model import Settings
from telemetry import names
from tests.conftest import TEST_KEY, Gateway, GatewayFactory, Script
from tests.e2e.redis_server import RedisServer

BOB_KEY = "sk-bob-key-0000"
KEYS = {"alice": {"key": TEST_KEY}, "bob": {"key": BOB_KEY}}
ROUTE = "/v1/responses/{response_id}"
INPUT: list[Any] = [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "add 1 and 2"},
                    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "please"}]}]


class Provider:
    """The scripted model keeping its responses as a provider does (GET, input_items, DELETE)."""

    def __init__(self, script: Script, model: ScriptedModel, url: str) -> None:
        self.script, self.model, self.url = script, model, url

    def holds(self, response_id: str) -> bool:
        return self.model.conversations.knows(response_id)


@pytest.fixture
async def provider(aiohttp_server: AiohttpServer) -> Provider:
    script = Script()
    model = ScriptedModel(script, stores_responses=True)
    server = await aiohttp_server(model.app())
    return Provider(script, model, str(server.make_url("/v1")).rstrip("/"))


async def gateway_of(make_gateway: GatewayFactory, provider: Provider, tmp_path: Path, name: str = "one",
                     **overrides: Any) -> Gateway:
    settings = Settings(port=0, upstream=provider.url, keys=KEYS, trajectory_store_path=tmp_path / f"{name}.sqlite3",
                        **overrides)
    return await make_gateway(settings, provider_name="toolspan.scripted")


@pytest.fixture
async def bob(provider: Provider) -> AsyncIterator[Any]:
    async with AsyncExitStack() as exits:
        def client(gateway: Gateway) -> openai.AsyncOpenAI:
            made = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=BOB_KEY, max_retries=0, timeout=20)
            exits.push_async_callback(made.close)
            return made

        yield client


async def answer_with_a_tool(client: openai.AsyncOpenAI, provider: Provider, stream: bool,
                             sent: Any = None) -> dict[str, Any]:
    """A Responses answer over two provider responses (the gateway's `add` ran in between)."""
    provider.script.then(Reply(tool_calls=[("add", {"a": 1, "b": 2})], usage=(10, 5)),
                         Reply(content="1 + 2 = 3", usage=(20, 7)))
    request: dict[str, Any] = {"model": "m", "input": INPUT if sent is None else sent}
    if not stream:
        return (await client.responses.create(**request)).model_dump(exclude_unset=True)
    events = [event async for event in await client.responses.create(stream=True, **request)]
    assert events[-1].type == "response.completed"
    return events[-1].response.model_dump(exclude_unset=True)  # type: ignore[union-attr]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_retrieve_gives_the_response_the_client_was_given(make_gateway: GatewayFactory, provider: Provider,
                                                                tmp_path: Path, stream: bool) -> None:
    gateway = await gateway_of(make_gateway, provider, tmp_path)
    given = await answer_with_a_tool(gateway.client, provider, stream)
    assert given["id"].startswith("resp_tspan_")
    retrieved = await gateway.client.responses.retrieve(given["id"])
    assert retrieved.id == given["id"]
    assert retrieved.output_text == "1 + 2 = 3"
    assert retrieved.usage is not None
    assert (retrieved.usage.input_tokens, retrieved.usage.output_tokens) == (30, 12)  # both rounds
    assert retrieved.model_dump(exclude_unset=True) == given
    assert gateway.metric(names.METRIC_REQUESTS, **{names.LABEL_ROUTE: ROUTE, names.LABEL_STATUS: "200"}) == 1


async def test_input_items_are_the_input_the_client_sent(make_gateway: GatewayFactory, provider: Provider,
                                                        tmp_path: Path) -> None:
    gateway = await gateway_of(make_gateway, provider, tmp_path)
    given = await answer_with_a_tool(gateway.client, provider, False)
    listed = await gateway.client.responses.input_items.list(given["id"], order="asc")
    texts = [(item.role, item.content[0].text) for item in listed.data]  # type: ignore[union-attr]
    assert texts == [("developer", "be brief"), ("user", "add 1 and 2"), ("user", "please")]
    assert listed.has_more is False
    assert [item.type for item in listed.data] == ["message"] * 3
    # Paged as the API pages, newest first by default: the client follows `after` to the end.
    paged = [item.id async for item in gateway.client.responses.input_items.list(given["id"], limit=1)]
    assert paged == [item.id for item in reversed(listed.data)]
    assert len(set(paged)) == 3
    # A string input is one user message.
    text = await answer_with_a_tool(gateway.client, provider, True, sent="add 1 and 2")
    [item] = (await gateway.client.responses.input_items.list(text["id"])).data
    assert (item.role, item.content[0].text) == ("user", "add 1 and 2")  # type: ignore[union-attr]


async def test_delete_deletes_every_provider_response_behind_it(make_gateway: GatewayFactory, provider: Provider,
                                                                tmp_path: Path) -> None:
    gateway = await gateway_of(make_gateway, provider, tmp_path)
    given = await answer_with_a_tool(gateway.client, provider, False)
    rounds = [f"resp_scripted_{n}" for n in (1, 2)]
    assert all(provider.holds(r) for r in rounds)
    await gateway.client.responses.delete(given["id"])
    assert not any(provider.holds(r) for r in rounds)
    for gone in (gateway.client.responses.retrieve, gateway.client.responses.input_items.list,
                 gateway.client.responses.delete):
        with pytest.raises(openai.NotFoundError) as caught:
            await gone(given["id"])
        assert caught.value.code == "response_not_found"


async def test_a_gateway_response_cannot_be_cancelled(make_gateway: GatewayFactory, provider: Provider,
                                                      tmp_path: Path) -> None:
    gateway = await gateway_of(make_gateway, provider, tmp_path)
    given = await answer_with_a_tool(gateway.client, provider, False)
    with pytest.raises(openai.BadRequestError) as caught:
        await gateway.client.responses.cancel(given["id"])
    assert caught.value.code == "response_not_cancellable"
    with pytest.raises(openai.NotFoundError) as unknown:
        await gateway.client.responses.cancel("resp_tspan_never_made")
    assert unknown.value.code == "response_not_found"


async def test_another_key_finds_nothing(make_gateway: GatewayFactory, provider: Provider, tmp_path: Path,
                                         bob: Any) -> None:
    gateway = await gateway_of(make_gateway, provider, tmp_path)
    given = await answer_with_a_tool(gateway.client, provider, False)
    intruder = bob(gateway)
    for reach in (intruder.responses.retrieve, intruder.responses.input_items.list, intruder.responses.delete,
                  intruder.responses.cancel):
        with pytest.raises(openai.NotFoundError) as caught:
            await reach(given["id"])
        assert caught.value.code == "response_not_found"
    assert all(provider.holds(r) for r in ("resp_scripted_1", "resp_scripted_2"))  # nothing was deleted
    assert (await gateway.client.responses.retrieve(given["id"])).output_text == "1 + 2 = 3"


async def test_across_replicas_in_redis(make_gateway: GatewayFactory, provider: Provider, tmp_path: Path,
                                        redis_up: RedisServer, bob: Any) -> None:
    first = await gateway_of(make_gateway, provider, tmp_path, "one", state_url=redis_up.url)
    second = await gateway_of(make_gateway, provider, tmp_path, "two", state_url=redis_up.url)
    given = await answer_with_a_tool(first.client, provider, True)
    assert (await second.client.responses.retrieve(given["id"])).model_dump(exclude_unset=True) == given
    listed = await second.client.responses.input_items.list(given["id"], order="asc")
    assert [item.content[0].text for item in listed.data] == ["be brief", "add 1 and 2", "please"]  # type: ignore
    with pytest.raises(openai.NotFoundError):
        await bob(second).responses.retrieve(given["id"])
    await second.client.responses.delete(given["id"])
    assert not any(provider.holds(r) for r in ("resp_scripted_1", "resp_scripted_2"))
    with pytest.raises(openai.NotFoundError):
        await first.client.responses.retrieve(given["id"])


async def test_a_record_too_large_to_keep_is_read_from_the_provider(make_gateway: GatewayFactory,
                                                                    provider: Provider, tmp_path: Path) -> None:
    """Past answer_record_max_bytes only the rounds' ids are kept: GET is the provider's last
    response under the client's id, and DELETE still deletes every round."""
    gateway = await gateway_of(make_gateway, provider, tmp_path, answer_record_max_bytes=0)
    given = await answer_with_a_tool(gateway.client, provider, False)
    retrieved = await gateway.client.responses.retrieve(given["id"])
    assert (retrieved.id, retrieved.status) == (given["id"], "completed")
    assert (await gateway.client.responses.input_items.list(given["id"])).object == "list"
    await gateway.client.responses.delete(given["id"])
    assert not any(provider.holds(r) for r in ("resp_scripted_1", "resp_scripted_2"))


async def test_garbage_in_redis_is_a_record_not_held(make_gateway: GatewayFactory, provider: Provider,
                                                     tmp_path: Path, redis_up: RedisServer) -> None:
    """What is not a record the gateway wrote is missing: GET then reads the provider's last
    response behind the id (its alias), never a 500; the unreadable value is counted."""
    gateway = await gateway_of(make_gateway, provider, tmp_path, state_url=redis_up.url)
    async with Redis.from_url(redis_up.url) as raw:
        before = set(await raw.keys("toolspan:answer:*"))  # other tests' records, on the same server
        given = await answer_with_a_tool(gateway.client, provider, False)
        [key] = set(await raw.keys("toolspan:answer:*")) - before
        await raw.set(key, b'{"rounds": 7, \xff', px=60_000)
    retrieved = await gateway.client.responses.retrieve(given["id"])
    assert (retrieved.id, retrieved.status) == (given["id"], "completed")
    assert gateway.metric(names.METRIC_STATE_STORE_UNREADABLE, **{names.LABEL_KIND: "answer"}) == 1
