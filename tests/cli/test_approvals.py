"""`toolspan approvals list|approve|deny`, run as a process of its own against a gateway the test
serves, while a request through the openai client waits on a tool that needs approval: the table,
approve, deny with a reason, an Interrupt's output, keys' rights, and failures as one line on stderr
with the gateway's own message. What a model chose is printed with its control characters visible."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
from typing import Any

import pytest

from gateway.demo.model import Reply
from gateway.tools.approvals import arguments_digest
from tests.conftest import (
    AGENT,
    AGENT_AND_BOSS,
    BOSS,
    PAID,
    USER,
    Stack,
    StackFactory,
    approval_registry,
    first_pending,
    free_port,
    pending,
    while_asking,
)

pytestmark = pytest.mark.slow  # toolspan approvals, run as processes


async def waiting_stack(make_stack: StackFactory, **settings: Any) -> Stack:
    """A stack whose client waits as long as a few `toolspan` processes take to start on a busy
    machine (a second or more each), rather than hanging up and ending the approval."""
    stack = await make_stack(registry=approval_registry(), **settings)
    stack.client = stack.client.with_options(timeout=120)
    return stack


async def approvals(*args: str, key: str | None = None) -> tuple[int, str, str]:
    """`toolspan approvals ...` in a process of its own; its exit status, stdout and stderr. `key`:
    the TOOLSPAN_API_KEY it finds in its environment."""
    env = {k: v for k, v in os.environ.items() if k != "TOOLSPAN_API_KEY"}
    if key is not None:
        env["TOOLSPAN_API_KEY"] = key
    process = await asyncio.create_subprocess_exec(sys.executable, "-m", "gateway", "approvals", *args, env=env,
                                                   stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def tool_results(stack: Stack) -> list[str]:
    return [m["content"] for m in stack.upstream_requests[-1]["messages"] if m["role"] == "tool"]


async def test_list_shows_the_waiting_call_and_approve_lets_it_run(make_stack: StackFactory) -> None:
    stack = await waiting_stack(make_stack)
    PAID.clear()
    stack.script.then(Reply(tool_calls=[("pay", {"to": "ACME", "amount": 12.5})]), Reply(content="Paid."))

    async def reviewer() -> None:
        approval = await first_pending(stack)
        (code, out, err), (as_json, listed, _) = await asyncio.gather(approvals("list", "--url", stack.url),
                                                                      approvals("list", "--json", "--url", stack.url))
        assert (code, err) == (0, "")
        header, row = out.splitlines()
        assert header.split() == ["id", "tool", "kind", "expires", "trajectory", "arguments_sha256", "arguments",
                                  "/", "message"]
        assert row.split()[:3] == [approval["id"], "pay", "before_run"]
        assert f" {approval['arguments_sha256']}  " in row
        assert approval["trajectory_id"] in row
        assert row.endswith('{"to": "ACME", "amount": 12.5}')
        assert (as_json, json.loads(listed)) == (0, [approval])
        assert PAID == []
        code, out, err = await approvals("approve", approval["id"], "--url", stack.url)
        assert (code, out, err) == (0, f"approved {approval['id']} (pay)\n", "")

    answer = await while_asking(lambda: stack.ask(False, messages=USER), reviewer)
    assert answer.content == "Paid."
    assert PAID == [{"to": "ACME", "amount": 12.5}]
    assert await approvals("list", "--url", stack.url) == (0, "no approval is pending\n", "")


async def test_deny_tells_the_model_the_reason(make_stack: StackFactory) -> None:
    stack = await waiting_stack(make_stack, keepalive_seconds=0.05)
    PAID.clear()
    stack.script.then(Reply(tool_calls=[("pay", {"to": "ACME", "amount": 900})]), Reply(content="I could not pay."))

    async def reviewer() -> None:
        approval = await first_pending(stack)
        code, out, _ = await approvals("deny", approval["id"], "--reason", "over the limit", "--url", stack.url)
        assert (code, out) == (0, f"denied {approval['id']} (pay): over the limit\n")

    answer = await while_asking(lambda: stack.ask(True, messages=USER), reviewer)
    assert answer.content == "I could not pay."
    assert PAID == []
    assert tool_results(stack) == ["denied by the reviewer: over the limit"]


async def test_an_interrupts_output_is_given_as_json(make_stack: StackFactory) -> None:
    stack = await waiting_stack(make_stack)
    stack.script.then(Reply(tool_calls=[("refund", {"order": "A-17"})]), Reply(content="Refunded A-17."))

    async def reviewer() -> None:
        approval = await first_pending(stack)
        code, out, _ = await approvals("list", "--url", stack.url)
        assert code == 0
        assert "interrupt" in out
        assert "a manager must confirm the refund" in out
        code, _, err = await approvals("approve", approval["id"], "--output", "{not json", "--url", stack.url)
        assert code == 2
        assert "is not JSON" in err
        assert [a["status"] for a in await pending(stack)] == ["pending"]
        code, _, _ = await approvals("approve", approval["id"], "--output", '{"refunded": true}', "--url", stack.url)
        assert code == 0

    answer = await while_asking(lambda: stack.ask(False, messages=USER), reviewer)
    assert answer.content == "Refunded A-17."
    assert tool_results(stack) == ['{"refunded": true}']


async def test_with_keys_only_an_approver_decides_and_failures_say_why(make_stack: StackFactory) -> None:
    """The key from $TOOLSPAN_API_KEY or --key; a key that may not decide, a key that is none, an id
    that is not pending: exit 1 with the gateway's message."""
    stack = await waiting_stack(make_stack, keys=AGENT_AND_BOSS)
    stack.client.api_key = AGENT
    PAID.clear()
    stack.script.then(Reply(tool_calls=[("pay", {"to": "ACME", "amount": 5})]), Reply(content="Paid."))

    async def reviewers() -> None:
        approval = await first_pending(stack, {"Authorization": f"Bearer {AGENT}"})
        own, refused, stranger, missing, operator = await asyncio.gather(  # none of them decides anything
            approvals("list", "--url", stack.url, key=AGENT),
            approvals("approve", approval["id"], "--url", stack.url, key=AGENT),
            approvals("list", "--url", stack.url, "--key", "sk-not-a-key"),
            approvals("deny", "appr_nothing", "--url", stack.url, "--key", BOSS),
            approvals("list", "--url", stack.url, "--key", BOSS, key=AGENT))  # --key wins
        assert own[0] == 0
        assert approval["id"] in own[1]
        assert "key" not in own[1].splitlines()[0].split()  # its own: no column naming whose
        assert refused == (1, "", "toolspan: 403: this gateway key may not decide approvals: it needs `approver` (or "
                                  "`operator`) (not_an_approver)\n")
        assert stranger[0] == 1
        assert stranger[2].startswith("toolspan: 401: ")
        assert missing == (1, "", "toolspan: 404: no approval with id 'appr_nothing' is pending (approval_not_found)\n")
        code, out, _ = operator
        assert code == 0
        assert out.splitlines()[0].split()[4] == "key"
        assert " agent " in out.splitlines()[1]
        code, _, _ = await approvals("approve", approval["id"], "--url", stack.url, "--key", BOSS)
        assert code == 0

    answer = await while_asking(lambda: stack.ask(False, messages=USER), reviewers)
    assert answer.content == "Paid."
    assert PAID == [{"to": "ACME", "amount": 5}]


async def test_a_gateway_that_is_not_there_is_one_line() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code, out, err = await approvals("list", "--url", url)
    assert (code, out) == (1, "")
    assert err.startswith(f"toolspan: cannot reach the gateway at {url}: ")
    assert err.count("\n") == 1


async def test_what_a_model_chose_is_printed_with_its_control_characters_visible(make_stack: StackFactory) -> None:
    stack = await waiting_stack(make_stack)
    hostile = "ACME\x1b]0;pwned\x07\x1b[2J\r\nforged line\u202e"
    stack.script.then(Reply(tool_calls=[("pay", {"to": hostile, "amount": 1})]), Reply(content="Paid."))

    async def reviewer() -> None:
        approval = await first_pending(stack)
        for listing in (("list",), ("list", "--json")):
            code, out, _ = await approvals(*listing, "--url", stack.url)
            assert code == 0
            assert not any(c in out for c in "\x1b\x07\r\u202e"), out
            assert "ACME\\u001b]0;pwned\\u0007\\u001b[2J\\r\\nforged line\\u202e" in out  # the escapes, visible
        code, out, _ = await approvals("list", "--url", stack.url)
        assert len(out.splitlines()) == 2  # the header and one row: no line of the model's making
        code, out, _ = await approvals("deny", approval["id"], "--reason", "no\x1b[2J", "--url", stack.url)
        assert (code, out) == (0, f"denied {approval['id']} (pay): no\\u001b[2J\n")

    await while_asking(lambda: stack.ask(False, messages=USER), reviewer)


async def test_a_decision_naming_other_arguments_is_refused_and_the_call_still_waits(make_stack: StackFactory) -> None:
    """--arguments-sha256: the digest the list showed; another is a 409 (the call stays pending), one
    that is not a digest an error of the command line."""
    stack = await waiting_stack(make_stack)
    PAID.clear()
    stack.script.then(Reply(tool_calls=[("pay", {"to": "ACME", "amount": 3})]), Reply(content="Paid."))
    other = hashlib.sha256(b"other arguments").hexdigest()

    async def reviewer() -> None:
        approval = await first_pending(stack)
        assert approval["arguments_sha256"] == arguments_digest("pay", {"to": "ACME", "amount": 3})
        code, _, err = await approvals("approve", approval["id"], "--arguments-sha256", "ABC", "--url", stack.url)
        assert (code, "is not a SHA-256 in hex" in err) == (2, True)
        code, out, err = await approvals("approve", approval["id"], "--arguments-sha256", other, "--url", stack.url)
        assert (code, out) == (1, "")
        assert err.startswith("toolspan: 409: ")
        assert err.endswith("(arguments_changed)\n")
        assert [a["status"] for a in await pending(stack)] == ["pending"]
        assert PAID == []
        code, out, _ = await approvals("approve", approval["id"], "--arguments-sha256", approval["arguments_sha256"],
                                       "--url", stack.url)
        assert (code, out) == (0, f"approved {approval['id']} (pay)\n")

    answer = await while_asking(lambda: stack.ask(False, messages=USER), reviewer)
    assert answer.content == "Paid."
    assert PAID == [{"to": "ACME", "amount": 3}]
