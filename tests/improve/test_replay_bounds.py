"""What the page's replay view (gateway.ui.replay) costs the event loop: over a few hundred
recorded calls whose parse steps are slow, other requests still get a turn every few milliseconds;
a replay past its time stops and says how far it came; a viewer's answer is kept while no newer
call was recorded, a while, then made again."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest

from gateway.demo.model import Reply
from gateway.improve.replay import PAUSE_SECONDS, RecordedCall, Verdict, replay
from gateway.improve.targets import ToolsTarget
from gateway.tools import Param, Tool, ToolRegistry
from gateway.ui.pages import REPLAYS
from gateway.ui.replay import KEPT_SECONDS, Replays
from tests.conftest import USER, Clock, Stack, StackFactory

TURNS, CALLS_A_TURN = 3, 50
CALLS = TURNS * CALLS_A_TURN
# An array of integers where strings are asked for: each call's check finds 400 problems (some ms
# of parse step, and a repair tried), well within argument_max_chars.
SLOW = {"query": "q", "tags": list(range(400))}


def _search(args: dict[str, Any]) -> str:
    return "found"


def _registry() -> ToolRegistry:
    return ToolRegistry([Tool(name="search", function=_search, validate_schema=True, parameters=[
        Param("query", "string", required=True), Param("tags", "array", item_type="string", required=True)])])


@pytest.fixture
async def slow_calls(make_stack: StackFactory) -> Stack:
    """A gateway (argument repair on) whose store holds CALLS rejected calls of SLOW arguments."""
    stack = await make_stack(registry=_registry(), record_tool_arguments=True, argument_repair="apply",
                             argument_max_chars=4096)
    stack.script.then(*(Reply(tool_calls=[("search", SLOW)] * CALLS_A_TURN) for _ in range(TURNS)),
                      Reply(content="done"))
    await stack.client.chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]
    await stack.store.flushed()
    return stack


async def _view(stack: Stack) -> str:
    async with stack.http.get("/ui/replay") as response:
        assert response.status == 200
        return await response.text()


def _figure(markup: str, name: str) -> int:
    found = re.search(rf'<div data-figure="{name}"><dt>[^<]*</dt><dd>([0-9,]+)</dd>', markup)
    assert found is not None, name
    return int(found.group(1).replace(",", ""))


class _SlowParses:
    """A target whose every parse takes PARSE_SECONDS by `clock` (and no time at all by the wall's)."""

    description = "slow parses"

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock

    def covers(self, call: RecordedCall) -> None:
        return None

    async def parse(self, call: RecordedCall) -> Verdict:
        self.clock[0] += PARSE_SECONDS
        return Verdict(True)


PARSE_SECONDS = 0.002


def _recorded(n: int) -> list[RecordedCall]:
    return [RecordedCall(tool="search", side="gateway", outcome="ok", reason=None, arguments="{}", cut=False,
                         masked=False, trajectory="t", key=None, local_id="t", span_id=f"{i:016x}",
                         trace_id="0" * 32, call_id=None, started=float(i)) for i in range(n)]


async def test_a_replay_gives_the_loop_a_turn_whenever_its_pause_has_passed() -> None:
    """Parses of 2 ms each, by a clock the test moves: the loop gets a turn after every third (past
    PAUSE_SECONDS, 5 ms), whatever the machine's speed. (A probe of the loop's real gaps failed on a
    busy CI machine: one parse there took over 100 ms of wall time.)"""
    clock = [0.0]
    turns = 0
    replaying = True

    async def probe() -> None:
        nonlocal turns
        while replaying:
            await asyncio.sleep(0)
            turns += 1

    probing = asyncio.create_task(probe())
    await asyncio.sleep(0)  # the probe started
    found = await replay(_recorded(90), _SlowParses(clock), clock=lambda: clock[0])
    replaying = False
    await probing
    assert found["still_passing"] == 90
    every = int(PAUSE_SECONDS // PARSE_SECONDS) + 1  # parses between turns
    assert turns >= 90 // every


async def test_the_view_replays_every_call_within_its_time(slow_calls: Stack) -> None:
    markup = await _view(slow_calls)
    assert _figure(markup, "calls") == CALLS  # some may be unchecked: a busy machine's checks run out of time
    assert "in the time allowed" not in markup


async def test_a_replay_past_its_time_says_how_far_it_came(slow_calls: Stack) -> None:
    replays = slow_calls.http.app[REPLAYS]
    replays.seconds = 0.02  # a few calls' parse steps
    markup = await _view(slow_calls)
    said = re.search(r"Replayed ([0-9,]+) of ([0-9,]+) calls in the time allowed", markup)
    assert said is not None
    looked_at, of = (int(group.replace(",", "")) for group in said.groups())
    assert (of, _figure(markup, "calls")) == (CALLS, looked_at)
    assert 1 <= looked_at < CALLS


# --- the answers kept -----------------------------------------------------------------------------

class Counted:
    """A tool whose parser counts the calls it parses."""

    def __init__(self) -> None:
        self.parsed = 0

    def parse(self, args: dict[str, Any]) -> None:
        self.parsed += 1

    def target(self) -> ToolsTarget:
        return ToolsTarget([Tool(name="read", function=_search, parse_args=self.parse)], "read")


def _rows(count: int) -> list[dict[str, Any]]:
    """`count` recorded calls as the store hands them, newest (the highest number) first."""
    return [{"tool": "read", "side": "gateway", "outcome": "ok", "arguments": json.dumps({"path": f"/{n}"}),
             "id": f"alpha~t{n}", "key": "alpha", "span_id": f"span{n}", "trace_id": "0" * 32, "started": float(n)}
            for n in range(count, 0, -1)]


async def test_a_viewers_answer_is_kept_until_a_newer_call_or_a_minute() -> None:
    counted, clock = Counted(), Clock()
    replays = Replays(clock=clock)
    first = await replays.answer("alpha", _rows(3), counted.target())
    assert (first["calls"], counted.parsed) == (3, 3)
    assert await replays.answer("alpha", _rows(3), counted.target()) == first
    assert counted.parsed == 3  # kept: not replayed
    await replays.answer("beta", _rows(3), counted.target())
    assert counted.parsed == 6  # another viewer's answer is its own
    newer = await replays.answer("alpha", _rows(4), counted.target())
    assert (newer["calls"], counted.parsed) == (4, 10)
    clock.now += KEPT_SECONDS - 1
    await replays.answer("alpha", _rows(4), counted.target())
    assert counted.parsed == 10
    clock.now += 1
    await replays.answer("alpha", _rows(4), counted.target())
    assert counted.parsed == 14  # a minute on: made again


async def test_an_answer_against_other_tools_is_not_kept_for_these() -> None:
    counted, replays = Counted(), Replays()
    await replays.answer(None, _rows(2), counted.target())
    other = ToolsTarget([Tool(name="write", function=_search, parse_args=counted.parse)], "read")
    answer = await replays.answer(None, _rows(2), other)
    assert answer["not_replayed"] == {"not_in_target": 2}
