"""Several upstreams in one gateway (issue 55), through the official openai and anthropic clients
and the Agents SDK: four scripted providers (two OpenAI ones, two Anthropic ones), each on a server
of its own. A request's model picks its provider by name, alias or pattern, every provider call of
the tool loop the same way; a 429, a 503, a 529 or a refused connection before the answer moves the
call to the fallback, and the gateway's tools run once; a stream that broke after its first byte is
not moved, one that broke having only opened is, and the client's answer is opened once; an
upstream that keeps failing cools down, is probed and comes back; a model no one serves, or that a
key may not use, is a 404 model_not_found, and one whose upstreams do not speak the API a 400
api_not_served; /readyz names each upstream."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anthropic
import openai
import pytest
from agents import Agent, OpenAIProvider, RunConfig
from opentelemetry.sdk.trace import ReadableSpan
from pytest_aiohttp import AiohttpServer

from gateway.demo.model import Reply, ScriptedModel
from gateway.http.keys import SETTINGS, UPSTREAMS
from gateway.provider.cooldowns import MemoryCooldowns
from gateway.settings.model import Settings
from telemetry import names
from tests.conftest import STREAM, TEST_KEY, Clock, Gateway, GatewayFactory, Script, free_port, tool_outcomes
from tests.e2e.test_agents_sdk import SECRET, agent_model, final_output, lookup_secret

ASKED = "Add 2 and 3."
SUM = "The sum is 5."
ADDING = Reply(tool_calls=[("add", {"a": 2, "b": 3})])  # the gateway's tool: its result goes back to the model
ANSWER = Reply(content=SUM)


@dataclass
class Provider:
    """One scripted provider on a server of its own: what it answers, and what it was sent."""

    model: ScriptedModel
    script: Script
    url: str  # its base URL, ending in /v1

    @property
    def requests(self) -> list[dict[str, Any]]:
        return self.model.requests


@dataclass
class Routed:
    """A gateway in front of four providers: `oai` (openai: gpt-4o, gpt-4.1* and the alias fast ->
    gpt-4o-mini, falling back to `spare`), `spare` (openai), `claude` (anthropic: claude-* and the
    alias sonnet -> claude-sonnet-4-5, falling back to `backup`) and `backup` (anthropic)."""

    gateway: Gateway
    oai: Provider
    spare: Provider
    claude: Provider
    backup: Provider

    def chats(self) -> list[ReadableSpan]:
        """Every provider call's chat span, in the order they started."""
        return [s for s in self.gateway.spans() if s.name.startswith(names.SPAN_CHAT_PREFIX + " ")]

    def called(self) -> list[tuple[Any, ...]]:
        """(upstream, provider name, fallen back from, why) of each provider call, in order."""
        return [tuple((s.attributes or {}).get(key) for key in (
            names.ATTR_UPSTREAM, names.ATTR_PROVIDER_NAME, names.ATTR_UPSTREAM_FALLBACK_FROM,
            names.ATTR_UPSTREAM_FALLBACK_REASON)) for s in self.chats()]

    def provider(self, upstream: str) -> Provider:
        found: Provider = getattr(self, upstream)
        return found

    def others(self, *upstreams: str) -> list[list[dict[str, Any]]]:
        """What the providers other than `upstreams` were sent."""
        return [p.requests for name, p in vars(self).items() if isinstance(p, Provider) and name not in upstreams]

    def up(self, upstream: str) -> float:
        return self.gateway.metric(names.METRIC_UPSTREAM_UP, **{names.LABEL_UPSTREAM: upstream})

    def fallbacks(self, source: str, to: str, reason: str) -> float:
        return self.gateway.metric(names.METRIC_UPSTREAM_FALLBACKS, **{
            names.LABEL_FROM: source, names.LABEL_TO: to, names.LABEL_REASON: reason})

    def anthropic(self, api_key: str = TEST_KEY) -> anthropic.AsyncAnthropic:
        return anthropic.AsyncAnthropic(base_url=self.gateway.url, api_key=api_key, max_retries=0, timeout=20)


RoutedFactory = Callable[..., Awaitable[Routed]]
OPENAI_KIND = ("chat", "responses")  # what an OpenAI provider serves: it has no /v1/messages
ANTHROPIC_KIND = ("messages",)


async def scripted(aiohttp_server: AiohttpServer, apis: tuple[str, ...]) -> Provider:
    script = Script()
    model = ScriptedModel(script, apis=apis)
    server = await aiohttp_server(model.app())
    return Provider(model, script, str(server.make_url("/v1")))


def table(urls: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The upstreams table of a `Routed`, given each provider's URL."""
    return {
        "oai": {"url": urls["oai"], "kind": "openai", "models": ["gpt-4o", "gpt-4.1*"],
                "aliases": {"fast": "gpt-4o-mini"}, "fallbacks": ["spare"]},
        "spare": {"url": urls["spare"], "kind": "openai", "models": ["spare-1"]},
        "claude": {"url": urls["claude"], "kind": "anthropic", "models": ["claude-*"],
                   "aliases": {"sonnet": "claude-sonnet-4-5"}, "fallbacks": ["backup"]},
        "backup": {"url": urls["backup"], "kind": "anthropic"},
    }


def nothing_listening() -> str:
    """A provider URL on a port nothing listens on: its connections are refused."""
    return f"http://127.0.0.1:{free_port()}/v1"


@pytest.fixture
async def make_routed(aiohttp_server: AiohttpServer, make_gateway: GatewayFactory,
                      clean_env: pytest.MonkeyPatch) -> RoutedFactory:
    """Builds a `Routed`; `refused` names upstreams put where nothing listens, the keyword
    arguments are Settings overrides."""
    async def build(refused: tuple[str, ...] = (), **overrides: Any) -> Routed:
        providers = {name: await scripted(aiohttp_server, apis) for name, apis in (
            ("oai", OPENAI_KIND), ("spare", OPENAI_KIND), ("claude", ANTHROPIC_KIND), ("backup", ANTHROPIC_KIND))}
        urls = {name: nothing_listening() if name in refused else p.url for name, p in providers.items()}
        overrides.setdefault("trajectory_store", False)
        settings = Settings(port=0, upstreams=table(urls), **overrides)
        return Routed(await make_gateway(settings), **providers)

    return build


@pytest.fixture
async def routed(make_routed: RoutedFactory) -> Routed:
    return await make_routed()


# --- asking through each client ------------------------------------------------------------------------

@dataclass
class Asked:
    text: str
    trace_id: str
    events: list[dict[str, Any]] = field(default_factory=list)  # a stream's, as the client read them


async def chat(client: openai.AsyncOpenAI, model: str, stream: bool) -> Asked:
    """One Chat Completions request through the openai client: the answer's text."""
    messages: Any = [{"role": "user", "content": ASKED}]
    if not stream:
        raw = await client.chat.completions.with_raw_response.create(model=model, messages=messages)
        return Asked(raw.parse().choices[0].message.content or "", raw.headers["x-trace-id"])
    streamed = await client.chat.completions.with_raw_response.create(model=model, messages=messages, stream=True)
    chunks = [chunk async for chunk in streamed.parse()]
    text = "".join(choice.delta.content or "" for chunk in chunks for choice in chunk.choices)
    return Asked(text, streamed.headers["x-trace-id"], [chunk.model_dump() for chunk in chunks])


async def respond(client: openai.AsyncOpenAI, model: str, stream: bool) -> Asked:
    """One Responses request through the openai client: the answer's text."""
    if not stream:
        raw = await client.responses.with_raw_response.create(model=model, input=ASKED)
        return Asked(raw.parse().output_text, raw.headers["x-trace-id"])
    streamed = await client.responses.with_raw_response.create(model=model, input=ASKED, stream=True)
    events = [event async for event in streamed.parse()]
    last = events[-1]
    assert last.type == "response.completed"
    return Asked(last.response.output_text, streamed.headers["x-trace-id"], [e.model_dump() for e in events])


async def message(client: anthropic.AsyncAnthropic, model: str, stream: bool) -> Asked:
    """One Messages request through the anthropic client: the answer's text."""
    request: Any = {"model": model, "max_tokens": 256, "messages": [{"role": "user", "content": ASKED}]}
    events: list[dict[str, Any]] = []
    if not stream:
        raw = await client.messages.with_raw_response.create(**request)
        answered = await raw.parse()
        headers = raw.headers
    else:
        async with client.messages.stream(**request) as streamed:
            events = [event.model_dump() async for event in streamed]
            answered = await streamed.get_final_message()
            headers = streamed.response.headers
    text = "".join(block.text for block in answered.content if block.type == "text")
    return Asked(text, headers["x-trace-id"], events)


@dataclass(frozen=True)
class Lane:
    """An API, the model asked for in it, the upstream that serves it and the one it falls back to."""

    api: str
    model: str
    primary: str
    fallback: str
    provider: str  # gen_ai.provider.name of both


LANES = {"chat": Lane("chat", "gpt-4o", "oai", "spare", "openai"),
         "responses": Lane("responses", "gpt-4o", "oai", "spare", "openai"),
         "messages": Lane("messages", "claude-opus-4-1", "claude", "backup", "anthropic")}


async def ask(routed: Routed, api: str, model: str, stream: bool) -> Asked:
    """One request of `api` through its official client."""
    if api == "messages":
        async with routed.anthropic() as client:
            return await message(client, model, stream)
    return await (chat if api == "chat" else respond)(routed.gateway.client, model, stream)


def result_sent(body: dict[str, Any]) -> list[Any]:
    """The gateway tool's results in a provider request, whichever API it is in."""
    if "input" in body:
        return [item["output"] for item in body["input"] if item.get("type") == "function_call_output"]
    found = [m["content"] for m in body["messages"] if m.get("role") == "tool"]
    found += [block["content"] for m in body["messages"] if isinstance(m.get("content"), list)
              for block in m["content"] if block.get("type") == "tool_result"]
    return found


# --- routing by name, alias and pattern ------------------------------------------------------------------

@STREAM
@pytest.mark.parametrize(("api", "model", "upstream", "sent"), [
    ("chat", "gpt-4o", "oai", "gpt-4o"), ("chat", "fast", "oai", "gpt-4o-mini"),
    ("chat", "gpt-4.1-nano", "oai", "gpt-4.1-nano"), ("responses", "gpt-4o", "oai", "gpt-4o"),
    ("responses", "fast", "oai", "gpt-4o-mini"), ("responses", "gpt-4.1-nano", "oai", "gpt-4.1-nano"),
    ("messages", "sonnet", "claude", "claude-sonnet-4-5"), ("messages", "claude-opus-4-1", "claude", "claude-opus-4-1"),
], ids=["chat-name", "chat-alias", "chat-pattern", "responses-name", "responses-alias", "responses-pattern",
        "messages-alias", "messages-pattern"])
async def test_a_model_goes_to_its_upstream_for_every_round(routed: Routed, api: str, model: str, upstream: str,
                                                            sent: str, stream: bool) -> None:
    """Both provider calls of a request whose model ran a gateway tool go to the model's upstream;
    an alias sends the provider its own name for the model."""
    provider = routed.provider(upstream)
    provider.script.then(ADDING, ANSWER)
    asked = await ask(routed, api, model, stream)
    assert asked.text == SUM
    assert [body["model"] for body in provider.requests] == [sent, sent]
    assert result_sent(provider.requests[1]) == ["5"]
    assert routed.others(upstream) == [[], [], []]
    assert tool_outcomes(routed.gateway, asked.trace_id) == [("add", "ok")]
    kind = "anthropic" if api == "messages" else "openai"
    assert routed.called() == [(upstream, kind, None, None)] * 2
    assert routed.gateway.metric(names.METRIC_UPSTREAM_REQUESTS, upstream=upstream, status="200") == 2


@pytest.mark.parametrize("api", ["responses", "chat"])
@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_an_agents_sdk_run_goes_to_the_upstream_its_model_picks(routed: Routed, api: str,
                                                                      streamed: bool) -> None:
    routed.oai.script.then(agent_model, agent_model, agent_model)
    provider = OpenAIProvider(openai_client=routed.gateway.client, use_responses=None if api == "responses" else False)
    agent = Agent(name="helper", instructions="Be brief.", tools=[lookup_secret], model="gpt-4.1-mini")
    final = await final_output(agent, "Add 2 and 3, then tell me the door secret.",
                               RunConfig(model_provider=provider, tracing_disabled=True), streamed)
    assert final == f"The sum is 5 and the secret is {SECRET}."
    assert [body["model"] for body in routed.oai.requests] == ["gpt-4.1-mini"] * 3  # by the pattern gpt-4.1*
    assert routed.others("oai") == [[], [], []]
    assert routed.called() == [("oai", "openai", None, None)] * 3
    tools = [(s.attributes or {})[names.ATTR_TOOL_NAME] for s in routed.gateway.spans()
             if s.name == names.SPAN_TOOL_CALL and (s.attributes or {}).get(names.ATTR_TOOL_SIDE) == names.SIDE_GATEWAY]
    assert tools == ["add"]  # the agent's own tool ran in the SDK, the gateway's here, once


# --- falling back before the answer ------------------------------------------------------------------------

FAILURES = {"429": Reply(status=429, error="rate limited"), "503": Reply(status=503, error="unavailable"),
            "529": Reply(status=529, error="overloaded"), "connection": None}


@STREAM
@pytest.mark.parametrize(("api", "failure"), [
    *((api, failure) for api in LANES for failure in ("429", "503", "connection")), ("messages", "529")])
async def test_a_failure_before_the_answer_is_answered_by_the_fallback(make_routed: RoutedFactory, api: str,
                                                                       failure: str, stream: bool) -> None:
    """Both provider calls of the loop fail on the model's upstream and move to its fallback: the
    tool round that ran is kept (the fallback is sent its result) and the tool ran once."""
    lane = LANES[api]
    routed = await make_routed(refused=(lane.primary,) if failure == "connection" else ())
    primary, fallback = routed.provider(lane.primary), routed.provider(lane.fallback)
    if (reply := FAILURES[failure]) is not None:
        primary.script.then(reply, reply)
    fallback.script.then(ADDING, ANSWER)
    asked = await ask(routed, api, lane.model, stream)
    assert asked.text == SUM
    assert len(primary.requests) == (0 if failure == "connection" else 2)  # tried first, in each round
    assert [body["model"] for body in fallback.requests] == [lane.model, lane.model]
    assert result_sent(fallback.requests[1]) == ["5"]
    assert tool_outcomes(routed.gateway, asked.trace_id) == [("add", "ok")]
    assert routed.called() == [(lane.primary, lane.provider, None, None),
                               (lane.fallback, lane.provider, lane.primary, failure)] * 2
    assert routed.fallbacks(lane.primary, lane.fallback, failure) == 2
    assert routed.gateway.metric(names.METRIC_UPSTREAM_REQUESTS, upstream=lane.fallback, status="200") == 2
    assert routed.up(lane.primary) == 1  # two failures: under the three that cool it down


@STREAM
async def test_a_failure_of_the_last_target_is_the_clients(routed: Routed, stream: bool) -> None:
    routed.oai.script.then(Reply(status=503, error="unavailable"))
    routed.spare.script.then(Reply(status=429, error="spare rate limited"))
    with pytest.raises(openai.RateLimitError) as caught:
        await chat(routed.gateway.client, "gpt-4o", stream)
    assert "spare rate limited" in caught.value.message
    assert routed.called() == [("oai", "openai", None, None), ("spare", "openai", "oai", "503")]


@pytest.mark.parametrize("api", ["responses", "messages"])
async def test_a_stream_that_broke_having_only_opened_is_answered_by_the_fallback(routed: Routed, api: str) -> None:
    """The provider's stream opened (response.created, message_start) and broke before any of the
    answer: the client has seen nothing of that one, so the fallback answers, and the client's
    stream is opened once, by the provider that answered (its usage: 10 tokens in, not 77)."""
    lane = LANES[api]
    routed.provider(lane.primary).script.then(Reply(content="never shown", usage=(77, 5), break_stream_after=1))
    routed.provider(lane.fallback).script.then(ANSWER)
    asked = await ask(routed, api, lane.model, True)
    assert asked.text == SUM
    assert routed.called() == [(lane.primary, lane.provider, None, None),
                               (lane.fallback, lane.provider, lane.primary, "connection")]
    opened = "response.created" if api == "responses" else "message_start"
    starts = [e for e in asked.events if e["type"] == opened]
    assert len(starts) == 1, starts  # not the broken stream's as well
    [start] = starts
    if api == "messages":
        assert start["message"]["usage"]["input_tokens"] == 10
    else:
        assert start["response"]["id"] == asked.events[-1]["response"]["id"]


# --- no fallback once the client saw a byte of the answer ------------------------------------------------

async def drained(texts: AsyncIterator[str], received: list[str]) -> None:
    """Reads a stream's texts into `received` until it ends, or raises."""
    async for text in texts:
        received.append(text)


async def test_a_chat_stream_broken_after_its_first_byte_is_not_moved(routed: Routed) -> None:
    routed.oai.script.then(Reply(content="hello world, a long answer", break_stream_after=3))
    routed.spare.script.then(ANSWER)
    raw = await routed.gateway.client.chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": ASKED}], stream=True)
    received: list[str] = []
    with pytest.raises(openai.APIError) as caught:
        await drained((choice.delta.content or "" async for chunk in raw.parse() for choice in chunk.choices), received)
    assert not isinstance(caught.value, openai.APIStatusError)  # an error event in the stream, after its 200
    assert "".join(received) == "hello world,"
    assert routed.spare.requests == []
    assert routed.called() == [("oai", "openai", None, None)]
    assert routed.gateway.metric(names.METRIC_UPSTREAM_FALLBACKS) == 0


async def test_a_responses_stream_broken_after_its_first_byte_is_not_moved(routed: Routed) -> None:
    routed.oai.script.then(Reply(content="hello world, a long answer", break_stream_after=6))
    routed.spare.script.then(ANSWER)
    raw = await routed.gateway.client.responses.with_raw_response.create(model="gpt-4o", input=ASKED, stream=True)
    events = [event async for event in raw.parse()]
    assert [e.type for e in events][:2] == ["response.created", "response.in_progress"]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "hello world,"
    assert events[-1].type == "error"
    assert routed.spare.requests == []
    assert routed.called() == [("oai", "openai", None, None)]
    assert routed.gateway.metric(names.METRIC_UPSTREAM_FALLBACKS) == 0


async def test_a_messages_stream_broken_after_its_first_byte_is_not_moved(routed: Routed) -> None:
    routed.claude.script.then(Reply(content="hello world, a long answer", break_stream_after=4))
    routed.backup.script.then(ANSWER)
    received: list[str] = []
    async with routed.anthropic() as client, client.messages.stream(
            model="claude-opus-4-1", max_tokens=256, messages=[{"role": "user", "content": ASKED}]) as streamed:
        with pytest.raises(anthropic.APIStatusError) as caught:
            await drained(streamed.text_stream, received)
    assert caught.value.status_code == 200  # an error event in the stream, after its 200
    assert "".join(received) == "hello "
    assert routed.backup.requests == []
    assert routed.called() == [("claude", "anthropic", None, None)]
    assert routed.gateway.metric(names.METRIC_UPSTREAM_FALLBACKS) == 0


# --- cooling down, the probe, and back ----------------------------------------------------------------------


@pytest.fixture
async def cooling(make_routed: RoutedFactory) -> tuple[Routed, Clock]:
    """A `Routed` whose `oai` cools down after two failures, for 30 s of a clock the test moves: the
    gateway's upstreams keep cooldowns of its settings' rule on that clock."""
    routed = await make_routed(cooldown_failures=2, cooldown_window_seconds=60, cooldown_seconds=30)
    clock = Clock()
    app = routed.gateway.http.app
    assert app is not None
    app[UPSTREAMS].cooldowns = MemoryCooldowns(app[SETTINGS].cooldown_rule(), clock)
    return routed, clock


async def answered_by(routed: Routed, *replies: Reply) -> list[str]:
    """Asks once for gpt-4o (oai's model, spare its fallback); which upstreams were called, in order."""
    before = len(routed.chats())
    routed.spare.script.then(ANSWER)
    routed.oai.script.then(*replies)
    assert (await chat(routed.gateway.client, "gpt-4o", False)).text == SUM
    routed.spare.script.replies.clear()
    routed.oai.script.replies.clear()
    return [str((s.attributes or {})[names.ATTR_UPSTREAM]) for s in routed.chats()[before:]]


FAILED = Reply(status=503, error="overloaded")


async def test_an_upstream_cools_down_and_a_probe_brings_it_back(cooling: tuple[Routed, Clock]) -> None:
    routed, clock = cooling
    assert await answered_by(routed, FAILED) == ["oai", "spare"]
    assert routed.up("oai") == 1  # one failure of the two
    assert await answered_by(routed, FAILED) == ["oai", "spare"]
    assert routed.up("oai") == 0  # out
    clock.now += 29
    for _ in range(3):
        assert await answered_by(routed) == ["spare"]  # straight to the fallback: oai is not asked
    assert len(routed.oai.requests) == 2
    assert routed.up("oai") == 0
    clock.now += 2  # its time is up: its next call is the probe, and a failed probe takes it out at once
    assert await answered_by(routed, FAILED) == ["oai", "spare"]
    assert routed.up("oai") == 0
    assert await answered_by(routed) == ["spare"]
    clock.now += 31
    assert await answered_by(routed, ANSWER) == ["oai"]  # the probe answered: back
    assert routed.up("oai") == 1
    assert await answered_by(routed, ANSWER) == ["oai"]
    assert await answered_by(routed, FAILED) == ["oai", "spare"]  # its failures counted afresh: one of two
    assert routed.up("oai") == 1
    assert len(routed.oai.requests) == 6


# --- models no one serves, or that a key may not use; an API the upstream does not speak ------------------

async def test_an_unknown_model_is_a_404_naming_the_models_in_each_clients_shape(routed: Routed) -> None:
    listed = "the models you may use: fast, gpt-4o, sonnet, spare-1"
    with pytest.raises(openai.NotFoundError) as chat_refused:
        await chat(routed.gateway.client, "llama3", False)
    assert (chat_refused.value.code, chat_refused.value.param) == ("model_not_found", "model")
    assert "'llama3' is not served here" in chat_refused.value.message
    assert listed in chat_refused.value.message
    with pytest.raises(openai.NotFoundError) as responses_refused:
        await respond(routed.gateway.client, "llama3", True)
    assert responses_refused.value.code == "model_not_found"
    async with routed.anthropic() as client:
        with pytest.raises(anthropic.NotFoundError) as messages_refused:
            await message(client, "llama3", True)
    body: Any = messages_refused.value.body
    assert body["type"] == "error"
    assert body["error"]["type"] == "not_found_error"
    assert listed in body["error"]["message"]
    assert routed.others() == [[], [], [], []]


async def test_a_key_limited_to_models_gets_a_404_for_the_others(make_routed: RoutedFactory) -> None:
    routed = await make_routed(keys={"mini": {"key": "gk-mini-0123456789", "models": ["gpt-4o*"]}})
    client = openai.AsyncOpenAI(base_url=f"{routed.gateway.url}/v1", api_key="gk-mini-0123456789", max_retries=0)
    async with client:
        for model in ("fast", "gpt-4.1-nano"):
            with pytest.raises(openai.NotFoundError) as refused:
                await chat(client, model, False)
            assert refused.value.code == "model_not_found"
            assert refused.value.message.endswith("the models you may use: gpt-4o")
        routed.oai.script.then(ANSWER)
        assert (await chat(client, "gpt-4o", False)).text == SUM
    async with routed.anthropic("gk-mini-0123456789") as anthropic_client:
        with pytest.raises(anthropic.NotFoundError):
            await message(anthropic_client, "sonnet", False)
    assert [body["model"] for body in routed.oai.requests] == ["gpt-4o"]
    assert routed.claude.requests == []


async def test_a_model_whose_upstream_speaks_another_api_is_translated_or_refused(
        routed: Routed, aiohttp_server: AiohttpServer, make_gateway: GatewayFactory) -> None:
    routed.claude.script.then(Reply(content="from claude"))
    answer = await chat(routed.gateway.client, "sonnet", False)  # Chat, to an Anthropic upstream: translated
    assert answer.text == "from claude"
    assert [p.split("?")[0] for p in routed.claude.model.request_paths] == ["/v1/messages"]
    only_responses = await scripted(aiohttp_server, ("responses",))
    gateway = await make_gateway(Settings(port=0, trajectory_store=False, upstreams={"resp": {
        "url": only_responses.url, "kind": "openai", "apis": ["responses"], "models": ["gpt-5"]}}))
    async with anthropic.AsyncAnthropic(base_url=gateway.url, api_key="k", max_retries=0) as client:
        with pytest.raises(anthropic.BadRequestError) as refused:  # Messages goes to Chat or nowhere
            await message(client, "gpt-5", True)
    body: Any = refused.value.body
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith("no upstream of this gateway speaks Anthropic's Messages")
    assert only_responses.model.request_paths == []


# --- readiness ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("refused", "default", "status"), [
    (("oai",), None, "ready"), (("oai",), "oai", "ready"), (("oai", "spare"), "oai", "provider_unreachable")],
    ids=["no-default", "default-down-its-fallback-up", "default-route-down"])
async def test_readyz_lists_the_upstreams_it_needs_and_is_ready_while_one_of_the_default_route_is(
        make_routed: RoutedFactory, refused: tuple[str, ...], default: str | None, status: str) -> None:
    routed = await make_routed(refused=refused, default_upstream=default)
    async with routed.gateway.http.get("/readyz") as response:
        assert response.status == (200 if status == "ready" else 503)
        ready = await response.json()
    assert ready["status"] == status
    listed = ready["upstreams"]  # those it waits on: the default route's (with no default, every one)
    assert list(listed) == (["oai", "spare"] if default else ["oai", "spare", "claude", "backup"])
    assert all(("cannot connect" in listed[name]) == (name in refused) for name in listed), listed
    assert all(listed[name] == "reachable" for name in listed if name not in refused)
