"""The Codex CLI (npm `@openai/codex`, pinned in tests/e2e/codex/package.json and installed there by
.ci/run) pointed at the gateway, against the scripted Responses upstream: `codex exec` runs to its
end, the gateway's tool and Codex's own shell tool both run (Codex's calls checked by the gateway
against the schema Codex declares, and marked as client calls in the report and on the page),
every request of the run is one trajectory (in the store and on the page), and Codex's WebSocket
attempt is refused once, at once, instead of failing seven times over about six seconds before
Codex falls back to HTTP. Behind a gateway with several upstreams (issue 55), its requests go to the
upstream its model routes to (by alias or by pattern), and to no other. Behind a gateway whose only
upstream speaks Chat Completions, or Anthropic's Messages, alone (issue 56), the same run goes
through: its Responses requests translated, streamed, the answers translated back."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import openai
import pytest
from pytest_aiohttp import AiohttpServer

from gateway.demo.model import Reply, ScriptedModel
from gateway.settings.model import Settings
from telemetry import names
from tests.conftest import AUTH, GatewayFactory, Script, Stack
from tests.e2e.cli_upstreams import ANTHROPIC, DECOY, OPENAI, TEAM_DEFAULT, TEAM_MODEL, routed_gateway

CODEX = Path(__file__).parent / "codex" / "node_modules" / ".bin" / "codex"
KEY_VARIABLE = "TOOLSPAN_TEST_KEY"


def codex_model(body: dict[str, Any]) -> Reply:
    """Adds with the gateway's tool, runs a command with Codex's own, then answers with both."""
    called = {call["id"]: call["function"]["name"] for m in body["messages"] for call in m.get("tool_calls") or []}
    done = {called[m["tool_call_id"]]: m["content"] for m in body["messages"]
            if m.get("role") == "tool" and m.get("tool_call_id") in called}
    if "add" not in done:
        return Reply(tool_calls=[("add", {"a": 2, "b": 3})])
    if "exec_command" not in done:
        return Reply(tool_calls=[("exec_command", {"cmd": "echo codex-ran"})])
    return Reply(content=f"The sum is {done['add']}.")


def config(url: str, provider: str, model: str) -> str:
    """Codex's config.toml: a provider entry of our own whose base_url is the gateway at `url` (WebSockets
    on, as the built-in OpenAI provider has them), or the built-in provider given the gateway."""
    if provider == "openai_base_url":
        return f'model = "{model}"\nopenai_base_url = "{url}/v1"\n'
    return (f'model = "{model}"\nmodel_provider = "toolspan"\n\n[model_providers.toolspan]\nname = "toolspan"\n'
            f'base_url = "{url}/v1"\nwire_api = "responses"\nenv_key = "{KEY_VARIABLE}"\n'
            "supports_websockets = true\n")


async def run_codex(url: str, tmp_path: Path, provider: str, model: str = "test-model") -> str:
    assert CODEX.exists(), f"the Codex CLI is not installed: run npm ci --prefix {CODEX.parents[2]}"
    home, codex_home, work = tmp_path / "home", tmp_path / "codex-home", tmp_path / "work"
    for folder in (home, codex_home, work):
        folder.mkdir()
    (codex_home / "config.toml").write_text(config(url, provider, model))
    key = AUTH["Authorization"].removeprefix("Bearer ")
    env = {name: value for name, value in os.environ.items() if not name.startswith(("OPENAI_", "CODEX_"))}
    env.update(HOME=str(home), CODEX_HOME=str(codex_home), OPENAI_API_KEY=key, NO_COLOR="1")
    env[KEY_VARIABLE] = key
    process = await asyncio.create_subprocess_exec(
        str(CODEX), "exec", "--skip-git-repo-check", "-s", "read-only", "Add 2 and 3, then run a command.",
        cwd=work, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    output, _ = await asyncio.wait_for(process.communicate(), timeout=120)
    text = output.decode(errors="replace")
    assert process.returncode == 0, text
    return text


@pytest.mark.parametrize("provider", ["model_providers", "openai_base_url"])
async def test_a_codex_exec_run_is_one_trajectory_and_falls_back_to_http_at_once(stack: Stack, tmp_path: Path,
                                                                                provider: str) -> None:
    for _ in range(3):
        stack.script.then(codex_model)
    output = await run_codex(stack.url, tmp_path, provider)
    assert "The sum is 5." in output
    calls = [s.attributes or {} for s in stack.spans() if s.name == names.SPAN_TOOL_CALL]
    assert [(a.get(names.ATTR_TOOL_SIDE), a.get(names.ATTR_TOOL_NAME), a.get(names.ATTR_OUTCOME)) for a in calls] == [
        (names.SIDE_GATEWAY, "add", "ok"), (names.SIDE_CLIENT, "exec_command", "ok")]  # Codex's own, checked
    [step] = [a for s in stack.spans() if s.name == names.SPAN_TOOL_EXECUTE  # and its result seen
              and (a := s.attributes or {}).get(names.ATTR_TOOL_SIDE) == names.SIDE_CLIENT]
    assert (step[names.ATTR_TOOL_NAME], step[names.ATTR_OUTCOME]) == ("exec_command", names.OUTCOME_RETURNED)
    assert step[names.ATTR_TOOL_CALL_ID] == calls[1][names.ATTR_TOOL_CALL_ID]  # the model's id, as its check had it
    roots = [s for s in stack.spans() if s.parent is None]
    # One WebSocket attempt, refused with a 426; Codex went on over HTTP without trying again.
    sockets = [s for s in roots if s.name == "GET /v1/responses"]
    assert [(s.attributes or {}).get("http.response.status_code") for s in sockets] == [426]
    posts = [s for s in roots if s.name == "POST /v1/responses"]
    assert len(posts) == 2  # the turn that ran `add` and asked for the command; the one with its output
    assert [(s.attributes or {}).get(names.ATTR_TRAJECTORY_SOURCE) for s in posts] == ["session_header", "call_ids"]
    (trajectory,) = {(s.attributes or {})[names.ATTR_CONVERSATION_ID] for s in roots}
    await stack.store.flushed()
    reader = stack.observability.trajectory_reader()
    assert reader is not None
    listed = reader.list_trajectories(tool=None, outcome=None, since=None, model=None, limit=50, key=None)
    assert [row["id"] for row in listed] == [trajectory]
    page = await stack.http.get("/ui/trajectories", headers=AUTH)
    assert trajectory in await page.text()
    sides = {(tool["tool"], tool["side"]): tool["outcomes"] for tool in reader.report(None)["tools"]}
    assert sides == {("add", "gateway"): {"ok": 1}, ("exec_command", "client"): {"ok": 1}}
    shown = await (await stack.http.get(f"/ui/trajectories/{trajectory}", headers=AUTH)).text()
    assert '<strong>client tool call</strong> <code>exec_command</code>' in shown


@pytest.mark.parametrize(("provider", "model", "sent"), [
    ("model_providers", TEAM_DEFAULT, TEAM_MODEL),  # an alias: the provider is sent its own name
    ("openai_base_url", "gpt-5.1-codex-mini", "gpt-5.1-codex-mini"),  # the gpt-* pattern: sent as asked
], ids=["alias", "pattern"])
async def test_a_codex_run_goes_to_the_upstream_its_model_routes_to(
        aiohttp_server: AiohttpServer, make_gateway: GatewayFactory, tmp_path: Path, provider: str, model: str,
        sent: str) -> None:
    routed = await routed_gateway(aiohttp_server, make_gateway, tmp_path)
    for _ in range(3):
        routed.scripts[OPENAI].then(codex_model)
    output = await run_codex(routed.gateway.url, tmp_path, provider, model)
    assert "The sum is 5." in output
    calls = [s.attributes or {} for s in routed.gateway.spans() if s.name == names.SPAN_TOOL_CALL]
    assert [(a.get(names.ATTR_TOOL_SIDE), a.get(names.ATTR_TOOL_NAME), a.get(names.ATTR_OUTCOME)) for a in calls] == [
        (names.SIDE_GATEWAY, "add", "ok"), (names.SIDE_CLIENT, "exec_command", "ok")]
    # Both of Codex's turns and the gateway's own call between them, at the OpenAI upstream only.
    assert routed.models_sent() == {OPENAI: [sent] * 3, ANTHROPIC: [], DECOY: []}
    assert routed.chat_upstreams() == [(OPENAI, "openai")] * 3
    assert [routed.calls_counted(name) for name in (OPENAI, ANTHROPIC, DECOY)] == [3, 0, 0]
    posts = [s for s in routed.gateway.spans() if s.parent is None and s.name == "POST /v1/responses"]
    assert [(s.attributes or {}).get(names.ATTR_HTTP_STATUS) for s in posts] == [200, 200]
    # No default upstream: a model no entry claims is refused, not sent to the first upstream.
    with pytest.raises(openai.NotFoundError) as refused:
        await routed.gateway.client.responses.create(model="gpt4-typo", input="hi")
    assert refused.value.code == "model_not_found"
    assert routed.models_sent() == {OPENAI: [sent] * 3, ANTHROPIC: [], DECOY: []}


@pytest.mark.parametrize(("kind", "api", "path"), [
    ("vllm", "chat", "/v1/chat/completions"),  # a self-hosted server that speaks Chat Completions only
    ("anthropic", "messages", "/v1/messages"),
], ids=["chat", "messages"])
async def test_a_codex_run_on_an_upstream_of_another_api_is_translated(
        aiohttp_server: AiohttpServer, make_gateway: GatewayFactory, tmp_path: Path, kind: str, api: str,
        path: str) -> None:
    script = Script()
    for _ in range(3):
        script.then(codex_model)  # the policy sees a Chat-shaped view of a Messages request too
    model = ScriptedModel(script, apis=(api,))
    server = await aiohttp_server(model.app())
    upstreams = {"local": {"url": str(server.make_url("/v1")), "kind": kind, "apis": [api], "models": ["*"]}}
    gateway = await make_gateway(Settings(port=0, upstreams=upstreams, trajectory_store_path=tmp_path / "store.db"))
    output = await run_codex(gateway.url, tmp_path, "model_providers")
    assert "The sum is 5." in output
    calls = [s.attributes or {} for s in gateway.spans() if s.name == names.SPAN_TOOL_CALL]
    assert [(a.get(names.ATTR_TOOL_SIDE), a.get(names.ATTR_TOOL_NAME), a.get(names.ATTR_OUTCOME)) for a in calls] == [
        (names.SIDE_GATEWAY, "add", "ok"), (names.SIDE_CLIENT, "exec_command", "ok")]
    [step] = [a for s in gateway.spans() if s.name == names.SPAN_TOOL_EXECUTE
              and (a := s.attributes or {}).get(names.ATTR_TOOL_SIDE) == names.SIDE_CLIENT]
    assert step[names.ATTR_TOOL_CALL_ID] == calls[1][names.ATTR_TOOL_CALL_ID]  # Codex's result found its call
    # Both of Codex's turns and the gateway's own call between them, each in the upstream's API, streamed.
    assert model.request_paths == [path] * 3
    assert all(body.get("stream") for body in model.requests)
    declared = [tool.get("name") or tool["function"]["name"] for tool in model.requests[0]["tools"]]
    assert {"add", "exec_command"} <= set(declared)  # the gateway's tool beside Codex's own
    chats = [s.attributes or {} for s in gateway.spans() if s.name.startswith(names.SPAN_CHAT_PREFIX + " ")]
    assert [a.get(names.ATTR_TRANSLATION) for a in chats] == [f"responses->{api}"] * 3
    posts = [s for s in gateway.spans() if s.parent is None and s.name == "POST /v1/responses"]
    assert [(s.attributes or {}).get(names.ATTR_HTTP_STATUS) for s in posts] == [200, 200]
