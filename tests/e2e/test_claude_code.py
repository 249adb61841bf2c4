"""Claude Code (npm `@anthropic-ai/claude-code`, pinned in tests/e2e/claude/package.json and installed
there by .ci/run) pointed at the gateway with ANTHROPIC_BASE_URL, against the scripted Messages
upstream, offline: `claude -p` runs to its end, the gateway's tool and Claude Code's own Bash tool
both run (Bash's call checked by the gateway against the schema Claude Code declares, and its result
seen as the client's execute step), and every request of the run is one trajectory, found by Claude
Code's session header, in the store, the report and on the page. Behind a gateway with several
upstreams (issue 55), its requests, and those of a subagent it runs on its small model, go to the
upstream their model routes to, and to no other."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from pytest_aiohttp import AiohttpServer

from gateway.demo.model import Reply
from telemetry import names
from tests.conftest import AUTH, TEST_KEY, GatewayFactory, Stack, StackFactory
from tests.e2e.cli_upstreams import ANTHROPIC, DECOY, OPENAI, routed_gateway

CLAUDE = Path(__file__).parent / "claude" / "node_modules" / ".bin" / "claude"
MODEL = "claude-sonnet-4-5-20250929"  # sent as given; this one asks for no system message in `messages`


def claude_model(body: dict[str, Any]) -> Reply:
    """Adds with the gateway's tool, runs a command with Claude Code's Bash, then answers with both."""
    called = {call["id"]: call["function"]["name"] for m in body["messages"] for call in m.get("tool_calls") or []}
    done = {called[m["tool_call_id"]]: m["content"] for m in body["messages"]
            if m.get("role") == "tool" and m.get("tool_call_id") in called}
    if "add" not in done:
        return Reply(content="First the sum.", tool_calls=[("add", {"a": 2, "b": 3})])
    if "Bash" not in done:
        return Reply(tool_calls=[("Bash", {"command": "echo claude-code-ran", "description": "Print a marker"})])
    return Reply(content=f"The sum is {done['add']}. The command said: {done['Bash'].strip()}")


async def claude(url: str, tmp_path: Path, *args: str) -> tuple[int | None, str, str]:
    """`claude *args` against the gateway at `url`, offline, in folders of its own under `tmp_path`:
    its exit status, its stdout and its stderr."""
    assert CLAUDE.exists(), f"Claude Code is not installed: run npm ci --prefix {CLAUDE.parents[2]}"
    home, temp, work = tmp_path / "home", tmp_path / "tmp", tmp_path / "work"
    for folder in (home, temp, work):
        folder.mkdir()
    env = {name: value for name, value in os.environ.items() if not name.startswith(("ANTHROPIC_", "CLAUDE_"))}
    # No call of Anthropic's own services (feature flags, telemetry, updates), and no retry of a failure.
    env.update(HOME=str(home), TMPDIR=str(temp), ANTHROPIC_BASE_URL=url, ANTHROPIC_API_KEY=TEST_KEY,
               CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", CLAUDE_CODE_MAX_RETRIES="0", NO_COLOR="1")
    process = await asyncio.create_subprocess_exec(
        str(CLAUDE), *args, cwd=work, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    output, errors = await asyncio.wait_for(process.communicate(), timeout=120)
    return process.returncode, output.decode(errors="replace"), errors.decode(errors="replace")


async def run_claude(url: str, tmp_path: Path) -> dict[str, Any]:
    status, output, errors = await claude(url, tmp_path, "-p", "Add 2 and 3, then run a command.",
                                          "--model", MODEL, "--allowedTools", "Bash", "--max-turns", "4",
                                          "--output-format", "json")
    assert status == 0, output + errors
    result: dict[str, Any] = json.loads(output)
    return result


async def test_a_claude_code_run_is_one_trajectory_with_its_own_tool_seen(stack: Stack, tmp_path: Path) -> None:
    for _ in range(3):
        stack.script.then(claude_model)
    result = await run_claude(stack.url, tmp_path)
    assert result["result"] == "The sum is 5. The command said: claude-code-ran"
    assert [p.split("?")[0] for p in stack.model.request_paths] == ["/v1/messages"] * 3
    calls = [s.attributes or {} for s in stack.spans() if s.name == names.SPAN_TOOL_CALL]
    assert [(a.get(names.ATTR_TOOL_SIDE), a.get(names.ATTR_TOOL_NAME), a.get(names.ATTR_OUTCOME)) for a in calls] == [
        (names.SIDE_GATEWAY, "add", "ok"), (names.SIDE_CLIENT, "Bash", "ok")]  # Claude Code's own, checked
    [step] = [a for s in stack.spans() if s.name == names.SPAN_TOOL_EXECUTE
              and (a := s.attributes or {}).get(names.ATTR_TOOL_SIDE) == names.SIDE_CLIENT]
    assert (step[names.ATTR_TOOL_NAME], step[names.ATTR_OUTCOME]) == ("Bash", names.OUTCOME_RETURNED)
    posts = [s for s in stack.spans() if s.parent is None and s.name == "POST /v1/messages"]
    assert len(posts) == 2  # the turn that ran `add` and asked for the command; the one with its output
    assert [(s.attributes or {}).get(names.ATTR_TRAJECTORY_SOURCE) for s in posts] == ["session_header", "call_ids"]
    (trajectory,) = {(s.attributes or {})[names.ATTR_CONVERSATION_ID] for s in posts}
    await stack.store.flushed()
    reader = stack.observability.trajectory_reader()
    assert reader is not None
    listed = reader.list_trajectories(tool=None, outcome=None, since=None, model=None, limit=50, key=None)
    assert [row["id"] for row in listed] == [trajectory]
    sides = {(tool["tool"], tool["side"]): tool["outcomes"] for tool in reader.report(None)["tools"]}
    assert sides == {("add", "gateway"): {"ok": 1}, ("Bash", "client"): {"ok": 1}}
    shown = await (await stack.http.get(f"/ui/trajectories/{trajectory}", headers=AUTH)).text()
    assert '<strong>client tool call</strong> <code>Bash</code>' in shown


async def test_claude_code_runs_on_an_upstream_that_speaks_only_chat_completions(
        make_stack: StackFactory, tmp_path: Path) -> None:
    """Claude Code on a company's own model (issue 56): the upstream is asked in Chat Completions,
    the gateway's tool and Claude Code's Bash both run, Bash's call checked as the client's."""
    stack = await make_stack(upstream_kind="openai")  # Chat Completions and Responses, no Messages
    for _ in range(3):
        stack.script.then(claude_model)
    result = await run_claude(stack.url, tmp_path)
    assert result["result"] == "The sum is 5. The command said: claude-code-ran"
    assert [p.split("?")[0] for p in stack.model.request_paths] == ["/v1/chat/completions"] * 3
    calls = [s.attributes or {} for s in stack.spans() if s.name == names.SPAN_TOOL_CALL]
    assert [(a.get(names.ATTR_TOOL_SIDE), a.get(names.ATTR_TOOL_NAME), a.get(names.ATTR_OUTCOME)) for a in calls] == [
        (names.SIDE_GATEWAY, "add", "ok"), (names.SIDE_CLIENT, "Bash", "ok")]
    pairs = [(s.attributes or {}).get(names.ATTR_TRANSLATION) for s in stack.spans() if s.name.startswith("chat ")]
    assert pairs == ["messages->chat"] * 3
    asked = stack.model.requests
    assert {tool["function"]["name"] for tool in asked[0]["tools"]} >= {"Bash", "add"}  # Claude Code's and ours
    posts = [s for s in stack.spans() if s.parent is None and s.name == "POST /v1/messages"]
    assert len({(s.attributes or {})[names.ATTR_CONVERSATION_ID] for s in posts}) == 1  # one trajectory


HAIKU = "claude-haiku-4-5-20251001"  # Claude Code's small model (the pinned version's default), for subagents
CHECKED = "The subagent checked it."


def delegating_model(body: dict[str, Any]) -> Reply:
    """Adds with the gateway's tool, has Claude Code run a subagent on its small model, then answers
    with the sum and what the subagent said."""
    if body["model"] == HAIKU:
        return Reply(content=CHECKED)
    called = {call["id"]: call["function"]["name"] for m in body["messages"] for call in m.get("tool_calls") or []}
    done = {called[m["tool_call_id"]]: m["content"] for m in body["messages"]
            if m.get("role") == "tool" and m.get("tool_call_id") in called}
    if "add" not in done:
        return Reply(content="First the sum.", tool_calls=[("add", {"a": 2, "b": 3})])
    if "Agent" not in done:
        return Reply(tool_calls=[("Agent", {"description": "Check the sum", "prompt": "Check that 2 + 3 is 5.",
                                            "subagent_type": "general-purpose", "model": "haiku"})])
    return Reply(content=f"The sum is {done['add']}. {CHECKED if CHECKED in done['Agent'] else 'Unchecked.'}")


async def test_a_claude_code_run_and_its_subagent_go_to_the_upstream_their_models_route_to(
        aiohttp_server: AiohttpServer, make_gateway: GatewayFactory, tmp_path: Path) -> None:
    routed = await routed_gateway(aiohttp_server, make_gateway, tmp_path)
    for _ in range(4):
        routed.scripts[ANTHROPIC].then(delegating_model)
    result = await run_claude(routed.gateway.url, tmp_path)
    assert result["result"] == f"The sum is 5. {CHECKED}"
    calls = [s.attributes or {} for s in routed.gateway.spans() if s.name == names.SPAN_TOOL_CALL]
    assert [(a.get(names.ATTR_TOOL_SIDE), a.get(names.ATTR_TOOL_NAME), a.get(names.ATTR_OUTCOME)) for a in calls] == [
        (names.SIDE_GATEWAY, "add", "ok"), (names.SIDE_CLIENT, "Agent", "ok")]
    # The main model and the subagent's small one, both by the claude-* pattern, at the Anthropic upstream only.
    assert routed.models_sent() == {OPENAI: [], ANTHROPIC: [MODEL, MODEL, HAIKU, MODEL], DECOY: []}
    assert routed.chat_upstreams() == [(ANTHROPIC, "anthropic")] * 4
    assert [routed.calls_counted(name) for name in (OPENAI, ANTHROPIC, DECOY)] == [0, 4, 0]
    # Every request of the run answered, Claude Code's probe (HEAD /) too; the subagent's is a request of its own.
    roots = [s for s in routed.gateway.spans() if s.parent is None]
    assert {(s.attributes or {}).get(names.ATTR_HTTP_STATUS) for s in roots} == {200}
    assert [s.name for s in roots if s.name.startswith("POST ")] == ["POST /v1/messages"] * 3
    # No default upstream: a model no entry claims is refused, not sent to the first upstream.
    async with routed.gateway.http.post("/v1/messages", json={"model": "claude3-typo", "max_tokens": 8,
                                                              "messages": [{"role": "user", "content": "hi"}]},
                                        headers={"x-api-key": TEST_KEY}) as response:
        assert response.status == 404
        refused = await response.json()
    assert refused["error"]["type"] == "not_found_error"
    assert refused["error"]["message"].startswith("the model 'claude3-typo' is not served here")
    assert routed.models_sent()[DECOY] == []
