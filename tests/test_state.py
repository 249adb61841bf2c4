"""MemoryState: mixed turns held for the client's follow-up (bounded, expiring, bound to their gateway
key) and put back into Chat messages and Responses input, on a fake clock."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.apis.chat.history import held_tokens, restore_messages
from gateway.apis.responses.history import held_names, restore_items
from gateway.state import HeldTurn, MemoryState, client_call_id, split_call_id
from gateway.state.redis_values import turn_json, turn_of
from tests.conftest import Clock

TTL = 10.0
USER = {"role": "user", "content": "read notes.txt and ask me which file next"}
T = TypeVar("T")


def done(coroutine: Coroutine[Any, Any, T]) -> T:
    """The result of a memory store's coroutine, which never waits."""
    try:
        coroutine.send(None)
    except StopIteration as finished:
        return finished.value  # type: ignore[no-any-return]
    raise AssertionError("the memory store waited")



class PendingTurns:
    """MemoryState with the Chat restore, as the engine uses them for one caller."""

    def __init__(self, capacity: int, ttl: float, clock: Clock, principal: str | None = None) -> None:
        self.held = MemoryState(capacity, ttl, clock)
        self.principal = principal

    def __len__(self) -> int:
        return len(self.held)

    def hold(self, assistant: dict[str, Any], results: list[dict[str, Any]]) -> str:
        return done(self.held.hold(HeldTurn("chat", (assistant,), tuple(results)), self.principal))

    def restore(self, messages: list[Any], principal: str | None = None) -> list[Any]:
        found = done(self.held.lookup(principal, held_tokens(messages)))
        return restore_messages(messages, lambda token: found.take(token, "chat"))


@pytest.fixture
def clock() -> Clock:
    return Clock()


def call(call_id: str, name: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


def mixed_turn(n: int = 0) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The model's assistant message (one gateway call, one client call) and the gateway's result."""
    assistant = {"role": "assistant", "content": f"turn {n}",
                 "tool_calls": [call(f"call_gw{n}", "read_file"), call(f"call_client{n}", "ask_human")]}
    return assistant, [{"role": "tool", "tool_call_id": f"call_gw{n}", "content": f"contents {n}"}]


def hold(pending: PendingTurns, n: int = 0) -> list[dict[str, Any]]:
    """Holds turn `n`; returns the conversation as the client sends it back: its own call under
    the rewritten id, and its answer to that call."""
    assistant, results = mixed_turn(n)
    token = pending.hold(assistant, results)
    client_id = client_call_id(token, f"call_client{n}")
    shown = {"role": "assistant", "content": None, "tool_calls": [call(client_id, "ask_human")]}
    return [USER, shown, {"role": "tool", "tool_call_id": client_id, "content": f"answer {n}"}]


def restored(n: int = 0) -> list[dict[str, Any]]:
    assistant, results = mixed_turn(n)
    return [USER, assistant, *results, {"role": "tool", "tool_call_id": f"call_client{n}", "content": f"answer {n}"}]


def assert_not_held(pending: PendingTurns, conversation: list[dict[str, Any]], principal: str | None = None) -> None:
    """A turn no longer held: the conversation goes on as the client sent it, its calls and
    results under their original ids (the gateway's rounds are gone)."""
    user, shown, answer = conversation
    [client_call] = shown["tool_calls"]
    [_, original] = split_call_id(client_call["id"]) or ("", "")
    assert pending.restore(conversation, principal) == [
        user, {**shown, "tool_calls": [{**client_call, "id": original}]}, {**answer, "tool_call_id": original}]


def test_hold_and_restore(clock: Clock) -> None:
    pending = PendingTurns(10, TTL, clock)
    conversation = hold(pending)
    assert len(pending) == 1
    client_ids = [c["id"] for c in conversation[1]["tool_calls"]]
    assert all(i.startswith("tspan_") and i.endswith("_call_client0") for i in client_ids)
    assert pending.restore(conversation) == restored()
    assert len(pending) == 1  # still held: the client may resend the same conversation
    assert pending.restore(conversation) == restored()


def test_several_held_turns_in_one_conversation(clock: Clock) -> None:
    pending = PendingTurns(10, TTL, clock)
    first, second = hold(pending, 1), hold(pending, 2)
    assert pending.restore(first + second[1:]) == restored(1) + restored(2)[1:]


def test_capacity_evicts_the_oldest(clock: Clock) -> None:
    pending = PendingTurns(2, TTL, clock)
    conversations = [hold(pending, n) for n in range(3)]
    assert len(pending) == 2
    assert_not_held(pending, conversations[0])
    assert pending.restore(conversations[1]) == restored(1)
    assert pending.restore(conversations[2]) == restored(2)


def test_a_restored_turn_counts_as_recent(clock: Clock) -> None:
    pending = PendingTurns(2, TTL, clock)
    first, second = hold(pending, 1), hold(pending, 2)
    pending.restore(first)  # now the most recently used
    hold(pending, 3)
    assert pending.restore(first) == restored(1)
    assert_not_held(pending, second)


@pytest.mark.parametrize(("elapsed", "held"), [(TTL - 0.001, True), (TTL, False), (TTL * 5, False)],
                         ids=["just-before", "at-expiry", "long-after"])
def test_ttl_expiry(clock: Clock, elapsed: float, held: bool) -> None:
    pending = PendingTurns(10, TTL, clock)
    conversation = hold(pending)
    clock.now += elapsed
    if held:
        assert pending.restore(conversation) == restored()
    else:
        assert_not_held(pending, conversation)
        assert len(pending) == 0  # the stale turn is gone, not just refused


def test_use_slides_the_expiry(clock: Clock) -> None:
    pending = PendingTurns(10, TTL, clock)
    conversation = hold(pending)
    for _ in range(5):  # 5 x 0.8 TTL: well past one TTL after holding, but never idle for one
        clock.now += TTL * 0.8
        assert pending.restore(conversation) == restored()
    clock.now += TTL
    assert_not_held(pending, conversation)


def test_a_touch_slides_the_expiry_without_reading(clock: Clock) -> None:
    held = MemoryState(10, TTL, clock)
    token = done(held.hold(HeldTurn("chat", ()), None))
    for _ in range(3):  # never idle for one TTL: held past it
        clock.now += TTL * 0.8
        done(held.turns.touch(None, [token]))
    assert list(done(held.lookup(None, [token])).turns) == [token]
    clock.now += TTL
    assert done(held.lookup(None, [token])).turns == {}


def test_holding_drops_expired_turns(clock: Clock) -> None:
    pending = PendingTurns(10, TTL, clock)
    hold(pending, 1)
    hold(pending, 2)
    clock.now += TTL
    hold(pending, 3)
    assert len(pending) == 1


@pytest.mark.parametrize("messages", [
    [USER],
    [USER, {"role": "assistant", "content": None, "tool_calls": [call("call_1", "ask_human")]},
     {"role": "tool", "tool_call_id": "call_1", "content": "yes"}],
    [USER, {"role": "assistant", "content": "no calls"}, {"role": "assistant", "tool_calls": None}],
    # ids that start like ours but are not ours: no token, or nothing after it
    [{"role": "assistant", "tool_calls": [call("tspan_", "x"), call("tspan__orig", "x"), call("tspan_abc", "x")]},
     {"role": "tool", "tool_call_id": "tspan_abc", "content": "?"},
     {"role": "tool", "tool_call_id": "tspan__orig", "content": "?"}],
    # a rewritten-looking id on a message that is not an assistant turn or a tool result
    [{"role": "user", "content": "hi", "tool_calls": [call("tspan_abc_call_1", "x")]}],
    ["not a dict", 42, None, {"role": "tool", "tool_call_id": 7, "content": "odd"}],
], ids=["user-only", "client-only-calls", "no-calls", "lookalike-ids", "user-with-calls", "odd-items"])
def test_messages_without_rewritten_ids_pass_through(clock: Clock, messages: list[Any]) -> None:
    pending = PendingTurns(10, TTL, clock)
    hold(pending)  # something is held, and none of these messages names it
    out = pending.restore(messages)
    assert out == messages
    assert all(a is b for a, b in zip(out, messages, strict=True))  # not even copied


def test_a_turn_is_restored_only_for_the_key_that_made_it(clock: Clock) -> None:
    pending = PendingTurns(10, TTL, clock, principal="alice")
    conversation = hold(pending)
    assert pending.restore(conversation, principal="alice") == restored()
    for other in ("bob", None):  # another key's turn is, to this one, a turn not held
        assert_not_held(pending, conversation, principal=other)


def test_response_ids_resolve_for_their_key_until_they_expire(clock: Clock) -> None:
    held = MemoryState(10, TTL, clock)
    done(held.aliases.put("alice", {"resp_first": "resp_last"}))

    def resolve(response_id: str, principal: str) -> str:
        return done(held.lookup(principal, (), (), response_id)).resolve(response_id)

    assert resolve("resp_first", "alice") == "resp_last"
    assert resolve("resp_first", "bob") == "resp_first"  # another key's: passed on as sent
    assert resolve("resp_other", "alice") == "resp_other"
    clock.now += TTL
    assert resolve("resp_first", "alice") == "resp_first"


# --- Responses input ------------------------------------------------------------------------------

def fc(call_id: str, name: str) -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": name, "arguments": "{}"}


def fco(call_id: str, output: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


REASONING = {"type": "reasoning", "id": "rs_1", "summary": []}


def held_responses_turn(held: MemoryState) -> str:
    """A Responses turn [reasoning, gateway call, client call] held in full, with the gateway's result."""
    turn = (REASONING, fc("call_gw", "read_file"), fc("call_c", "ask_human"))
    return done(held.hold(HeldTurn("responses", turn, (fco("call_gw", "contents"),), ("rs_1", "fc_call_c")), None))


def restore(held: MemoryState, items: list[Any]) -> list[Any]:
    found = done(held.lookup(None, *held_names(items)))
    return restore_items(items, lambda t: found.take(t, "responses"), found.owner)


def test_replayed_responses_input_gets_the_whole_turn_back_in_order(clock: Clock) -> None:
    held = MemoryState(10, TTL, clock)
    token = held_responses_turn(held)
    shown = client_call_id(token, "call_c")
    sent = [USER, REASONING, {**fc("call_c", "ask_human"), "call_id": shown}, fco(shown, "yes")]
    restored_input = restore(held, sent)
    assert restored_input == [USER, REASONING, fc("call_gw", "read_file"), fc("call_c", "ask_human"),
                              fco("call_gw", "contents"), fco("call_c", "yes")]


def test_replayed_input_gets_earlier_gateway_rounds_back(clock: Clock) -> None:
    """Round 1 ran a gateway tool after saying something; round 2 called the client's tool. The
    client saw the message and its call; the gateway's round goes back between them."""
    held = MemoryState(10, TTL, clock)
    message = {"type": "message", "id": "msg_1", "role": "assistant",
               "content": [{"type": "output_text", "text": "hm"}]}
    rounds = (message, fc("call_gw", "read_file"), fco("call_gw", "contents"), fc("call_c", "ask_human"))
    token = done(held.hold(HeldTurn("responses", rounds, (), ("msg_1",)), None))
    shown = client_call_id(token, "call_c")
    sent = [USER, message, {**fc("call_c", "ask_human"), "call_id": shown}, fco(shown, "yes")]
    assert restore(held, sent) == [USER, *rounds, fco("call_c", "yes")]


def test_responses_input_continuing_a_stored_response_gets_only_the_results(clock: Clock) -> None:
    held = MemoryState(10, TTL, clock)
    token = held_responses_turn(held)
    sent = [fco(client_call_id(token, "call_c"), "yes")]
    assert restore(held, sent) == [fco("call_gw", "contents"),
                                                                          fco("call_c", "yes")]


def test_responses_input_naming_a_turn_no_longer_held_goes_on_as_sent(clock: Clock) -> None:
    held = MemoryState(10, TTL, clock)
    token = held_responses_turn(held)
    clock.now += TTL
    assert restore(held, [fco(client_call_id(token, "call_c"), "yes")]) == [fco("call_c", "yes")]


def test_one_key_past_its_share_loses_its_own_turns_never_anothers(clock: Clock) -> None:
    held = MemoryState(4, TTL, clock, per_key=2)
    bobs = done(held.hold(HeldTurn("chat", ()), "bob"))
    alices = [done(held.hold(HeldTurn("chat", ()), "alice")) for _ in range(3)]
    assert sorted(done(held.lookup("alice", alices)).turns) == sorted(alices[1:])
    assert list(done(held.lookup("bob", [bobs])).turns) == [bobs]
    carols = [done(held.hold(HeldTurn("chat", ()), "carol")) for _ in range(2)]  # past the capacity: the oldest of all
    left = done(held.lookup("alice", alices)).turns.keys()  # one of her two (which: the lookup's order)
    assert len(left) == 1
    assert left <= set(alices[1:])
    assert sorted(done(held.lookup("carol", carols)).turns) == sorted(carols)
    assert list(done(held.lookup("bob", [bobs])).turns) == [bobs]  # refreshed by the lookup before


def test_a_provider_response_is_owned_by_the_key_that_made_it(clock: Clock) -> None:
    held = MemoryState(4, TTL, clock)
    done(held.owners.put("alice", {"resp_1": True}))
    assert done(held.lookup("alice", (), (), "resp_1")).owned
    assert not done(held.lookup("bob", (), (), "resp_1")).owned
    clock.now += 31 * 86400  # past the owners' 30 days unused
    assert not done(held.lookup("alice", (), (), "resp_1")).owned


# --- reading back what Redis holds --------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(codec=None)),  # lone surrogates too: a tool's result may carry them
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)
OBJECTS = st.lists(st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=4), max_size=4).map(tuple)


@given(st.sampled_from(["chat", "responses", "messages"]), OBJECTS, OBJECTS,
       st.lists(st.text(), max_size=4).map(tuple))
def test_every_held_turn_the_redis_store_writes_reads_back_as_it_was(
        api: str, calls: tuple[dict[str, Any], ...], results: tuple[dict[str, Any], ...],
        shown: tuple[str, ...]) -> None:
    """The checks on what Redis holds never take a turn the gateway wrote for garbage."""
    turn = HeldTurn(api, calls, results, shown)
    assert turn_of(turn_json(turn).encode("utf-8")) == turn
