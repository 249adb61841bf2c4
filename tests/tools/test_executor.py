"""ToolExecutor: one outcome per call in the model's order, concurrency where declared,
blocking bodies off the loop, timeouts, lookup and allowlist refusals, and the context a body sees.

No test here sleeps to wait: every wait is on an Event, and every wait that a broken executor
would never end is bounded by `asyncio.wait_for` so the test fails instead of hanging."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import pytest

from gateway.tools import (
    Tool,
    ToolCall,
    ToolContext,
    ToolExecutor,
    ToolOutcome,
    ToolRegistry,
    ToolsBusy,
    ToolThreads,
    Turn,
)

BOUND = 5.0  # seconds; only ever reached when the behaviour under test is broken


def executor(*tools: Tool, default_timeout: float | None = 30.0) -> ToolExecutor:
    return ToolExecutor(ToolRegistry(tools), default_timeout=default_timeout)


def calls(*names: str) -> list[ToolCall]:
    """One call per name, ids call_0, call_1, ... in the model's order."""
    return [ToolCall(id=f"call_{i}", name=name, arguments="{}") for i, name in enumerate(names)]


async def run(ex: ToolExecutor, turn_calls: list[ToolCall], turn: Turn | None = None,
              allowed: Collection[str] | None = None) -> list[ToolOutcome]:
    return await asyncio.wait_for(ex.run_turn(turn_calls, turn, allowed), timeout=BOUND)


# --- ordering -----------------------------------------------------------------------------------


async def test_outcomes_come_back_in_the_models_order_for_a_mixed_turn() -> None:
    finished: list[str] = []
    released = asyncio.Event()

    async def slow(args: dict[str, Any], context: ToolContext) -> str:
        await released.wait()  # cannot finish before `fast`, which the model called after it
        finished.append(context.tool_call_id)
        return f"slow {context.tool_call_id}"

    async def fast(args: dict[str, Any], context: ToolContext) -> str:
        released.set()
        finished.append(context.tool_call_id)
        return f"fast {context.tool_call_id}"

    def sequential(args: dict[str, Any], context: ToolContext) -> str:
        finished.append(context.tool_call_id)
        return f"sequential {context.tool_call_id}"

    ex = executor(Tool(name="slow", function=slow, concurrent=True),
                  Tool(name="fast", function=fast, concurrent=True),
                  Tool(name="sequential", function=sequential))
    turn_calls = calls("slow", "fast", "sequential", "no_such_tool", "fast", "sequential")

    outcomes = await run(ex, turn_calls)

    assert [(o.call_id, o.tool_name, o.status) for o in outcomes] == [
        ("call_0", "slow", "ok"), ("call_1", "fast", "ok"), ("call_2", "sequential", "ok"),
        ("call_3", "no_such_tool", "rejected"), ("call_4", "fast", "ok"), ("call_5", "sequential", "ok"),
    ]
    assert [o.content for o in outcomes if o.status == "ok"] == [
        "slow call_0", "fast call_1", "sequential call_2", "fast call_4", "sequential call_5"]
    assert finished[:2] == ["call_1", "call_0"]  # completion order differed; the result order did not


async def test_an_empty_turn_returns_no_outcomes() -> None:
    ran: list[object] = []
    ex = executor(Tool(name="noop", function=lambda args: ran.append(args)))

    assert await run(ex, []) == []
    assert ran == []


# --- concurrency ----------------------------------------------------------------------------------


def rendezvous_tool(name: str, own: asyncio.Event, other: asyncio.Event) -> Tool:
    """A concurrent tool that can only finish once its partner has started too."""

    async def body(args: dict[str, Any]) -> str:
        own.set()
        await other.wait()
        return f"{name} met its partner"

    return Tool(name=name, function=body, concurrent=True)


@pytest.mark.parametrize("between", [[], ["no_such_tool"]], ids=["adjacent", "unknown-call-between"])
async def test_concurrent_tools_of_a_turn_run_at_the_same_time(between: list[str]) -> None:
    left, right = asyncio.Event(), asyncio.Event()
    ex = executor(rendezvous_tool("left", left, right), rendezvous_tool("right", right, left))

    # A sequential executor would leave `left` waiting forever for `right` to start.
    outcomes = await run(ex, calls("left", *between, "right"))

    assert [o.content for o in outcomes if o.status == "ok"] == ["left met its partner", "right met its partner"]


@pytest.mark.parametrize("names", [
    ["first", "first", "first"],
    ["first", "second", "first", "second"],
    ["first", "no_such_tool", "second"],
], ids=["one-tool-thrice", "two-tools-alternating", "unknown-call-between"])
async def test_non_concurrent_tools_run_one_at_a_time_in_the_models_order(names: list[str]) -> None:
    running = 0
    most_running = 0
    started: list[str] = []

    async def body(args: dict[str, Any], context: ToolContext) -> str:
        nonlocal running, most_running
        running += 1
        most_running = max(most_running, running)
        started.append(context.tool_call_id)
        for _ in range(3):
            await asyncio.sleep(0)  # hand the loop over: an overlapping call would start here
        running -= 1
        return "done"

    ex = executor(Tool(name="first", function=body), Tool(name="second", function=body))
    turn_calls = calls(*names)

    outcomes = await run(ex, turn_calls)

    assert most_running == 1
    assert started == [c.id for c in turn_calls if c.name != "no_such_tool"]
    assert [o.status for o in outcomes] == ["rejected" if n == "no_such_tool" else "ok" for n in names]


async def test_a_blocking_sync_tool_leaves_the_event_loop_free() -> None:
    loop = asyncio.get_running_loop()
    body_started = asyncio.Event()
    released = threading.Event()
    log: list[str] = []

    def blocking(args: dict[str, Any]) -> str:
        loop.call_soon_threadsafe(body_started.set)
        # On the loop's own thread this wait would freeze the loop until it gives up.
        got_released = released.wait(timeout=BOUND)
        log.append("body released" if got_released else "body gave up")
        return "released" if got_released else "never released"

    async def meanwhile_on_the_loop() -> None:
        await body_started.wait()
        log.append("loop made progress")
        released.set()

    ex = executor(Tool(name="blocking", function=blocking))

    outcomes, _ = await asyncio.wait_for(
        asyncio.gather(ex.run_turn(calls("blocking")), meanwhile_on_the_loop()), timeout=2 * BOUND)

    assert outcomes[0].content == "released"
    assert log == ["loop made progress", "body released"]


# --- timeouts -------------------------------------------------------------------------------------


def never_finishing(sync: bool, release: threading.Event) -> Callable[[dict[str, Any]], Any]:
    if sync:
        def blocked(args: dict[str, Any]) -> str:
            release.wait(timeout=BOUND)  # released by the test once the outcome is in
            return "late"
        return blocked

    async def waiting(args: dict[str, Any]) -> str:
        await asyncio.Event().wait()  # nothing ever sets it
        return "late"
    return waiting


@pytest.mark.parametrize("sync", [False, True], ids=["async-body", "sync-body"])
@pytest.mark.parametrize(("tool_timeout", "default_timeout"), [
    (0.05, 30.0),
    (0.05, None),
    (None, 0.05),
], ids=["tool-timeout", "tool-timeout-no-default", "executor-default"])
async def test_a_call_that_outlives_its_timeout_is_reported_as_timeout(
        sync: bool, tool_timeout: float | None, default_timeout: float | None) -> None:
    release = threading.Event()
    ex = executor(Tool(name="stuck", function=never_finishing(sync, release), timeout=tool_timeout),
                  default_timeout=default_timeout)
    try:
        [outcome] = await run(ex, calls("stuck"))
    finally:
        release.set()  # let an abandoned thread end so the loop can shut down

    assert outcome.status == "timeout"
    assert outcome.error_type == "timeout"
    assert "'stuck'" in outcome.content
    assert "0.05 s" in outcome.content


async def test_a_timeout_error_raised_by_the_body_itself_is_an_error_not_a_timeout() -> None:
    async def body(args: dict[str, Any]) -> str:
        raise TimeoutError("upstream API timed out")

    [outcome] = await run(executor(Tool(name="fetch", function=body, timeout=BOUND)), calls("fetch"))

    assert outcome.status == "error"
    assert outcome.content == "ERROR: (TimeoutError) upstream API timed out"


# --- the pool of threads for sync bodies ------------------------------------------------------------


async def test_a_full_tool_pool_is_a_busy_outcome_at_once_and_the_default_executor_stays_free() -> None:
    loop = asyncio.get_running_loop()
    # A default executor as small as the tool pool: two stuck bodies on it would starve it.
    loop.set_default_executor(ThreadPoolExecutor(max_workers=2))
    release = threading.Event()

    async def on_the_loop(args: dict[str, Any]) -> str:
        return "async"

    ex = ToolExecutor(ToolRegistry([Tool(name="stuck", function=never_finishing(True, release), timeout=0.05),
                                    Tool(name="quick", function=lambda args: "quick"),
                                    Tool(name="async", function=on_the_loop)]), threads=2)
    try:
        stuck = await run(ex, calls("stuck", "stuck"))
        busy_threads = ex.threads.busy
        busy, unaffected = await run(ex, calls("quick", "async"))
        elsewhere = await asyncio.wait_for(loop.run_in_executor(None, lambda: "free"), BOUND)
    finally:
        release.set()
        await ex.aclose()

    assert [o.status for o in stuck] == ["timeout", "timeout"]
    assert busy_threads == 2  # both still taken by the bodies that outlived their timeout
    assert (busy.status, busy.error_type) == ("error", "tool_busy")
    assert busy.content == ("Tool 'quick' is busy and did not run: all 2 threads for tools are held by "
                            "earlier calls that did not finish. Try again later.")
    assert unaffected.content == "async"  # async bodies need no thread
    assert elsewhere == "free"


async def test_a_call_waits_for_a_thread_that_a_running_body_holds() -> None:
    """Busy with bodies still within their time, the pool queues: a healthy burst is not refused."""
    threads = ToolThreads(1)
    started, release = threading.Event(), threading.Event()

    def first_body() -> str:
        started.set()
        release.wait(BOUND)
        return "first"

    try:
        first = asyncio.ensure_future(threads.run(first_body))
        assert await asyncio.to_thread(started.wait, BOUND)
        second = asyncio.ensure_future(threads.run(lambda: "second"))
        await asyncio.sleep(0)  # one turn of the loop: `second` is queued, not refused
        assert threads.busy == 1
        assert not second.done()
        release.set()
        assert (await first, await second) == ("first", "second")
    finally:
        release.set()
        threads.close()


async def test_a_pool_held_by_abandoned_bodies_refuses_at_once() -> None:
    threads = ToolThreads(1)
    started, release = threading.Event(), threading.Event()

    def stuck() -> None:
        started.set()
        release.wait(BOUND)

    try:
        waiting = asyncio.ensure_future(threads.run(stuck))
        assert await asyncio.to_thread(started.wait, BOUND)
        waiting.cancel()  # the call gives up (its time ran out); the body runs on
        with pytest.raises(asyncio.CancelledError):
            await waiting
        with pytest.raises(ToolsBusy):
            await threads.run(lambda: "refused")
    finally:
        release.set()
        threads.close()


def test_a_body_that_never_returns_does_not_keep_the_process_alive(tmp_path: Path) -> None:
    """The pool's threads are daemons: a process whose tool body hangs for ever still exits."""
    script = tmp_path / "hang.py"
    script.write_text(textwrap.dedent("""
        import asyncio, threading
        from gateway.tools import ToolThreads

        async def main():
            threads = ToolThreads(1)
            try:
                await asyncio.wait_for(threads.run(threading.Event().wait), 0.05)
            except TimeoutError:
                print("gave up")
            threads.close()

        asyncio.run(main())
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).parents[2])
    assert (done.returncode, done.stdout.strip()) == (0, "gave up"), done.stderr


async def test_a_sync_body_runs_in_the_context_of_its_call() -> None:
    """As with asyncio.to_thread: context variables (the current span, say) reach the thread."""
    current: ContextVar[str] = ContextVar("current", default="unset")
    seen: list[str] = []

    def body(args: dict[str, Any]) -> str:
        seen.append(current.get())
        return threading.current_thread().name

    current.set("the call's")
    async with ToolExecutor(ToolRegistry([Tool(name="body", function=body)]), threads=1) as ex:
        [outcome] = await run(ex, calls("body"))
    assert seen == ["the call's"]
    assert str(outcome.content).startswith("toolspan-tool")


# --- lookup and allowlist -------------------------------------------------------------------------


def recording_tools(ran: list[str], *names: str) -> list[Tool]:
    """Tools that note their name in `ran` when their body runs."""

    def recorder(name: str) -> Callable[[dict[str, Any]], str]:
        def body(args: dict[str, Any]) -> str:
            ran.append(name)
            return "ran"
        return body

    return [Tool(name=name, function=recorder(name)) for name in names]


@pytest.mark.parametrize(("sent", "hint"), [
    ("read_fille", "read_file"),
    ("Write_File", "write_file"),
    ("launch_rockets", None),
])
async def test_an_unknown_tool_is_rejected_with_the_available_tools(sent: str, hint: str | None) -> None:
    ran: list[str] = []
    ex = executor(*recording_tools(ran, "read_file", "write_file"))

    [outcome] = await run(ex, calls(sent))

    assert outcome.status == "rejected"
    assert outcome.rejection is not None
    assert outcome.rejection.reason == "unknown_tool"
    assert f"There is no tool named '{sent}'." in outcome.content
    assert "Available tools: read_file, write_file." in outcome.content
    assert ("Did you mean" in outcome.content) == (hint is not None)
    if hint is not None:
        assert f"Did you mean '{hint}'?" in outcome.content
    assert ran == []


@pytest.mark.parametrize("concurrent", [False, True], ids=["sequential", "concurrent"])
async def test_a_tool_outside_the_allowlist_is_rejected_and_never_runs(concurrent: bool) -> None:
    ran: list[str] = []
    secret, public = recording_tools(ran, "delete_everything", "read_file")
    ex = executor(Tool(name=secret.name, function=secret.function, concurrent=concurrent), public)

    outcomes = await run(ex, calls("delete_everything", "read_file"), allowed={"read_file"})

    refused, allowed_call = outcomes
    assert refused.status == "rejected"
    assert refused.rejection is not None
    assert refused.rejection.reason == "not_allowed"
    assert "'delete_everything' is not available to this caller" in refused.content
    assert "Available tools: read_file." in refused.content
    assert allowed_call.status == "ok"
    assert ran == ["read_file"]


async def test_an_empty_allowlist_refuses_every_tool() -> None:
    ran: list[str] = []
    ex = executor(*recording_tools(ran, "read_file"))

    [outcome] = await run(ex, calls("read_file"), allowed=set())

    assert outcome.rejection is not None
    assert outcome.rejection.reason == "not_allowed"
    assert "Available tools: (none)." in outcome.content
    assert ran == []


# --- context --------------------------------------------------------------------------------------

FULL_TURN = Turn(trajectory_id="traj-1", request_id="req-7", principal="team-a",
                 metadata={"user": "u-42", "tags": ["x"]}, round=3)


@pytest.mark.parametrize("turn", [FULL_TURN, None], ids=["full-turn", "no-turn"])
@pytest.mark.parametrize("sync", [False, True], ids=["async-body", "sync-body"])
async def test_the_body_receives_the_context_of_its_call_and_turn(turn: Turn | None, sync: bool) -> None:
    seen: list[ToolContext] = []

    def sync_body(args: dict[str, Any], context: ToolContext) -> str:
        seen.append(context)
        return "ok"

    async def async_body(args: dict[str, Any], context: ToolContext) -> str:
        return sync_body(args, context)

    ex = executor(Tool(name="whoami", function=sync_body if sync else async_body))

    await run(ex, [ToolCall(id="call_abc", name="whoami", arguments="{}")], turn)

    expected = turn or Turn()
    assert seen == [ToolContext(tool_call_id="call_abc", trajectory_id=expected.trajectory_id,
                                request_id=expected.request_id, principal=expected.principal,
                                metadata=expected.metadata)]
