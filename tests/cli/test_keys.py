"""`toolspan keys usage`, run as a process of its own against a gateway the test serves: each limit's
usage against its bound as a table (the key's own; every key's for the operator's key), --json as
GET /v1/limits answers it, and failures as one line on stderr with the gateway's own message."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import pytest

from gateway.demo.model import Reply
from tests.conftest import TEST_KEY, USER, Stack, StackFactory, free_port

pytestmark = pytest.mark.slow  # toolspan keys usage, run as processes

OTHER_KEY, OPERATOR_KEY = "sk-other-key-0001", "sk-operator-0001"
KEYS = {"alice": {"key": TEST_KEY, "requests_per_minute": 3}, "bob": {"key": OTHER_KEY},
        "ops": {"key": OPERATOR_KEY, "operator": True, "max_rounds": 4}}
# Each provider call of the scripted model: 10 input and 5 output tokens; at 1 and 2 a million, 20 millionths.
LIMITS = {"requests_per_minute": 5, "tokens_per_day": 1000, "budget_per_month": 1.0, "max_concurrent_requests": 2}


async def keys_usage(*args: str, key: str | None = None) -> tuple[int, str, str]:
    """`toolspan keys usage ...`; its exit status, stdout and stderr. `key`: its TOOLSPAN_API_KEY."""
    env = {k: v for k, v in os.environ.items() if k != "TOOLSPAN_API_KEY"}
    if key is not None:
        env["TOOLSPAN_API_KEY"] = key
    process = await asyncio.create_subprocess_exec(sys.executable, "-m", "gateway", "keys", "usage", *args, env=env,
                                                   stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@pytest.fixture
async def used(make_stack: StackFactory) -> Stack:
    """Alice made two requests."""
    stack = await make_stack(keys=KEYS, default_limits=LIMITS, prices={"test-*": {"input": 1.0, "output": 2.0}})
    stack.script.then(Reply(content="one"), Reply(content="two"))
    await stack.ask(False, messages=USER)
    await stack.ask(False, messages=USER)
    return stack


def cells(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines()]


async def test_the_table_shows_each_limit_against_its_bound(used: Stack) -> None:
    code, out, err = await keys_usage("--url", used.url, key=TEST_KEY)
    assert (code, err) == (0, "")
    header, requests, concurrent, tokens, money = cells(out)
    assert header == ["key", "limit", "used", "bound", "left", "resets"]
    assert requests[:5] == ["alice", "requests_per_minute", "2", "3", "1"]
    assert requests[5] == "in"
    assert 0 < int(requests[6]) <= 60
    assert concurrent == ["alice", "max_concurrent_requests", "0", "2", "2", "-"]
    assert tokens[:5] == ["alice", "tokens_per_day", "30", "1,000", "970"]
    assert tokens[-2:] == ["00:00", "UTC"]  # the next midnight
    assert money[:5] == ["alice", "budget_per_month", "0.00004", "1", "0.99996"]
    assert out.splitlines()[1].index("requests_per_minute") == out.splitlines()[0].index("limit")  # columns


async def test_a_key_sees_its_own_and_the_operator_every_keys(used: Stack) -> None:
    (own_code, own, _), (all_code, every, _) = await asyncio.gather(
        keys_usage("--url", used.url, "--key", OTHER_KEY, key=OPERATOR_KEY),  # --key wins
        keys_usage("--url", used.url, key=OPERATOR_KEY))
    assert (own_code, all_code) == (0, 0)
    assert {row[0] for row in cells(own)[1:]} == {"bob"}
    assert cells(own)[1][:3] == ["bob", "requests_per_minute", "0"]
    assert [row[0] for row in cells(every)[1:]] == ["alice"] * 4 + ["bob"] * 4 + ["ops"] * 5
    assert cells(every)[-1] == ["ops", "max_rounds", "-", "4", "-", "per", "request"]


async def test_json_is_what_the_gateway_answers(used: Stack) -> None:
    code, out, _ = await keys_usage("--url", used.url, "--json", key=OPERATOR_KEY)
    assert code == 0
    printed: list[dict[str, Any]] = json.loads(out)
    answered = await (await used.http.get("/v1/limits", headers={"Authorization": f"Bearer {OPERATOR_KEY}"})).json()

    def still(entries: list[dict[str, Any]]) -> list[Any]:  # all but the seconds that pass between the two
        return [(entry["key"], entry["max_rounds"],
                 [{k: v for k, v in limit.items() if not k.startswith("resets")} for limit in entry["limits"]])
                for entry in entries]

    assert still(printed) == still(answered["data"])
    assert [entry["key"] for entry in printed] == ["alice", "bob", "ops"]


async def test_without_limits_a_key_has_none(make_stack: StackFactory) -> None:
    stack = await make_stack(keys={"alice": {"key": TEST_KEY}})
    code, out, _ = await keys_usage("--url", stack.url, key=TEST_KEY)
    assert (code, out.splitlines()[1]) == (0, "alice  (no limits)")


async def test_failures_are_one_line_with_the_gateways_message(used: Stack) -> None:
    (code, out, err), (gone_code, _, gone) = await asyncio.gather(
        keys_usage("--url", used.url, key="sk-not-a-key-01"),
        keys_usage("--url", f"http://127.0.0.1:{free_port()}", key=TEST_KEY))
    assert (code, out) == (1, "")
    assert err.startswith("toolspan: 401: ")
    assert err.count("\n") == 1
    assert gone_code == 1
    assert gone.startswith("toolspan: cannot reach the gateway at http://127.0.0.1:")
