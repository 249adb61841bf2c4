"""Hardening of the telemetry itself (issue 10): bounded labels and attributes, secrets kept off
spans, and retry state that stays small and stays with the gateway key that made it."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, TraceFlags
from prometheus_client import CollectorRegistry

from gateway.instrumentation import RequestInfo, RequestRecord
from gateway.settings.model import Settings
from gateway.state import FailureBounds, FailureRecords
from gateway.tools import ToolCall, ToolExecutor, ToolRegistry, Turn
from telemetry import names
from telemetry.arguments import MASK, mask_message, render_arguments
from telemetry.instrument import ArgumentCapture, Telemetry
from telemetry.metrics import Metrics
from telemetry.requests import ModelLabels
from telemetry.tracing import build_provider, tracer_of
from telemetry.trajectory import Trajectories
from tests.conftest import every_outcome_registry, metric_sum


def telemetry(exporter: InMemorySpanExporter | None = None) -> Telemetry:
    processors = [SimpleSpanProcessor(exporter)] if exporter is not None else []
    return Telemetry(tracer_of(build_provider(processors=processors)), Metrics(CollectorRegistry()))


# --- labels and attributes ----------------------------------------------------------------------

def test_model_labels_bound_the_length_and_a_long_name_takes_no_slot() -> None:
    models = ModelLabels(limit=2, max_chars=8)

    def labels(model: str) -> str:
        return models.chat_model(model).label

    assert labels("x" * 9) == names.OTHER_MODEL
    assert labels("12345678") == "12345678"
    assert labels("x" * 10_000) == names.OTHER_MODEL
    assert labels("b") == "b"
    assert labels("c") == names.OTHER_MODEL  # the count bound still holds
    assert labels("12345678") == "12345678"


def test_an_invented_http_method_is_other_on_the_request_span() -> None:
    exporter = InMemorySpanExporter()
    method = "BREW" + "X" * 4000  # aiohttp's pure-Python parser takes any token as a method
    with telemetry(exporter).request(RequestInfo(method, "/v1/{tail:.*}", "/v1/x", {}, "traj")) as trace:
        trace.finish(405, RequestRecord())
    [span] = exporter.get_finished_spans()
    attributes = span.attributes or {}
    assert span.name == "HTTP /v1/{tail:.*}"
    assert attributes[names.ATTR_HTTP_METHOD] == "_OTHER"
    assert len(str(attributes[names.ATTR_HTTP_METHOD_ORIGINAL])) <= 200


def test_known_http_methods_are_kept() -> None:
    exporter = InMemorySpanExporter()
    with telemetry(exporter).request(RequestInfo("PATCH", "/v1/{tail:.*}", "/v1/x", {}, "traj")) as trace:
        trace.finish(200, RequestRecord())
    [span] = exporter.get_finished_spans()
    assert span.name == "PATCH /v1/{tail:.*}"
    assert names.ATTR_HTTP_METHOD_ORIGINAL not in (span.attributes or {})


def test_an_upstream_status_outside_http_is_counted_as_error() -> None:
    inst = telemetry()
    with inst.chat("m", False) as trace:
        trace.failed(999, "upstream_error", "odd")
    registry = inst.metrics.registry
    assert registry.get_sample_value(names.METRIC_UPSTREAM_REQUESTS, {"model": "m", "status": "error"}) == 1


# --- secrets -------------------------------------------------------------------------------------

def test_the_redact_list_is_one_list() -> None:
    assert tuple(ArgumentCapture().redact_keys) == tuple(Settings().redact_keys)
    for key in ("api-key", "x-api-key", "passwd", "X_API_KEY", "Private-Key", "cookie"):
        assert MASK in render_arguments(f'{{"{key}": "s3cr3t"}}', 2048, Settings().redact_keys), key


@pytest.mark.parametrize(("raw", "secret"), [
    ("{'password': 'hunter2', 'path': 'a'}", "hunter2"),
    ("{'password': \"hunter2\"}", "hunter2"),
    ("{'token': 12345678}", "12345678"),
    ('{"password": "hunter2"', "hunter2"),
    ("{password: hunter2, path: a}", "hunter2"),
    ("password=hunter2&user=bob", "hunter2"),
    ('"{\\"password\\": \\"hunter2\\"}"', "hunter2"),  # JSON text inside a JSON string
], ids=["single", "mixed-quotes", "number", "cut-short", "bare", "form", "double-encoded"])
def test_secret_pairs_in_text_that_is_not_a_json_object_are_masked(raw: str, secret: str) -> None:
    rendered = render_arguments(raw, 2048, Settings().redact_keys)
    assert secret not in rendered
    assert MASK in rendered


def test_masking_keeps_what_is_not_secret() -> None:
    rendered = render_arguments("{'password': 'hunter2', 'path': '/etc/hosts'}", 2048, ("password",))
    assert "'path': '/etc/hosts'" in rendered


def test_a_violation_line_of_a_secret_field_loses_its_value() -> None:
    message = "\n".join([
        "Tool 'login': 3 arguments do not fit the declared parameters.",
        '- password: String should have at least 12 characters (got "hunter2 (got x)")',
        '- auth.0.api_key: String should match pattern \'^sk-\' (got "leaky")',
        '- retries: Input should be a valid integer (got "many")',
        "Fix every problem listed and call 'login' again."])
    masked = mask_message(message, "", Settings().redact_keys, 2048)
    assert "hunter2" not in masked
    assert "leaky" not in masked
    assert f"- password: String should have at least 12 characters (got {MASK})" in masked
    assert f"- auth.0.api_key: String should match pattern '^sk-' (got {MASK})" in masked
    assert '- retries: Input should be a valid integer (got "many")' in masked


def test_secret_values_of_the_arguments_are_masked_wherever_a_message_quotes_them() -> None:
    raw = '{"user": "bob", "auth": [{"password": "hunter2\\"quoted"}], "token": 987654321}'
    message = 'refused: hunter2"quoted, escaped "hunter2\\"quoted", id 987654321, user bob'
    masked = mask_message(message, raw, Settings().redact_keys, 2048)
    assert "hunter2" not in masked
    assert "987654321" not in masked
    assert "user bob" in masked


def test_short_secret_values_are_not_hunted_through_the_message() -> None:
    # A one-letter secret would mask every "a" of the message; the pairs still go.
    masked = mask_message("- a: bad (got 1)", '{"token": "a"}', Settings().redact_keys, 2048)
    assert masked == "- a: bad (got 1)"


# --- retry state -----------------------------------------------------------------------------------

def span(n: int) -> SpanContext:
    return SpanContext(trace_id=n, span_id=n, is_remote=False, trace_flags=TraceFlags(1))


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
