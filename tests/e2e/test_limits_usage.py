"""GET /v1/limits (issue 58): what a gateway key has used of each of its limits, against the bound,
with what is left and when its window frees; a key sees its own only (another key cannot tell it
exists), the operator's key every key's, and the answer fits the OpenAPI document. With the counts
in a real Redis, one replica shows what another counted, and a Redis that is down is a 503 (the
page says so)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

import jsonschema
import openai
import pytest

from gateway.demo.model import Reply
from tests.conftest import TEST_KEY, USER, Stack, StackFactory
from tests.e2e.redis_server import RedisServer
from tests.e2e.test_limits import OTHER_KEY, answers, waiting_registry
from tests.e2e.test_limits_shared import Replicas, replicas, state_url

__all__ = ["replicas", "state_url"]  # test_limits_shared's fixtures: two replicas on one Redis

OPERATOR_KEY = "sk-operator-0001"
KEYS = {"alice": {"key": TEST_KEY, "requests_per_minute": 3}, "bob": {"key": OTHER_KEY},
        "ops": {"key": OPERATOR_KEY, "operator": True}}
# Each provider call of the scripted model: 10 input and 5 output tokens; at 1 and 2 a million, 20 millionths.
LIMITS = {"requests_per_minute": 5, "max_concurrent_requests": 2, "tokens_per_day": 1000, "budget_per_month": 1.0}
PRICES = {"test-*": {"input": 1.0, "output": 2.0}}


async def limits(stack: Stack, key: str | None = TEST_KEY) -> list[dict[str, Any]]:
    response = await stack.http.get("/v1/limits", headers={"Authorization": f"Bearer {key}"} if key else {})
    assert response.status == 200, await response.text()
    body = await response.json()
    assert body["object"] == "list"
    listed: list[dict[str, Any]] = body["data"]
    return listed


def by_limit(entry: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {limit["limit"]: limit for limit in entry["limits"]}


def counts(entry: dict[str, Any]) -> dict[str, tuple[float, float, float]]:
    """Each limit's (used, bound, remaining): what stays the same between two reads."""
    return {name: (limit["used"], limit["bound"], limit["remaining"]) for name, limit in by_limit(entry).items()}


@pytest.fixture
async def keyed(make_stack: StackFactory) -> Stack:
    return await make_stack(keys=KEYS, default_limits=LIMITS, prices=PRICES)


async def test_a_key_sees_each_limit_used_against_its_bound(keyed: Stack) -> None:
    answers(keyed, 3)
    for _ in range(3):
        await keyed.ask(False, messages=USER)
    with pytest.raises(openai.RateLimitError):  # a refused request takes nothing
        await keyed.ask(False, messages=USER)
    [alice] = await limits(keyed)
    assert (alice["object"], alice["key"], alice["max_rounds"]) == ("key_limits", "alice", None)
    assert [limit["limit"] for limit in alice["limits"]] == ["requests_per_minute", "max_concurrent_requests",
                                                             "tokens_per_day", "budget_per_month"]
    shown = by_limit(alice)
    requests = shown["requests_per_minute"]
    assert {k: requests[k] for k in ("window", "unit", "bound", "used", "remaining")} == {
        "window": "minute", "unit": "requests", "bound": 3, "used": 3, "remaining": 0}  # its own bound, not 5
    assert 0 < requests["resets_in_seconds"] <= 60
    assert shown["max_concurrent_requests"] == {
        "limit": "max_concurrent_requests", "window": "at_once", "unit": "requests", "bound": 2, "used": 0,
        "remaining": 2, "resets_in_seconds": None, "resets_at": None}
    tokens = shown["tokens_per_day"]
    assert (tokens["used"], tokens["remaining"], tokens["unit"]) == (45, 955, "tokens")
    assert tokens["resets_at"] % 86400 == 0  # the next midnight, UTC
    assert 0 < tokens["resets_at"] - time.time() <= 86400
    money = shown["budget_per_month"]
    assert (money["unit"], money["bound"], money["used"], money["remaining"]) == ("money", 1, 0.00006, 0.99994)
    next_month = datetime.fromtimestamp(money["resets_at"], UTC)
    assert (next_month.day, next_month.hour, next_month.minute) == (1, 0, 0)
    assert 0 < money["resets_at"] - time.time() <= 31 * 86400


async def test_a_key_cannot_see_another_keys_usage(keyed: Stack) -> None:
    answers(keyed, 2)
    await keyed.ask(False, messages=USER)
    await keyed.ask(False, messages=USER)
    response = await keyed.http.get("/v1/limits", headers={"Authorization": f"Bearer {OTHER_KEY}"})
    text = await response.text()
    assert "alice" not in text
    assert "ops" not in text
    [bob] = (await response.json())["data"]
    assert bob["key"] == "bob"
    assert by_limit(bob)["requests_per_minute"]["used"] == 0  # a bucket of its own
    assert by_limit(bob)["requests_per_minute"]["bound"] == 5  # the default's
    assert by_limit(bob)["tokens_per_day"]["used"] == 0


async def test_the_operators_key_sees_every_keys_usage(keyed: Stack) -> None:
    answers(keyed, 1)
    await keyed.ask(False, messages=USER)
    listed = await limits(keyed, OPERATOR_KEY)
    assert [entry["key"] for entry in listed] == ["alice", "bob", "ops"]
    assert [by_limit(entry)["requests_per_minute"]["used"] for entry in listed] == [1, 0, 0]
    [alice] = await limits(keyed)
    assert counts(listed[0]) == counts(alice)
    assert by_limit(listed[0])["tokens_per_day"]["used"] == 15


async def test_without_a_key_the_usage_is_refused(keyed: Stack) -> None:
    response = await keyed.http.get("/v1/limits")
    assert response.status == 401
    assert (await response.json())["error"]["type"] == "authentication_error"


async def test_requests_under_way_show_while_they_run(make_stack: StackFactory) -> None:
    release, started = asyncio.Event(), asyncio.Event()
    stack = await make_stack(registry=waiting_registry(release, started),
                             default_limits={"max_concurrent_requests": 3, "max_rounds": 4})
    stack.script.then(Reply(tool_calls=[("wait", {"for": "me"})]), Reply(content="done"))
    asking = asyncio.ensure_future(stack.ask(False, messages=USER))
    await started.wait()
    [caller] = await limits(stack, None)  # without keys: the one caller, and no key name
    assert (caller["key"], caller["max_rounds"]) == (None, 4)
    assert by_limit(caller)["max_concurrent_requests"]["used"] == 1
    release.set()
    await asking
    [caller] = await limits(stack, None)
    assert by_limit(caller)["max_concurrent_requests"]["used"] == 0


async def test_without_limits_each_key_has_none(make_stack: StackFactory) -> None:
    stack = await make_stack(keys={"alice": {"key": TEST_KEY}})
    assert await limits(stack) == [{"object": "key_limits", "key": "alice", "max_rounds": None, "limits": []}]


async def test_the_answer_fits_the_openapi_document(keyed: Stack) -> None:
    answers(keyed, 1)
    await keyed.ask(False, messages=USER)
    document = await (await keyed.http.get("/openapi.json")).json()
    operation = document["paths"]["/v1/limits"]["get"]
    assert operation["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/LimitList"}
    answer = await (await keyed.http.get("/v1/limits", headers={"Authorization": f"Bearer {OPERATOR_KEY}"})).json()
    schema = {"$ref": "#/components/schemas/LimitList", "components": document["components"]}
    jsonschema.Draft202012Validator(schema).validate(answer)


async def test_a_replica_shows_what_another_counted(replicas: Replicas) -> None:
    one, other = await replicas(keys=KEYS, default_limits=LIMITS, prices=PRICES)
    answers(one, 2)
    await one.ask(False, messages=USER)
    await one.ask(False, messages=USER)
    [seen_here], [seen_there] = await limits(one), await limits(other)
    assert counts(seen_there) == counts(seen_here)
    assert counts(seen_there)["requests_per_minute"] == (2, 3, 1)
    assert counts(seen_there)["tokens_per_day"] == (30, 1000, 970)
    assert counts(seen_there)["budget_per_month"] == (0.00004, 1, 0.99996)


async def test_with_redis_down_the_usage_is_a_503_and_the_page_says_so(replicas: Replicas,
                                                                      redis_up: RedisServer) -> None:
    one, _ = await replicas(keys=KEYS, default_limits=LIMITS, state_timeout_seconds=0.5)
    redis_up.stop()
    try:
        response = await one.http.get("/v1/limits", headers={"Authorization": f"Bearer {TEST_KEY}"})
        body = await response.json()
        page = await (await one.http.get("/ui", headers={"Authorization": f"Bearer {TEST_KEY}"})).text()
    finally:
        redis_up.start()
    assert (response.status, response.headers["retry-after"]) == (503, "2")
    assert body["error"]["code"] == "state_unavailable"
    assert "counts cannot be read now: the shared state is unreachable" in page
