"""A real Redis holding garbage under the gateway's own keys (issue 32): requests through the
official `openai` client make held turns, response aliases and owners and retry state; their
exact keys are then overwritten (a value that is not JSON, bytes that are not UTF-8, JSON of
another shape, a failure hash with times that are no numbers, a key of another Redis type), and
the request that reads them is answered as if the entry were missing (a 409 where a held turn is
needed, an unclassified call for retry state), never a 500. Each unreadable value is counted by
kind, each broken key logged once, and each request keeps its span and its count."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.trace import SpanKind
from redis.asyncio import Redis

from gateway.demo.model import Reply
from telemetry import names
from tests.conftest import TEST_KEY, Stack, StackFactory, server_span, tool_call_spans
from tests.e2e.redis_server import RedisServer
from tests.e2e.test_shared_state import CHAT_TOOLS, chat_mixed_turn, saw_the_sum

DB = 7  # a database of these tests' own on the session's redis-server, emptied around each test
CHAT, RESPONSES = "/v1/chat/completions", "/v1/responses"
KEYS = {"alice": {"key": TEST_KEY}}  # the stack's client is alice's
USER = [{"role": "user", "content": "read a"}]
TRAJECTORY = {"X-Trajectory-Id": "agent-garbage"}
WRONG_TYPE = None  # stands for a key of another Redis type: a list where the gateway wrote a string or a hash
# Garbage of every sort where a held turn was written.
TURN_GARBAGE = {
    "not-json": b"{not json",
    "not-utf8": b'\xff\xfe{"api": "chat"}',
    "a-list": b"[1, 2, 3]",
    "fields-missing": b'{"api": "chat"}',
    "wrong-types": json.dumps({"api": "chat", "calls": "x", "results": [], "shown": [1]}).encode(),
    "nested-deep": b"[" * 100_000 + b"]" * 100_000,
    "nan": b'{"api": "chat", "calls": [{"n": NaN}], "results": [], "shown": []}',
    "wrong-type": WRONG_TYPE,
}


@pytest.fixture
async def state_url(redis_up: RedisServer) -> AsyncIterator[str]:
    url = f"{redis_up.url.rsplit('/', 1)[0]}/{DB}"
    client = Redis.from_url(url)
    await client.flushdb()
    try:
        yield url
    finally:
        await client.flushdb()
        await client.aclose()


@pytest.fixture
async def raw(state_url: str) -> AsyncIterator[Redis]:
    """A client of the tests' own on the gateway's database, to write the garbage."""
    client = Redis.from_url(state_url)
    try:
        yield client
    finally:
        await client.aclose()


async def key_of(raw: Redis, kind: str) -> str:
    """The one key of this kind the gateway wrote."""
    [key] = [k.decode() async for k in raw.scan_iter(f"toolspan:{kind}:*")]
    return key


async def spoil(raw: Redis, key: str, garbage: bytes | None) -> None:
    if garbage is WRONG_TYPE:
        await raw.delete(key)
        await raw.rpush(key, "garbage")
    else:
        await raw.set(key, garbage, px=60_000)


async def refused(call: Awaitable[Any], status: int, code: str) -> openai.APIStatusError:
    """The OpenAI-shaped error a request got."""
    with pytest.raises(openai.APIStatusError) as caught:
        await call
    error = caught.value
    assert error.status_code == status
    assert isinstance(error.body, dict)
    assert set(error.body) >= {"message", "type", "param", "code"}
    assert error.body["code"] == code
    return error


def accounted(stack: Stack, headers: Any, route: str, status: int, count: int) -> None:
    """The request has its span (with its status), and `count` requests of this route and status
    are counted."""
    span = server_span(stack, headers["x-trace-id"])
    assert (span.attributes or {})[names.ATTR_HTTP_STATUS] == status
    assert stack.metric(names.METRIC_REQUESTS, route=route, status=str(status)) == count


def unreadable(stack: Stack, kind: str) -> float:
    return stack.metric(names.METRIC_STATE_STORE_UNREADABLE, kind=kind)


def held_turns_lost(stack: Stack) -> float:
    return sum(stack.metric(names.METRIC_HELD_TURNS_LOST, route=route) for route in (CHAT, RESPONSES))


def logged(caplog: pytest.LogCaptureFixture, key: str) -> int:
    """Lines of the state store's log naming this key as unreadable."""
    return sum(1 for r in caplog.records if r.name == "toolspan.state" and "unreadable" in r.getMessage()
               and key in r.getMessage())


def store_still_up(stack: Stack) -> None:
    """Garbage is no outage: the store is not reported down for it."""
    assert stack.metric(names.METRIC_STATE_STORE_UP) == 1
    assert stack.metric(names.METRIC_STATE_STORE_FAILURES) == 0


# --- held turns, shown items, response aliases and owners -------------------------------------------

@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("garbage", TURN_GARBAGE.values(), ids=TURN_GARBAGE.keys())
async def test_a_held_turn_that_is_garbage_is_a_turn_not_held(
        make_stack: StackFactory, state_url: str, raw: Redis, caplog: pytest.LogCaptureFixture,
        garbage: bytes | None, stream: bool) -> None:
    stack = await make_stack(state_url=state_url)
    messages = await chat_mixed_turn(stack, stream)
    key = await key_of(raw, "turn")
    await spoil(raw, key, garbage)
    with caplog.at_level(logging.WARNING, logger="toolspan.state"):
        for sent in (1, 2):  # the same broken key, read twice: counted twice, logged once
            stack.script.then(Reply(content="went on"))
            answer = await stack.ask(stream, messages=messages, tools=CHAT_TOOLS)
            assert answer.content == "went on"  # as for a turn no longer held: the client's copy goes on
            accounted(stack, answer.headers, CHAT, 200, sent + 1)
    assert stack.metric(names.METRIC_HELD_TURNS_LOST, route=CHAT) == 2
    assert unreadable(stack, "turn") == 2
    assert logged(caplog, key) == 1
    store_still_up(stack)


ITEM_GARBAGE = {"not-utf8": b"\xff\xfe", "not-a-token": b"{not json", "wrong-type": WRONG_TYPE}


@pytest.mark.parametrize("garbage", ITEM_GARBAGE.values(), ids=ITEM_GARBAGE.keys())
async def test_a_shown_item_whose_entry_is_garbage_is_the_clients_own_as_when_it_expired(
        make_stack: StackFactory, state_url: str, raw: Redis, caplog: pytest.LogCaptureFixture,
        garbage: bytes | None) -> None:
    stack = await make_stack(state_url=state_url)
    stack.script.then(Reply(content="Adding.", tool_calls=[("add", {"a": 2, "b": 3})]), Reply(content="5"))
    first = await stack.respond(False, input="add 2 and 3", store=False)  # "Adding." is shown: an item
    later = [{"role": "user", "content": "add 2 and 3"}, *first.output, {"role": "user", "content": "sure?"}]
    stack.script.then(Reply(content="yes"))
    await stack.respond(False, input=later, store=False)  # found: the gateway's round is put back
    assert "function_call" in [i.get("type") for i in stack.upstream_requests[-1]["input"]]
    key = await key_of(raw, "item")
    await spoil(raw, key, garbage)
    with caplog.at_level(logging.WARNING, logger="toolspan.state"):
        stack.script.then(Reply(content="yes"))
        answer = await stack.respond(False, input=later, store=False)
    assert answer.text == "yes"
    assert "function_call" not in [i.get("type") for i in stack.upstream_requests[-1]["input"]]
    accounted(stack, answer.headers, RESPONSES, 200, 3)
    assert unreadable(stack, "item") == 1
    assert logged(caplog, key) == 1
    store_still_up(stack)


ALIAS_GARBAGE = {"not-utf8": b"resp_\xff", "empty": b"", "control": b"resp_\x00\x1b[2J", "wrong-type": WRONG_TYPE}


@pytest.mark.parametrize("garbage", ALIAS_GARBAGE.values(), ids=ALIAS_GARBAGE.keys())
async def test_a_response_alias_that_is_garbage_is_an_answer_id_no_longer_known(
        make_stack: StackFactory, state_url: str, raw: Redis, caplog: pytest.LogCaptureFixture,
        garbage: bytes | None) -> None:
    stack = await make_stack(state_url=state_url)
    stack.script.then(Reply(tool_calls=[("add", {"a": 2, "b": 3})]), Reply(content="5"))
    first = await stack.respond(False, input="add", store=True)
    assert first.id.startswith("resp_tspan_")  # answered over two provider responses: an alias
    key = await key_of(raw, "resp")
    await spoil(raw, key, garbage)
    with caplog.at_level(logging.WARNING, logger="toolspan.state"):
        stack.script.then(Reply(content="went on"))
        answer = await stack.respond(False, input="sure?", previous_response_id=first.id, store=True)
    assert answer.text == "went on"
    assert "previous_response_id" not in stack.upstream_requests[-1]  # from its own input, as for a forgotten id
    accounted(stack, answer.headers, RESPONSES, 200, 2)
    assert unreadable(stack, "resp") == 1
    assert logged(caplog, key) == 1
    store_still_up(stack)


# A thread's record that is garbage: what the store cannot read is counted; a JSON object of
# another shape is missing to the thread's reader alone.
THREAD_GARBAGE = {"not-utf8": (b"\xff{", 1), "a-list": (b"[1, 2]", 1), "wrong-type": (WRONG_TYPE, 1),
                  "not-json": (b"{not json", 0), "another-shape": (b'{"messages": "x", "fields": {}}', 0)}


@pytest.mark.parametrize(("garbage", "counted"), THREAD_GARBAGE.values(), ids=THREAD_GARBAGE.keys())
async def test_a_thread_that_is_garbage_is_a_thread_not_held(
        make_stack: StackFactory, state_url: str, raw: Redis, caplog: pytest.LogCaptureFixture,
        garbage: bytes | None, counted: int) -> None:
    """Its next turn hears thread_not_found, and Anthropic's SDK sends the conversation whole."""
    stack = await make_stack(state_url=state_url, upstream_kind="anthropic")
    stack.script.then(Reply(content="Hello."), Reply(content="Fine, thanks."))
    async with stack.anthropic() as client:
        thread = client.beta.messages.thread(model="m", max_tokens=64)
        await thread.send({"role": "user", "content": "Hi."})
        key = await key_of(raw, "thread")
        await spoil(raw, key, garbage)
        with caplog.at_level(logging.WARNING, logger="toolspan.state"):
            answer = await thread.send({"role": "user", "content": "How are you?"})
    assert answer.content[0].text == "Fine, thanks."  # type: ignore[union-attr]
    assert [m["content"] for m in stack.upstream_requests[-1]["messages"]][::2] == ["Hi.", "How are you?"]
    assert unreadable(stack, "thread") == counted
    assert logged(caplog, key) == counted
    store_still_up(stack)


OWNER_GARBAGE = {"not-the-mark": b"yes", "not-utf8": b"\xff", "wrong-type": WRONG_TYPE}


@pytest.mark.parametrize("garbage", OWNER_GARBAGE.values(), ids=OWNER_GARBAGE.keys())
async def test_a_response_owner_that_is_garbage_owns_nothing(
        make_stack: StackFactory, state_url: str, raw: Redis, caplog: pytest.LogCaptureFixture,
        garbage: bytes | None) -> None:
    """With gateway keys, a provider response is continued only by the key that made it: an owner's
    entry that is garbage makes it nobody's, a 404 as for a response that does not exist."""
    stack = await make_stack(state_url=state_url, keys=KEYS)
    stack.script.then(Reply(content="a plan"))
    first = await stack.respond(False, input="plan")
    key = await key_of(raw, "own")
    await spoil(raw, key, garbage)
    with caplog.at_level(logging.WARNING, logger="toolspan.state"):
        error = await refused(stack.respond(False, input="go on", previous_response_id=first.id),
                              404, "response_not_found")
    accounted(stack, error.response.headers, RESPONSES, 404, 1)
    assert unreadable(stack, "own") == 1
    assert logged(caplog, key) == 1
    store_still_up(stack)


# --- retry state --------------------------------------------------------------------------------------

def retried(stack: Stack) -> None:
    """The model repeats a call that is rejected (a renamed argument), then answers."""
    stack.script.then(Reply(tool_calls=[("read_file", {"file_path": "a"})]), Reply(content="hm"))


def retry_kind(stack: Stack, trace_id: str) -> Any:
    [call] = tool_call_spans(stack, trace_id)
    attributes = call.attributes or {}
    assert attributes[names.ATTR_OUTCOME] == "rejected"
    assert names.ATTR_RETRY_STATE not in attributes  # garbage is not an outage
    return attributes.get(names.ATTR_RETRY_KIND)


FAILURE_GARBAGE = ["not-utf8", "time-not-a-number", "no-time", "wrong-type"]


@pytest.mark.parametrize("garbage", FAILURE_GARBAGE)
async def test_retry_state_that_is_garbage_leaves_the_call_unclassified(
        make_stack: StackFactory, state_url: str, raw: Redis, caplog: pytest.LogCaptureFixture,
        garbage: str) -> None:
    stack = await make_stack(state_url=state_url)
    retried(stack)
    await stack.ask(False, messages=USER, extra_headers=TRAJECTORY)  # rejected: its failure is recorded
    key = await key_of(raw, "fail")
    record = await raw.hget(key, "read_file")
    assert record is not None
    if garbage == "wrong-type":
        await spoil(raw, key, WRONG_TYPE)
    else:
        await raw.hset(key, "read_file", {"not-utf8": b"\xff\xfe " + record, "no-time": b"nothing",
                                          "time-not-a-number": b"soon " + record.partition(b" ")[2]}[garbage])
    with caplog.at_level(logging.WARNING, logger="toolspan.state"):
        retried(stack)
        answer = await stack.ask(False, messages=USER, extra_headers=TRAJECTORY)
    assert answer.content == "hm"
    assert retry_kind(stack, answer.headers["x-trace-id"]) is None  # unclassified, as with no record
    accounted(stack, answer.headers, CHAT, 200, 2)
    assert stack.metric(names.METRIC_TOOL_CALLS, tool="read_file", outcome="rejected") == 2
    assert unreadable(stack, "fail") == (2 if garbage == "wrong-type" else 1)  # a hash's is met by the write too
    assert logged(caplog, key) == 1
    store_still_up(stack)
    # The call's own failure replaced the garbage: the next repeat is a retry again.
    retried(stack)
    again = await stack.ask(False, messages=USER, extra_headers=TRAJECTORY)
    assert retry_kind(stack, again.headers["x-trace-id"]) == "verbatim"


async def test_failure_records_whose_times_are_no_numbers_go_first_when_a_trajectory_is_full(
        make_stack: StackFactory, state_url: str, raw: Redis, caplog: pytest.LogCaptureFixture) -> None:
    stack = await make_stack(state_url=state_url)
    retried(stack)
    await stack.ask(False, messages=USER, extra_headers=TRAJECTORY)
    key = await key_of(raw, "fail")
    await raw.hset(key, mapping={f"junk_{n}": f"whenever {n}" for n in range(64)})  # 65 records, 64 kept
    with caplog.at_level(logging.WARNING, logger="toolspan.state"):
        retried(stack)
        answer = await stack.ask(False, messages=USER, extra_headers=TRAJECTORY)
    assert answer.content == "hm"
    assert retry_kind(stack, answer.headers["x-trace-id"]) == "verbatim"
    accounted(stack, answer.headers, CHAT, 200, 2)
    fields = await raw.hgetall(key)
    assert len(fields) == 64
    assert b"read_file" in fields  # the gateway's own record stays; a junk one went
    assert unreadable(stack, "fail") == 64  # every record's time was read to find the oldest
    assert logged(caplog, key) == 1
    store_still_up(stack)


# --- the store's own bookkeeping: the loss marker and the recency sets ---------------------------------

async def test_a_loss_marker_of_another_type_leaves_the_state_working(
        make_stack: StackFactory, state_url: str, raw: Redis, caplog: pytest.LogCaptureFixture) -> None:
    stack = await make_stack(state_url=state_url)
    messages = await chat_mixed_turn(stack, False)
    await spoil(raw, "toolspan:epoch", WRONG_TYPE)
    with caplog.at_level(logging.WARNING, logger="toolspan.state"):
        stack.script.then(saw_the_sum)
        answer = await stack.ask(False, messages=messages, tools=CHAT_TOOLS)
        ready = await stack.http.get("/readyz")
    assert answer.content == "5, in Paris."
    assert (ready.status, await ready.json()) == (200, {"status": "ready", "state_store": "up"})
    accounted(stack, answer.headers, CHAT, 200, 2)
    # Every read of the store checks the marker: the request's (its held turn, its trajectory's links)
    # and /readyz's.
    assert unreadable(stack, "epoch") == 3
    assert logged(caplog, "toolspan:epoch") == 1
    assert stack.metric(names.METRIC_STATE_STORE_LOSSES) == 0
    store_still_up(stack)


async def test_a_recency_set_of_another_type_is_replaced(
        make_stack: StackFactory, state_url: str, raw: Redis, caplog: pytest.LogCaptureFixture) -> None:
    stack = await make_stack(state_url=state_url)
    await raw.set("toolspan:lru:turn", "garbage")
    with caplog.at_level(logging.WARNING, logger="toolspan.state"):
        messages = await chat_mixed_turn(stack, False)  # held all the same
    assert await raw.zcard("toolspan:lru:turn") == 1  # replaced by the write, which it now names
    stack.script.then(saw_the_sum)
    assert (await stack.ask(False, messages=messages, tools=CHAT_TOOLS)).content == "5, in Paris."
    await chat_mixed_turn(stack, False)
    assert await raw.zcard("toolspan:lru:turn") == 2
    assert unreadable(stack, "lru") == 1
    assert logged(caplog, "toolspan:lru:turn") == 1
    store_still_up(stack)


@pytest.mark.parametrize("garbage", ["toolspan:lru:turn:-", "toolspan:owners:turn"])
async def test_an_owners_set_or_the_counts_of_another_type_are_replaced(
        make_stack: StackFactory, state_url: str, raw: Redis, caplog: pytest.LogCaptureFixture, garbage: str) -> None:
    """The bookkeeping of fair eviction (gateway.state.redis_fair): an owner's set of its entries,
    or the counts of what each owner holds, found to be another Redis type."""
    stack = await make_stack(state_url=state_url)
    await raw.set(garbage, "garbage")
    with caplog.at_level(logging.WARNING, logger="toolspan.state"):
        messages = await chat_mixed_turn(stack, False)  # held all the same
    assert await raw.type(garbage) == b"zset"  # replaced by the write
    stack.script.then(saw_the_sum)
    assert (await stack.ask(False, messages=messages, tools=CHAT_TOOLS)).content == "5, in Paris."
    assert unreadable(stack, "lru") == 1
    assert logged(caplog, garbage) == 1
    store_still_up(stack)


async def test_a_recency_set_naming_other_keys_never_deletes_them(
        make_stack: StackFactory, state_url: str, raw: Redis, caplog: pytest.LogCaptureFixture) -> None:
    """A trim deletes what a kind's recency set names: a member that names no entry of that kind
    (here, another program's key, and bytes that are no text) leaves the set and nothing else."""
    stack = await make_stack(state_url=state_url, pending_turn_capacity=1)
    await raw.set("victim", "keep me")
    old = time.time() - 60  # the oldest, though not expired
    await raw.zadd("toolspan:lru:turn", {b"victim": old, b"\xff\xfe": old, b"toolspan:item:-:" + b"0" * 40: old})
    with caplog.at_level(logging.WARNING, logger="toolspan.state"):
        messages = await chat_mixed_turn(stack, False)  # one turn past the capacity: the oldest three go
    assert await raw.get("victim") == b"keep me"
    assert await raw.zcard("toolspan:lru:turn") == 1
    stack.script.then(saw_the_sum)
    assert (await stack.ask(False, messages=messages, tools=CHAT_TOOLS)).content == "5, in Paris."
    assert unreadable(stack, "lru") == 3
    assert logged(caplog, "toolspan:lru:turn") == 1
    store_still_up(stack)


# --- any bytes at all ----------------------------------------------------------------------------------

async def made_by(raw: Redis, kind: str, request: Awaitable[Any]) -> tuple[str, Any]:
    """The one key of this kind a request made, and what the request answered."""
    before = {k async for k in raw.scan_iter(f"toolspan:{kind}:*")}
    answer = await request
    [key] = {k async for k in raw.scan_iter(f"toolspan:{kind}:*")} - before
    return key.decode(), answer


async def every_kind(stack: Stack, raw: Redis) -> dict[str, Any]:
    """A held turn, a shown item, a response alias and a failure record, as requests made them;
    what the requests that read each send."""
    turn, chat = await made_by(raw, "turn", chat_mixed_turn(stack, False))
    stack.script.then(Reply(content="Adding.", tool_calls=[("add", {"a": 2, "b": 3})]), Reply(content="5"))
    resp, first = await made_by(raw, "resp", stack.respond(False, input="add", store=True))
    item = await key_of(raw, "item")
    later = [{"role": "user", "content": "add"}, *first.output, {"role": "user", "content": "sure?"}]
    retried(stack)
    fail, _ = await made_by(raw, "fail", stack.ask(False, messages=USER, extra_headers=TRAJECTORY))
    return {"chat": chat, "later": later, "response": first.id, "turn": turn, "item": item, "resp": resp,
            "fail": fail}


async def read_back(stack: Stack, kind: str, made: dict[str, Any]) -> tuple[int, Any]:
    """The request that reads an entry of this kind: its status and headers."""
    stack.script.replies.clear()
    try:
        if kind == "turn":
            stack.script.then(Reply(content="went on"))
            answer: Any = await stack.ask(False, messages=made["chat"], tools=CHAT_TOOLS)
        elif kind == "item":
            stack.script.then(Reply(content="yes"))
            answer = await stack.respond(False, input=made["later"], store=False)
        elif kind == "resp":
            stack.script.then(Reply(content="yes"))
            answer = await stack.respond(False, input="sure?", previous_response_id=made["response"], store=True)
        else:
            retried(stack)
            answer = await stack.ask(False, messages=USER, extra_headers=TRAJECTORY)
    except openai.APIStatusError as error:
        return error.status_code, error.response.headers
    return 200, answer.headers


# A held turn that is garbage is a turn no longer held: the conversation goes on (200). A shown
# item's entry that is garbage is the client's own item, as is one that reads as a token naming no
# held turn. An alias that is text is a provider id, which the provider may not know (its 400), else
# garbage: an answer id no longer known, and the request goes on from its input (200). A failure
# record that is garbage is an unclassified call (200).
STATUSES = {"turn": {200}, "item": {200}, "resp": {200, 400}, "fail": {200}}


@pytest.fixture
def once() -> dict[str, Any]:
    """What the examples of one property test share: fixtures are made once for all of them."""
    return {}


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(sorted(STATUSES)), garbage=st.binary(max_size=64))
async def test_any_bytes_in_any_entry_are_never_a_500(make_stack: StackFactory, state_url: str, raw: Redis,
                                                      once: dict[str, Any], kind: str, garbage: bytes) -> None:
    if not once:  # one gateway and its entries for every example
        stack = await make_stack(state_url=state_url)
        once.update(stack=stack, **await every_kind(stack, raw))
    made = once
    stack = made["stack"]
    if kind == "fail":
        await raw.hset(made["fail"], "read_file", garbage)
    else:
        await raw.set(made[kind], garbage, px=60_000)
    before, seen = unreadable(stack, kind), len(stack.exporter.get_finished_spans())
    lost_before = held_turns_lost(stack)
    status, headers = await read_back(stack, kind, made)
    assert status in STATUSES[kind]
    # Hypothesis seeds `random` alike for every example, and with it the trace ids: this request's
    # spans are the ones that ended since it was sent.
    [span] = [s for s in stack.exporter.get_finished_spans()[seen:] if s.kind is SpanKind.SERVER]
    assert format(span.context.trace_id, "032x") == headers["x-trace-id"]
    assert (span.attributes or {})[names.ATTR_HTTP_STATUS] == status
    if kind in ("turn", "resp"):  # garbage read is a turn or answer id no longer held, and counted so
        assert unreadable(stack, kind) - before == held_turns_lost(stack) - lost_before
    if kind == "turn":
        assert unreadable(stack, kind) == before + 1
    store_still_up(stack)
