"""Retry classification: verbatim, corrected, per trajectory, bounded and expiring."""

from __future__ import annotations

import asyncio
import gc
import logging
import tracemalloc
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, TraceFlags
from prometheus_client import CollectorRegistry

from gateway.state import FailureBounds, FailureRecords
from gateway.tools import ToolCall, ToolExecutor, ToolRegistry, Turn
from telemetry import names
from telemetry.instrument import Telemetry
from telemetry.metrics import Metrics
from telemetry.tracing import build_provider, tracer_of
from telemetry.trajectory import Trajectories, canonical
from tests.conftest import Clock, every_outcome_registry, metric_sum
from tests.telemetry.conftest import telemetry


def span(n: int) -> SpanContext:
    return SpanContext(trace_id=n, span_id=n, is_remote=False, trace_flags=TraceFlags(1))


@pytest.fixture
def clock() -> Clock:
    return Clock()


async def fail(t: Trajectories, trajectory: str, tool: str, args: str, n: int) -> None:
    await t.record(trajectory, tool, args, span(n), failed=True, retry=await t.classify(trajectory, tool, args))


def test_canonical_ignores_key_order_and_spacing_and_stays_small() -> None:
    assert canonical('{"b": 1, "a": [1, 2]}') == canonical('{"a":[1,2],"b":1}')
    assert canonical("{not json ") == canonical(" {not json")
    assert canonical('{"a": 1}') != canonical('{"a": 2}')
    assert len(canonical('{"a": "' + "x" * 1_000_000 + '"}')) == 64  # a digest, whatever was sent


async def test_same_arguments_after_a_failure_is_a_verbatim_retry(clock: Clock) -> None:
    t = Trajectories(FailureRecords(clock=clock))
    await fail(t, "tr", "read_file", '{"file_path": "a"}', 1)
    retry = await t.classify("tr", "read_file", '{ "file_path":"a" }')
    assert retry is not None
    assert (retry.kind, retry.retries.span_id) == ("verbatim", 1)


async def test_changed_arguments_after_a_failure_is_a_corrected_retry(clock: Clock) -> None:
    t = Trajectories(FailureRecords(clock=clock))
    await fail(t, "tr", "read_file", '{"file_path": "a"}', 1)
    retry = await t.classify("tr", "read_file", '{"path": "a"}')
    assert retry is not None
    assert (retry.kind, retry.retries.span_id) == ("corrected", 1)


async def test_no_retry_without_an_earlier_failure_or_after_recovery(clock: Clock) -> None:
    t = Trajectories(FailureRecords(clock=clock))
    assert await t.classify("tr", "read_file", "{}") is None
    await fail(t, "tr", "read_file", "{}", 1)
    retry = await t.classify("tr", "read_file", '{"path": "a"}')
    await t.record("tr", "read_file", '{"path": "a"}', span(2), failed=False, retry=retry)
    assert await t.classify("tr", "read_file", '{"path": "a"}') is None


async def test_other_tools_and_other_trajectories_are_not_retries(clock: Clock) -> None:
    t = Trajectories(FailureRecords(clock=clock))
    await fail(t, "tr-1", "read_file", "{}", 1)
    assert await t.classify("tr-1", "write_file", "{}") is None
    assert await t.classify("tr-2", "read_file", "{}") is None
    assert await t.classify(None, "read_file", "{}") is None


async def test_a_retry_that_fails_again_becomes_the_call_to_retry(clock: Clock) -> None:
    t = Trajectories(FailureRecords(clock=clock))
    await fail(t, "tr", "read_file", '{"file_path": "a"}', 1)
    await fail(t, "tr", "read_file", '{"filepath": "a"}', 2)  # corrected, still wrong
    retry = await t.classify("tr", "read_file", '{"filepath": "a"}')
    assert retry is not None
    assert (retry.kind, retry.retries.span_id) == ("verbatim", 2)


async def test_second_verbatim_retry_is_logged_as_a_warning(clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    t = Trajectories(FailureRecords(clock=clock))
    caplog.set_level(logging.WARNING, logger="toolspan.trajectory")
    await fail(t, "tr", "read_file", "{}", 1)
    await fail(t, "tr", "read_file", "{}", 2)  # first verbatim retry: not yet a loop
    assert caplog.records == []
    retry = await t.classify("tr", "read_file", "{}")  # the second one is
    assert retry is not None
    assert retry.verbatim_retries == 2
    [record] = caplog.records
    assert "same failing call to read_file" in record.getMessage()
    assert "tr" in record.getMessage()


async def test_state_expires(clock: Clock) -> None:
    t = Trajectories(FailureRecords(FailureBounds(ttl_seconds=60), clock))
    await fail(t, "tr", "read_file", "{}", 1)
    clock.now += 59
    assert await t.classify("tr", "read_file", "{}") is not None
    clock.now += 61
    assert await t.classify("tr", "read_file", "{}") is None


async def test_state_is_bounded_in_trajectories(clock: Clock) -> None:
    records = FailureRecords(FailureBounds(trajectories=3), clock)
    t = Trajectories(records)
    for n in range(10):
        clock.now += 1
        await fail(t, f"tr-{n}", "read_file", "{}", n)
    assert len(records) == 3
    assert await t.classify("tr-0", "read_file", "{}") is None
    assert await t.classify("tr-9", "read_file", "{}") is not None


async def test_state_is_bounded_in_tools_per_trajectory(clock: Clock) -> None:
    t = Trajectories(FailureRecords(FailureBounds(tools_per_trajectory=2), clock))
    for n in range(5):
        await fail(t, "tr", f"invented_{n}", "{}", n)
    assert await t.classify("tr", "invented_0", "{}") is None
    assert await t.classify("tr", "invented_4", "{}") is not None


async def test_successes_alone_hold_no_state(clock: Clock) -> None:
    records = FailureRecords(clock=clock)
    t = Trajectories(records)
    for n in range(100):
        await t.record(f"tr-{n}", "read_file", "{}", span(n), failed=False, retry=None)
    assert len(records) == 0


# --- retry state through the executor and its telemetry (issue 10's hardening) -----------------------

async def test_retry_state_is_scoped_by_principal() -> None:
    t = Trajectories()
    await t.record("tr", "read_file", "{}", span(1), failed=True, retry=None, principal="alice")
    assert await t.classify("tr", "read_file", "{}", principal="bob") is None
    assert await t.classify("tr", "read_file", "{}") is None  # no key is a scope of its own too
    retry = await t.classify("tr", "read_file", "{}", principal="alice")
    assert retry is not None
    assert retry.retries.span_id == 1


async def test_retry_state_is_bounded_in_failures_overall() -> None:
    records = FailureRecords(FailureBounds(trajectories=1000, tools_per_trajectory=64, records=500))
    t = Trajectories(records)
    for n in range(100):
        for tool in range(64):
            await t.record(f"tr-{n}", f"tool_{tool}", "{}", span(n * 64 + tool + 1), failed=True, retry=None)
    assert records.count <= 500
    assert await t.classify("tr-99", "tool_63", "{}") is not None  # the most recent stays
    assert await t.classify("tr-0", "tool_0", "{}") is None


def failures_of(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == names.SPAN_TOOL_CALL]


async def test_invented_tool_names_of_any_length_hold_no_memory() -> None:
    """200 calls, each to a 200 KB invented name in its own trajectory: +49 MiB before."""
    inst = telemetry()
    executor = ToolExecutor(ToolRegistry(), inst)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(200):
            turn = Turn(trajectory_id=f"tr-{n}", principal="alice")
            await executor.run_turn([ToolCall(f"call_{n}", f"{n}{'x' * 200_000}", "{}")], turn, None)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert isinstance(inst.trajectories.book, FailureRecords)
    assert len(inst.trajectories.book) == 200
    assert grown < 2 * 1024 * 1024, f"{grown / 2**20:.1f} MiB kept"
    # Invented names are tracked as one: a second invented name is a retry of the first.
    turn = Turn(trajectory_id="tr-0", principal="alice")
    exporter = InMemorySpanExporter()
    traced = Telemetry(tracer_of(build_provider(processors=[SimpleSpanProcessor(exporter)])), inst.metrics,
                       trajectories=inst.trajectories)
    await ToolExecutor(ToolRegistry(), traced).run_turn([ToolCall("call_x", "another", "{}")], turn, None)
    [call] = failures_of(exporter)
    assert (call.attributes or {})[names.ATTR_RETRY_KIND] == "verbatim"


async def test_a_registered_tools_retry_is_still_found_per_principal() -> None:
    exporter = InMemorySpanExporter()
    inst = Telemetry(tracer_of(build_provider(processors=[SimpleSpanProcessor(exporter)])),
                     Metrics(CollectorRegistry()))
    executor = ToolExecutor(every_outcome_registry(), inst)
    calls: list[tuple[str | None, Any]] = [("alice", 1), ("bob", 2), ("alice", 3), ("bob", 4)]
    for principal, n in calls:
        await executor.run_turn([ToolCall(f"call_{n}", "locked", "{}")], Turn("tr", principal=principal), None)
    kinds = [(s.attributes or {}).get(names.ATTR_RETRY_KIND) for s in failures_of(exporter)]
    assert kinds == [None, None, "verbatim", "verbatim"]


class StuckBook(FailureRecords):
    """A shared store whose writes never finish (Redis stalled): `writing` is set when one starts."""

    def __init__(self) -> None:
        super().__init__()
        self.writing = asyncio.Event()

    async def remember_failure(self, principal: str | None, trajectory_id: str, tool: str,
                               record: str | None) -> None:
        self.writing.set()
        await asyncio.Event().wait()


async def test_a_call_cancelled_while_its_retry_state_is_written_is_still_spanned_and_counted() -> None:
    exporter = InMemorySpanExporter()
    book = StuckBook()
    inst = Telemetry(tracer_of(build_provider(processors=[SimpleSpanProcessor(exporter)])),
                     Metrics(CollectorRegistry()), trajectories=Trajectories(book))
    executor = ToolExecutor(every_outcome_registry(), inst)
    call = asyncio.ensure_future(executor.run_turn([ToolCall("call_1", "locked", "{}")], Turn("tr"), None))
    await book.writing.wait()
    call.cancel()  # the client went away while the failure was being written
    with pytest.raises(asyncio.CancelledError):
        await call
    [span] = failures_of(exporter)
    assert (span.attributes or {})[names.ATTR_OUTCOME] == "error"
    assert metric_sum(inst.metrics.registry, names.METRIC_TOOL_CALLS, tool="locked", outcome="error") == 1
