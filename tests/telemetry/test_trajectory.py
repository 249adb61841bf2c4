"""Retry classification: verbatim, corrected, per trajectory, bounded and expiring."""

from __future__ import annotations

import logging

import pytest
from opentelemetry.trace import SpanContext, TraceFlags

from gateway.state import FailureBounds, FailureRecords
from telemetry.trajectory import Trajectories, canonical


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


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
