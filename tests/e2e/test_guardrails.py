"""Guardrails on the gateway's tool calls (issue 59), through the official clients (openai for Chat
Completions and Responses, anthropic for Messages), streamed and not, against the scripted provider
that records what it received: a credential in a result masked before the provider reads it (a
gateway tool's, an MCP server's); an argument denied, the model told why and recovering; a
guardrail that raises or stalls handled by guardrail_failure; a rewrite; an ask that waits for a
reviewer; guardrails of a key, of a tool and of a glob applying to theirs only; names that cannot
be resolved refused at start-up. The guardrails of the tests' own are in tests/e2e/guards.py."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from opentelemetry.sdk.trace import ReadableSpan

from gateway.demo.model import Reply
from gateway.tools import ToolRegistry, tool
from telemetry import names
from tests.cli.test_main_first_hour import TOOLSPAN, child_env, toolspan
from tests.conftest import (
    TEST_KEY,
    USER,
    Stack,
    StackFactory,
    decide,
    first_pending,
    pending,
    tool_call_spans,
    while_asking,
)
from tests.e2e.guards import AWS_KEY, config_text, config_tool, deploy_registry
from tests.mcp.conftest import served_over_http

VAULT_SERVER = Path(__file__).parent / "vault_mcp.py"
OTHER_KEY = "sk-other-key-0001"
MASKED_CONFIG = config_text("prod").replace(AWS_KEY, "[REDACTED]")
PROD_HOST, STAGING_HOST = "api.prod.example.com", "api.staging.example.com"
EVERY_WAY = pytest.mark.parametrize(
    ("api", "stream"), [(api, stream) for api in ("chat", "responses", "messages") for stream in (False, True)],
    ids=lambda value: {False: "plain", True: "stream"}.get(value, value) if isinstance(value, bool) else str(value))


# --- one conversation, whichever API ---------------------------------------------------------------------

async def converse(stack: Stack, api: str, stream: bool) -> tuple[str, str]:
    """One request through the official client of `api`: the answer's text and its trace id."""
    if api == "chat":
        answer = await stack.ask(stream, messages=USER)
        return answer.content or "", answer.headers["x-trace-id"]
    if api == "responses":
        response = await stack.respond(stream, input="hello")
        return response.text, response.headers["x-trace-id"]
    request: dict[str, Any] = {"model": "claude-test", "max_tokens": 256, "messages": USER}
    async with stack.anthropic() as client:
        if stream:
            async with client.messages.stream(**request) as streamed:
                message = await streamed.get_final_message()
                headers = streamed.response.headers
        else:
            raw = await client.messages.with_raw_response.create(**request)
            message, headers = await raw.parse(), raw.headers
    return "".join(block.text for block in message.content if block.type == "text"), headers["x-trace-id"]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))


def results_sent(body: dict[str, Any], api: str) -> list[str]:
    """The text of each tool result a request to the provider carried, in order, in `api`'s shape."""
    if api == "chat":
        found = [m["content"] for m in body["messages"] if m.get("role") == "tool"]
    elif api == "responses":
        items = body["input"] if isinstance(body["input"], list) else []
        found = [item["output"] for item in items if item.get("type") == "function_call_output"]
    else:
        found = [block.get("content", "") for m in body["messages"] if isinstance(m["content"], list)
                 for block in m["content"] if block.get("type") == "tool_result"]
    return [_text(content) for content in found]


def errors_sent(body: dict[str, Any]) -> list[bool]:
    """Messages' is_error of each tool_result a request to the provider carried, in order."""
    return [bool(block.get("is_error")) for m in body["messages"] if isinstance(m["content"], list)
            for block in m["content"] if block.get("type") == "tool_result"]


def span_texts(spans: list[ReadableSpan]) -> str:
    """Everything the spans say: attributes, events' attributes, status descriptions."""
    said = []
    for span in spans:
        said += [str(value) for value in (span.attributes or {}).values()]
        said += [str(value) for event in span.events for value in (event.attributes or {}).values()]
        said.append(span.status.description or "")
    return "\n".join(said)


def outcomes(stack: Stack, trace_id: str) -> list[tuple[str, str]]:
    return [(str((s.attributes or {})[names.ATTR_TOOL_NAME]), str((s.attributes or {})[names.ATTR_OUTCOME]))
            for s in tool_call_spans(stack, trace_id)]


# --- a credential in a result ---------------------------------------------------------------------------

@EVERY_WAY
async def test_a_credential_in_a_gateway_tools_result_is_masked_before_the_provider_sees_it(
        make_stack: StackFactory, api: str, stream: bool) -> None:
    stack = await make_stack(registry=ToolRegistry([config_tool("read_config")]), guardrails=["secrets"],
                             capture_message_content=True)
    stack.script.then(Reply(tool_calls=[("read_config", {"file": "prod"})]), Reply(content="It is in eu-west-1."))
    text, trace_id = await converse(stack, api, stream)
    assert text == "It is in eu-west-1."
    assert results_sent(stack.upstream_requests[1], api) == [MASKED_CONFIG]
    assert AWS_KEY not in json.dumps(stack.upstream_requests)
    assert outcomes(stack, trace_id) == [("read_config", "ok")]
    assert AWS_KEY not in span_texts(stack.spans())  # messages captured: the masked result is what they hold


@EVERY_WAY
async def test_without_the_guardrail_the_same_credential_reaches_the_provider(
        make_stack: StackFactory, api: str, stream: bool) -> None:
    """The control of the test above: what the guardrail takes away is there without it."""
    stack = await make_stack(registry=ToolRegistry([config_tool("read_config")]), capture_message_content=True)
    stack.script.then(Reply(tool_calls=[("read_config", {"file": "prod"})]), Reply(content="It is in eu-west-1."))
    await converse(stack, api, stream)
    assert results_sent(stack.upstream_requests[1], api) == [config_text("prod")]
    assert AWS_KEY in span_texts(stack.spans())  # messages captured: the spans would show it


# --- an argument denied, and the model recovering --------------------------------------------------------

@EVERY_WAY
async def test_a_denied_argument_is_explained_to_the_model_which_recovers(
        make_stack: StackFactory, api: str, stream: bool) -> None:
    ran: list[str] = []
    stack = await make_stack(registry=deploy_registry(ran), guardrails=["tests.e2e.guards:no_prod_hosts"])
    stack.script.then(Reply(tool_calls=[("deploy", {"host": PROD_HOST})]),
                      Reply(tool_calls=[("deploy", {"host": STAGING_HOST})]),
                      Reply(content="Deployed to staging."))
    text, trace_id = await converse(stack, api, stream)
    assert text == "Deployed to staging."
    assert ran == [STAGING_HOST]  # the denied call never ran
    denial = ("Tool 'deploy' was not run: guardrail 'no_prod_hosts' denied the call. api.prod.example.com is a "
              "production host; use its staging host (api.staging.example.com). Change the arguments and call "
              "'deploy' again, or go on without it.")
    assert results_sent(stack.upstream_requests[1], api) == [denial]
    assert results_sent(stack.upstream_requests[2], api) == [denial, f"deployed to {STAGING_HOST}"]
    if api == "messages":
        assert errors_sent(stack.upstream_requests[2]) == [True, False]
    assert outcomes(stack, trace_id) == [("deploy", "rejected"), ("deploy", "ok")]
    [denied, _] = tool_call_spans(stack, trace_id)
    assert (denied.attributes or {})[names.ATTR_REJECTION_REASON] == "guardrail_denied"


# --- an MCP server's result -----------------------------------------------------------------------------

def vault_stdio() -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(VAULT_SERVER)], "guardrails": ["secrets"]}


@pytest.fixture
async def vault_http() -> AsyncIterator[str]:
    """The vault MCP server over streamable HTTP, in a process of its own: its URL."""
    async with served_over_http(VAULT_SERVER) as url:
        yield url


def vault_result(account: str, key: str) -> str:
    return f"account {account}: aws_access_key_id = {key}, region = eu-west-1"


@EVERY_WAY
async def test_an_mcp_servers_result_is_masked_by_the_guardrails_of_its_entry(
        make_stack: StackFactory, api: str, stream: bool) -> None:
    stack = await make_stack(mcp_servers={"vault": vault_stdio()})
    stack.script.then(Reply(tool_calls=[("vault__credentials", {"account": "billing"})]), Reply(content="Found it."))
    text, trace_id = await converse(stack, api, stream)
    assert text == "Found it."
    assert results_sent(stack.upstream_requests[1], api) == [vault_result("billing", "[REDACTED]")]
    assert AWS_KEY not in json.dumps(stack.upstream_requests)
    assert outcomes(stack, trace_id) == [("vault__credentials", "ok")]


async def test_an_mcp_server_over_http_is_masked_too_and_only_its_own_entry_guards(
        make_stack: StackFactory, vault_http: str) -> None:
    """Two entries for the same server: the one with `secrets` masks, the other does not."""
    stack = await make_stack(mcp_servers={"guarded": {"url": vault_http, "guardrails": ["secrets"]},
                                          "open": {"url": vault_http}})
    stack.script.then(Reply(tool_calls=[("guarded__credentials", {"account": "a"}),
                                        ("open__credentials", {"account": "b"})]), Reply(content="Both read."))
    text, _ = await converse(stack, "chat", False)
    assert text == "Both read."
    assert results_sent(stack.upstream_requests[1], "chat") == [vault_result("a", "[REDACTED]"),
                                                               vault_result("b", AWS_KEY)]


# --- a guardrail that fails --------------------------------------------------------------------------------

DENIED_UNCHECKED = ("Tool 'deploy' was not run: guardrail '{}' could not check the call, and a call it cannot "
                    "check is denied. Try again, or go on without it.")


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("guard", ["Raises", "Stalls"])
async def test_a_guardrail_that_fails_denies_the_call_under_the_deny_rule(
        make_stack: StackFactory, guard: str, stream: bool) -> None:
    ran: list[str] = []
    stack = await make_stack(registry=deploy_registry(ran), guardrails=[f"tests.e2e.guards:{guard}"],
                             guardrail_timeout_seconds=0.05, guardrail_failure="deny")
    stack.script.then(Reply(tool_calls=[("deploy", {"host": STAGING_HOST})]), Reply(content="Could not deploy."))
    text, trace_id = await converse(stack, "chat", stream)
    assert text == "Could not deploy."
    assert ran == []  # the body never ran
    assert results_sent(stack.upstream_requests[1], "chat") == [DENIED_UNCHECKED.format(guard.lower())]
    assert outcomes(stack, trace_id) == [("deploy", "rejected")]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("guard", ["Raises", "Stalls"])
async def test_a_guardrail_that_fails_lets_the_call_run_under_the_allow_rule(
        make_stack: StackFactory, guard: str, stream: bool) -> None:
    ran: list[str] = []
    stack = await make_stack(registry=deploy_registry(ran), guardrails=[f"tests.e2e.guards:{guard}"],
                             guardrail_timeout_seconds=0.05, guardrail_failure="allow")
    stack.script.then(Reply(tool_calls=[("deploy", {"host": STAGING_HOST})]), Reply(content="Deployed."))
    text, trace_id = await converse(stack, "chat", stream)
    assert text == "Deployed."
    assert ran == [STAGING_HOST]
    assert results_sent(stack.upstream_requests[1], "chat") == [f"deployed to {STAGING_HOST}"]
    assert outcomes(stack, trace_id) == [("deploy", "ok")]


@pytest.mark.parametrize(("api", "stream"), [("responses", True), ("messages", False)])
@pytest.mark.parametrize(("rule", "told"), [
    ("deny", "The result of tool 'deploy' was withheld: guardrail 'raises_after' could not check it, and a result "
             "it cannot check is withheld."),
    ("allow", f"deployed to {STAGING_HOST}")])
async def test_a_guardrail_failing_on_the_result_withholds_it_or_not_by_the_rule(
        make_stack: StackFactory, rule: str, told: str, api: str, stream: bool) -> None:
    ran: list[str] = []
    stack = await make_stack(registry=deploy_registry(ran), guardrails=["tests.e2e.guards:RaisesAfter"],
                             guardrail_failure=rule)
    stack.script.then(Reply(tool_calls=[("deploy", {"host": STAGING_HOST})]), Reply(content="Done."))
    text, trace_id = await converse(stack, api, stream)
    assert text == "Done."
    assert ran == [STAGING_HOST]  # the body ran: only its result is in question
    assert results_sent(stack.upstream_requests[1], api) == [told]
    assert outcomes(stack, trace_id) == [("deploy", "error" if rule == "deny" else "ok")]
    if api == "messages":
        assert errors_sent(stack.upstream_requests[1]) == [rule == "deny"]


# --- rewrite and ask ----------------------------------------------------------------------------------------

@EVERY_WAY
async def test_a_rewrite_hands_the_tool_the_rewritten_arguments(make_stack: StackFactory, api: str,
                                                                 stream: bool) -> None:
    ran: list[str] = []
    stack = await make_stack(registry=deploy_registry(ran), guardrails=["tests.e2e.guards:StagingInstead"])
    stack.script.then(Reply(tool_calls=[("deploy", {"host": PROD_HOST})]), Reply(content="Deployed."))
    text, _ = await converse(stack, api, stream)
    assert text == "Deployed."
    assert ran == [STAGING_HOST]
    assert results_sent(stack.upstream_requests[1], api) == [f"deployed to {STAGING_HOST}"]


async def test_a_rewrite_into_arguments_the_tool_refuses_is_a_denial(make_stack: StackFactory) -> None:
    ran: list[str] = []
    stack = await make_stack(registry=deploy_registry(ran), guardrails=["tests.e2e.guards:DropsTheHost"])
    stack.script.then(Reply(tool_calls=[("deploy", {"host": STAGING_HOST})]), Reply(content="Gave up."))
    text, trace_id = await converse(stack, "chat", False)
    assert text == "Gave up."
    assert ran == []
    [told] = results_sent(stack.upstream_requests[1], "chat")
    assert told.startswith("Tool 'deploy' was not run: a guardrail rewrote its arguments into ones the tool refuses.")
    assert "host" in told  # the parse step's own words: the argument now missing
    [denied] = tool_call_spans(stack, trace_id)
    assert (denied.attributes or {})[names.ATTR_REJECTION_REASON] == "guardrail_denied"


@EVERY_WAY
async def test_an_ask_waits_for_a_reviewer_then_runs(make_stack: StackFactory, api: str, stream: bool) -> None:
    ran: list[str] = []
    stack = await make_stack(registry=deploy_registry(ran), guardrails=["tests.e2e.guards:AskForProd"],
                             keepalive_seconds=0.05)
    stack.script.then(Reply(tool_calls=[("deploy", {"host": PROD_HOST})]), Reply(content="Deployed to production."))

    async def reviewer() -> None:
        approval = await first_pending(stack)
        assert (approval["tool"], approval["arguments"], approval["status"]) == (
            "deploy", {"host": PROD_HOST}, "pending")
        assert approval["message"] == "Guardrail 'ask_for_prod' asks for a reviewer: a deploy to production needs " \
                                      "a reviewer."
        assert ran == []  # nothing runs before the decision
        assert (await decide(stack, approval["id"], decision="approve"))[0] == 200

    text, trace_id = await while_asking(lambda: converse(stack, api, stream), reviewer)
    assert text == "Deployed to production."
    assert ran == [PROD_HOST]
    assert results_sent(stack.upstream_requests[1], api) == [f"deployed to {PROD_HOST}"]
    [call] = tool_call_spans(stack, trace_id)
    assert ((call.attributes or {})[names.ATTR_OUTCOME], (call.attributes or {})[names.ATTR_TOOL_DECISION]) == (
        "ok", "approve")
    assert await pending(stack) == []


async def test_an_ask_denied_by_the_reviewer_never_runs(make_stack: StackFactory) -> None:
    ran: list[str] = []
    stack = await make_stack(registry=deploy_registry(ran), guardrails=["tests.e2e.guards:AskForProd"])
    stack.script.then(Reply(tool_calls=[("deploy", {"host": PROD_HOST})]), Reply(content="Not deployed."))

    async def reviewer() -> None:
        approval = await first_pending(stack)
        assert (await decide(stack, approval["id"], decision="deny", reason="not on a Friday"))[0] == 200

    text, _ = await while_asking(lambda: converse(stack, "chat", False), reviewer)
    assert text == "Not deployed."
    assert ran == []
    assert results_sent(stack.upstream_requests[1], "chat") == ["denied by the reviewer: not on a Friday"]


async def test_an_ask_in_hand_back_mode_hands_the_call_to_the_client(make_stack: StackFactory) -> None:
    ran: list[str] = []
    stack = await make_stack(registry=deploy_registry(ran), guardrails=["tests.e2e.guards:AskForProd"],
                             interrupt_mode="hand_back")
    stack.script.then(Reply(tool_calls=[("deploy", {"host": PROD_HOST})]))
    answer = await stack.ask(False, messages=USER)
    [call] = answer.tool_calls
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == ("deploy", {"host": PROD_HOST})
    assert answer.finish_reason == "tool_calls"
    assert ran == []  # the client answers in the reviewer's place
    assert await pending(stack) == []


async def test_a_call_that_needs_no_asking_runs_at_once(make_stack: StackFactory) -> None:
    ran: list[str] = []
    stack = await make_stack(registry=deploy_registry(ran), guardrails=["tests.e2e.guards:AskForProd"])
    stack.script.then(Reply(tool_calls=[("deploy", {"host": STAGING_HOST})]), Reply(content="Deployed."))
    assert (await converse(stack, "chat", False))[0] == "Deployed."
    assert ran == [STAGING_HOST]
    assert await pending(stack) == []


# --- where guardrails apply -----------------------------------------------------------------------------------

async def test_a_keys_guardrails_apply_to_that_keys_requests_only(make_stack: StackFactory) -> None:
    stack = await make_stack(registry=ToolRegistry([config_tool("read_config")]),
                             keys={"alice": {"key": TEST_KEY, "guardrails": ["secrets"]}, "bob": {"key": OTHER_KEY}})
    for _ in range(2):
        stack.script.then(Reply(tool_calls=[("read_config", {"file": "prod"})]), Reply(content="Read."))
    await converse(stack, "chat", False)  # alice's
    bob = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=OTHER_KEY, max_retries=0)
    async with bob:
        await bob.chat.completions.create(model="test-model", messages=USER)  # type: ignore[arg-type]
    assert results_sent(stack.upstream_requests[1], "chat") == [MASKED_CONFIG]
    assert results_sent(stack.upstream_requests[3], "chat") == [config_text("prod")]
    stack.script.then(Reply(tool_calls=[("read_config", {"file": "prod"})]), Reply(content="Read."))
    assert (await converse(stack, "messages", True))[0] == "Read."  # alice's key, as Anthropic's client sends it
    assert results_sent(stack.upstream_requests[5], "messages") == [MASKED_CONFIG]


async def test_a_tools_own_guardrails_apply_to_that_tool_only(make_stack: StackFactory) -> None:
    @tool(guardrails=["secrets"])
    def guarded_config(file: str) -> str:
        """Read a config file.

        Args:
            file: its name
        """
        return config_text(file)

    registry = ToolRegistry([guarded_config, config_tool("plain_config")])
    stack = await make_stack(registry=registry)
    stack.script.then(Reply(tool_calls=[("guarded_config", {"file": "prod"}), ("plain_config", {"file": "prod"})]),
                      Reply(content="Read both."))
    assert (await converse(stack, "chat", False))[0] == "Read both."
    assert results_sent(stack.upstream_requests[1], "chat") == [MASKED_CONFIG, config_text("prod")]


async def test_tool_guardrails_apply_to_the_tools_their_glob_matches(make_stack: StackFactory) -> None:
    registry = ToolRegistry([config_tool("vault_read"), config_tool("vault_list"), config_tool("notes_read")])
    stack = await make_stack(registry=registry, tool_guardrails={"vault_*": ["secrets"]})
    calls = [(name, {"file": "prod"}) for name in ("vault_read", "notes_read", "vault_list")]
    stack.script.then(Reply(tool_calls=calls), Reply(content="Read them."))
    assert (await converse(stack, "chat", False))[0] == "Read them."
    assert results_sent(stack.upstream_requests[1], "chat") == [MASKED_CONFIG, config_text("prod"), MASKED_CONFIG]


# --- names that cannot be resolved -----------------------------------------------------------------------------

GUARDS_MODULE = '''
from gateway.guardrails import Guardrail, deny


class NoProdHosts(Guardrail):
    def before_execute(self, call):
        return deny("production") if str(call.arguments.get("host", "")).endswith(".prod") else None
'''


@pytest.mark.parametrize(("variable", "value", "said"), [
    ("TOOLSPAN_GUARDRAILS", '["nope"]', "toolspan: guardrail 'nope': no such built-in (there are secrets, "),
    ("TOOLSPAN_GUARDRAILS", '["nosuch_guards:x"]', "toolspan: guardrail 'nosuch_guards:x': cannot import "
                                                    "'nosuch_guards'"),
    ("TOOLSPAN_GUARDRAILS", '["myguards:missing"]', "toolspan: guardrail 'myguards:missing': module 'myguards' has "
                                                     "no attribute 'missing'"),
    ("TOOLSPAN_GUARDRAILS", '["broken_guards:x"]', "toolspan: guardrail 'broken_guards:x': importing "
                                                    "'broken_guards' failed: KeyError: 'POLICY_URL'"),
    ("TOOLSPAN_TOOL_GUARDRAILS", '{"fs__*": ["nope"]}', "toolspan: guardrail 'nope': no such built-in"),
    ("TOOLSPAN_MCP_SERVERS", '{"fs": {"url": "http://127.0.0.1:9/mcp", "guardrails": ["nope"]}}',
     "toolspan: guardrail 'nope': no such built-in"),
    ("TOOLSPAN_KEYS", '{"alice": {"key": "sk-alice-0001", "guardrails": ["myguards:missing"]}}',
     "toolspan: guardrail 'myguards:missing': module 'myguards' has no attribute 'missing'")],
    ids=["unknown-builtin", "no-module", "no-attribute", "module-raises", "tool-glob", "mcp-server", "key"])
def test_a_guardrail_that_cannot_be_resolved_is_refused_at_start_up(
        tmp_path: Path, variable: str, value: str, said: str) -> None:
    (tmp_path / "myguards.py").write_text(GUARDS_MODULE)
    (tmp_path / "broken_guards.py").write_text('import os\n\nPOLICY_URL = os.environ["POLICY_URL"]\n')
    done = toolspan("serve", "--port", "0", cwd=tmp_path, **{variable: value})
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith(said), done.stderr
    assert "Traceback" not in done.stderr
    assert "listening" not in done.stdout + done.stderr


async def test_a_guardrail_in_the_current_folder_is_imported_as_tools_are(tmp_path: Path) -> None:
    """`toolspan serve` (the console script, whose path does not start with the current folder)
    finds a guardrail module there, as it finds a --tools module, with no --tools given."""
    (tmp_path / "myguards.py").write_text(GUARDS_MODULE)
    process = await asyncio.create_subprocess_exec(
        TOOLSPAN, "serve", "--port", "0", cwd=tmp_path, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, env=child_env(TOOLSPAN_GUARDRAILS='["myguards:NoProdHosts"]'))
    assert process.stdout is not None
    seen: list[str] = []
    try:
        async with asyncio.timeout(30):
            while line := (await process.stdout.readline()).decode():
                seen.append(line)
                if "listening on" in line:
                    break
    finally:
        if process.returncode is None:
            process.terminate()
        await process.wait()
    assert "listening on" in seen[-1], seen


# --- every decision recorded ----------------------------------------------------------------------------

@EVERY_WAY
async def test_every_decision_is_on_the_span_in_the_metrics_the_store_and_the_page(
        make_stack: StackFactory, api: str, stream: bool) -> None:
    ran: list[str] = []
    registry = deploy_registry(ran)
    registry.register(config_tool("read_config"))
    stack = await make_stack(registry=registry, guardrails=["secrets", "tests.e2e.guards:no_prod_hosts"])
    stack.script.then(Reply(tool_calls=[("deploy", {"host": PROD_HOST})]),
                      Reply(tool_calls=[("read_config", {"file": "prod"})]),
                      Reply(content="Read it."))
    _, trace_id = await converse(stack, api, stream)
    denied, masked = tool_call_spans(stack, trace_id)
    for span, guardrail, decision, moment in ((denied, "no_prod_hosts", "deny", "before"),
                                              (masked, "secrets", "mask", "after")):
        found = dict(span.attributes or {})
        assert (found[names.ATTR_GUARDRAIL_NAME], found[names.ATTR_GUARDRAIL_DECISION],
                found[names.ATTR_GUARDRAIL_MOMENT]) == (guardrail, decision, moment)
        assert str(found[names.ATTR_GUARDRAIL_REASON])
        said = [(dict(e.attributes or {})[names.ATTR_GUARDRAIL_NAME], dict(e.attributes or {})[
            names.ATTR_GUARDRAIL_DECISION]) for e in span.events if e.name == names.EVENT_GUARDRAIL]
        assert (guardrail, decision) in said
        assert ("secrets", "allow") in said  # each decision, allow included (secrets allows the arguments)
    assert "AWS access key id" in str((masked.attributes or {})[names.ATTR_GUARDRAIL_REASON])

    assert stack.metric(names.METRIC_GUARDRAIL_DECISIONS, guardrail="no_prod_hosts", tool="deploy",
                        decision="deny") == 1
    assert stack.metric(names.METRIC_GUARDRAIL_DECISIONS, guardrail="secrets", tool="read_config",
                        decision="mask") == 1
    assert stack.metric(names.METRIC_GUARDRAIL_DECISIONS, guardrail="secrets", tool="deploy",
                        decision="allow") == 1

    await stack.store.flushed()
    with sqlite3.connect(stack.store.path) as db:
        rows = db.execute("SELECT tool, guardrail, guardrail_decision, guardrail_moment FROM tool_calls "
                          "ORDER BY started").fetchall()
    assert rows == [("deploy", "no_prod_hosts", "deny", "before"), ("read_config", "secrets", "mask", "after")]

    trajectory = stack.spans(trace_id)[0].attributes or {}
    page = await stack.http.get(f"/ui/trajectories/{trajectory[names.ATTR_CONVERSATION_ID]}")
    shown = await page.text()
    assert page.status == 200
    assert "guardrail no_prod_hosts denied the call" in shown
    assert "guardrail secrets masked the result" in shown
    assert AWS_KEY not in shown
