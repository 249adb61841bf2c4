"""Several upstreams across replicas and requests (issue 55): two gateways on one real Redis agree
on an upstream that cooled down; a Responses conversation continues on the upstream that made its
response, though deployments of its model share calls; GET /v1/models answers the configured
models, per key, in the client's shape; the store, the page and the report name each model turn's
upstream; with no default upstream, a request passed on goes where its body's model routes."""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import pytest
from aiohttp.test_utils import TestServer

from gateway.demo.model import Reply, ScriptedModel
from gateway.http.keys import UPSTREAMS
from gateway.settings.model import Settings
from telemetry import names
from telemetry.store import report, report_text
from tests.conftest import Gateway, GatewayFactory, Script
from tests.e2e.redis_server import RedisServer

pytestmark = pytest.mark.slow
Upstream = tuple[ScriptedModel, Script]
UpstreamFactory = Callable[[], Awaitable[Upstream]]


@pytest.fixture
def scripted(aiohttp_server: Callable[..., Awaitable[TestServer]]) -> UpstreamFactory:
    """A scripted model on a server of its own: one upstream (its response ids apart from the others')."""
    made = itertools.count()

    async def build() -> Upstream:
        script = Script()
        model = ScriptedModel(script, first_id=1000 * next(made) + 1)
        server = await aiohttp_server(model.app())
        model.base_url = str(server.make_url("")).rstrip("/")
        return model, script
    return build


def table(east: ScriptedModel, west: ScriptedModel, **east_entry: Any) -> dict[str, Any]:
    return {"east": {"url": f"{east.base_url}/v1", "kind": "compatible", "models": ["gpt-4o"], **east_entry},
            "west": {"url": f"{west.base_url}/v1", "kind": "compatible", "models": ["gpt-4o-mini"]}}


async def test_two_replicas_on_one_redis_agree_on_an_upstream_cooling_down(
        scripted: UpstreamFactory, make_gateway: GatewayFactory, redis_up: RedisServer, tmp_path: Path) -> None:
    (east, east_script), (west, west_script) = await scripted(), await scripted()

    def replica(name: str) -> Settings:
        return Settings(port=0, upstreams=table(east, west, fallbacks=["west"]), state_url=redis_up.url,
                        cooldown_failures=2, cooldown_window_seconds=60, cooldown_seconds=60,
                        trajectory_store_path=tmp_path / f"{name}.sqlite3")

    first, second = await make_gateway(replica("first")), await make_gateway(replica("second"))
    east_script.then(Reply(status=503), Reply(status=503))
    west_script.then(Reply(content="one"), Reply(content="two"), Reply(content="three"))
    for gateway in (first, first):  # two failures on the first replica: east cools down, for both
        answer = await gateway.client.chat.completions.create(model="gpt-4o", messages=[{"role": "user",
                                                                                            "content": "hi"}])
        assert answer.choices[0].message.content in ("one", "two")
    assert len(east.requests) == 2
    answer = await second.client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content == "three"
    assert len(east.requests) == 2  # the second replica passed over east: it never asked it
    assert [s.attributes.get(names.ATTR_UPSTREAM) for s in second.spans() if s.name.startswith("chat ")] == ["west"]
    assert second.metric(names.METRIC_UPSTREAM_UP, upstream="east") == 0
    assert second.metric(names.METRIC_UPSTREAM_FALLBACKS) == 0  # nothing failed there: east was left out
    assert first.metric(names.METRIC_UPSTREAM_FALLBACKS, **{"from": "east", "to": "west", "reason": "503"}) == 2


async def test_a_responses_conversation_continues_where_its_response_was_made(
        scripted: UpstreamFactory, make_gateway: GatewayFactory, tmp_path: Path) -> None:
    (east, east_script), (west, west_script) = await scripted(), await scripted()
    both = {"east": {"url": f"{east.base_url}/v1", "kind": "compatible", "models": ["gpt-4o"]},
            "west": {"url": f"{west.base_url}/v1", "kind": "compatible", "models": ["gpt-4o"]}}
    gateway = await make_gateway(Settings(port=0, upstreams=both, trajectory_store_path=tmp_path / "s.sqlite3"))
    east_script.then(Reply(content="first"), Reply(content="third"))
    west_script.then(Reply(content="second"))
    first = await gateway.client.responses.create(model="gpt-4o", input="hi", store=True)
    assert first.output_text == "first"  # round robin: east, then west
    other = await gateway.client.responses.create(model="gpt-4o", input="another conversation")
    assert other.output_text == "second"
    follow_up = await gateway.client.responses.create(model="gpt-4o", input="and then?",
                                                      previous_response_id=first.id)
    assert follow_up.output_text == "third"  # back on east, which holds `first`, though west's turn came
    assert east.requests[-1]["previous_response_id"] == first.id
    assert len(west.requests) == 1


async def _models_gateway(scripted: UpstreamFactory, make_gateway: GatewayFactory, tmp_path: Path) -> Gateway:
    (east, _), (west, _) = await scripted(), await scripted()
    upstreams = table(east, west, aliases={"fast": "gpt-4o-mini"}, fallbacks=["west"])
    upstreams["claude"] = {"url": f"{west.base_url}/v1", "kind": "anthropic", "models": ["claude-sonnet-4", "claude-*"]}
    keys = {"all": {"key": "sk-all-models"}, "small": {"key": "sk-small-only", "models": ["gpt-4o-mini", "fast"]}}
    return await make_gateway(Settings(port=0, upstreams=upstreams, keys=keys,
                                       trajectory_store_path=tmp_path / "s.sqlite3"))


async def test_the_models_listed_are_the_configured_ones_per_key(
        scripted: UpstreamFactory, make_gateway: GatewayFactory, tmp_path: Path) -> None:
    gateway = await _models_gateway(scripted, make_gateway, tmp_path)
    every = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="sk-all-models", max_retries=0)
    small = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="sk-small-only", max_retries=0)
    listed = [(m.id, m.owned_by) async for m in every.models.list()]
    assert listed == [("gpt-4o", "east"), ("fast", "east"), ("gpt-4o-mini", "west"), ("claude-sonnet-4", "claude")]
    assert [m.id async for m in small.models.list()] == ["fast", "gpt-4o-mini"]
    assert (await every.models.retrieve("fast")).owned_by == "east"
    with pytest.raises(openai.NotFoundError) as refused:
        await small.models.retrieve("gpt-4o")
    assert refused.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError) as refused:  # the key's limit holds on the tool loop too
        await small.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert refused.value.code == "model_not_found"
    assert "fast, gpt-4o-mini" in str(refused.value.message)
    claude = anthropic.AsyncAnthropic(base_url=gateway.url, api_key="sk-all-models", max_retries=0)
    page = await claude.models.list()
    assert [m.id for m in page.data][-1] == "claude-sonnet-4"
    assert (page.first_id, page.last_id, page.has_more) == ("gpt-4o", "claude-sonnet-4", False)
    await every.close()
    await small.close()
    await claude.close()


async def test_the_store_the_page_and_the_report_say_where_each_model_turn_went(
        scripted: UpstreamFactory, make_gateway: GatewayFactory, tmp_path: Path) -> None:
    (east, east_script), (west, west_script) = await scripted(), await scripted()
    gateway = await make_gateway(Settings(port=0, upstreams=table(east, west, fallbacks=["west"]),
                                          trajectory_store_path=tmp_path / "s.sqlite3"))
    east_script.then(Reply(status=429))
    west_script.then(Reply(content="from west"))
    sent = await gateway.http.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": [
        {"role": "user", "content": "hi"}]}, headers={"X-Trajectory-Id": "routed-run"})
    assert sent.status == 200
    store = gateway.observability.store
    assert store is not None
    await store.flushed()
    with sqlite3.connect(tmp_path / "s.sqlite3") as db:
        turns = db.execute("SELECT model, upstream, fallback_from, error_type FROM model_turns ORDER BY started")
        assert turns.fetchall() == [("gpt-4o", "east", None, "upstream_refused"), ("gpt-4o", "west", "east", None)]
        [line] = [line for line in report_text.timeline(report.trajectory(db, "routed-run")) if "from west" in line
                  or "upstream=west" in line]
    assert "upstream=west (fell back from east)" in line
    page = await (await gateway.http.get("/ui/trajectories/routed-run")).text()
    assert "upstream west (fell back from east)" in page
    assert "upstream east" in page


async def test_with_no_default_a_request_passed_on_goes_where_its_model_routes(
        aiohttp_server: Callable[..., Awaitable[TestServer]], make_gateway: GatewayFactory, tmp_path: Path) -> None:
    speaks_messages = ScriptedModel(Script())
    chat_only = ScriptedModel(Script(), apis=("chat", "responses"))
    for model in (speaks_messages, chat_only):
        model.base_url = str((await aiohttp_server(model.app())).make_url("")).rstrip("/")
    upstreams = {"claude": {"url": f"{speaks_messages.base_url}/v1", "kind": "anthropic", "models": ["claude-*"]},
                 "chat": {"url": f"{chat_only.base_url}/v1", "kind": "compatible", "models": ["gpt-*"]}}
    gateway = await make_gateway(Settings(port=0, upstreams=upstreams, trajectory_store_path=tmp_path / "s.sqlite3"))
    counted = {"messages": [{"role": "user", "content": "hi"}]}
    claude = await gateway.http.post("/v1/messages/count_tokens", json={"model": "claude-haiku", **counted})
    assert claude.status == 200  # the upstream that speaks Messages counted them
    assert "input_tokens" in await claude.json()
    gpt = await gateway.http.post("/v1/messages/count_tokens", json={"model": "gpt-4o", **counted})
    assert gpt.status == 404  # the other one was asked, and has no such route
    nameless = await gateway.http.post("/v1/embeddings", json={"input": "no model named"})
    assert (nameless.status, (await nameless.json())["error"]["param"]) == (400, "model")
    unknown = await gateway.http.post("/v1/embeddings", json={"model": "llama3", "input": "x"})
    assert (await unknown.json())["error"]["code"] == "model_not_found"
    nowhere = await gateway.http.get("/v1/files")
    assert nowhere.status == 404
    assert "no default_upstream" in (await nowhere.json())["error"]["message"]


async def test_least_in_flight_passes_over_a_deployment_busy_with_a_call(
        scripted: UpstreamFactory, make_gateway: GatewayFactory, tmp_path: Path) -> None:
    (east, east_script), (west, west_script) = await scripted(), await scripted()
    both = {"east": {"url": f"{east.base_url}/v1", "kind": "compatible", "models": ["gpt-4o"]},
            "west": {"url": f"{west.base_url}/v1", "kind": "compatible", "models": ["gpt-4o"]}}
    gateway = await make_gateway(Settings(port=0, upstreams=both, load_balancing="least_in_flight",
                                          trajectory_store_path=tmp_path / "s.sqlite3"))
    east_script.then(Reply(content="a long answer, stalled", pause_after=1))
    west_script.then(Reply(content="second"), Reply(content="third"))
    hi = [{"role": "user", "content": "hi"}]
    stalled = await gateway.http.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": hi,
                                                                    "stream": True})
    await east.paused.wait()  # east has a call under way
    for expected in ("second", "third"):  # round robin would give the third to east
        answer = await gateway.client.chat.completions.create(model="gpt-4o", messages=hi)  # type: ignore[arg-type]
        assert answer.choices[0].message.content == expected
    assert len(east.requests) == 1
    stalled.close()


async def test_one_upstream_with_aliases_still_resolves_them(
        scripted: UpstreamFactory, make_gateway: GatewayFactory, tmp_path: Path) -> None:
    (only, script), _ = await scripted(), None
    table = {"oa": {"url": f"{only.base_url}/v1", "kind": "compatible", "models": ["gpt-4o"],
                    "aliases": {"fast": "gpt-4o-mini"}}}
    gateway = await make_gateway(Settings(port=0, upstreams=table, default_upstream="oa",
                                          trajectory_store_path=tmp_path / "s.sqlite3"))
    script.then(Reply(content="quick"))
    answer = await gateway.client.chat.completions.create(model="fast", messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content == "quick"
    assert only.requests[-1]["model"] == "gpt-4o-mini"


async def test_a_key_limited_to_models_names_one_on_every_route(
        scripted: UpstreamFactory, make_gateway: GatewayFactory, tmp_path: Path) -> None:
    (east, _), (west, _) = await scripted(), await scripted()
    keys = {"small": {"key": "sk-small-only", "models": ["gpt-4o-mini"]}}
    gateway = await make_gateway(Settings(port=0, upstreams=table(east, west), default_upstream="east", keys=keys,
                                          trajectory_store_path=tmp_path / "s.sqlite3"))
    auth = {"Authorization": "Bearer sk-small-only"}
    form = aiohttp.FormData()  # a model that no JSON body says
    form.add_field("model", "gpt-4o")
    form.add_field("file", b"RIFF", filename="a.wav")
    upload = await gateway.http.post("/v1/audio/transcriptions", data=form, headers=auth)
    assert (upload.status, (await upload.json())["error"]["code"]) == (403, "not_allowed")
    azure = await gateway.http.post("/openai/deployments/gpt-4o/embeddings", json={"input": "x"}, headers=auth)
    assert (azure.status, (await azure.json())["error"]["code"]) == (404, "model_not_found")
    long_name = "m" * 5000  # routed, not kept: a caller's names cannot fill the gateway's memory
    refused = await gateway.http.post("/v1/embeddings", json={"model": long_name, "input": "x"}, headers=auth)
    assert refused.status == 404
    assert all(len(name) <= 256 for name in gateway.http.app[UPSTREAMS].kept_models)
