"""One tool.call span and one count per call, whatever the outcome."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client import CollectorRegistry

from gateway.tools import (
    Tool,
    ToolCall,
    ToolExecutor,
    ToolOutcome,
    ToolRegistry,
    Turn,
)
from telemetry import names
from telemetry.instrument import ArgumentCapture, Telemetry
from telemetry.metrics import Metrics
from telemetry.tracing import build_provider, tracer_of
from tests.conftest import every_outcome_registry, metric_sum


@dataclass
class Rig:
    exporter: InMemorySpanExporter
    registry: CollectorRegistry
    executor: ToolExecutor

    def spans(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.name == name]

    def total(self, metric: str) -> float:
        """Sum over every label set of a counter (or of a histogram's _count)."""
        sample_name = metric if metric.endswith("_total") else metric + "_count"
        return sum(s.value for m in self.registry.collect() for s in m.samples if s.name == sample_name)

    def value(self, metric: str, **labels: str) -> float:
        return metric_sum(self.registry, metric, **labels)

    async def call(self, name: str, arguments: str, allowed: list[str] | None = None) -> ToolOutcome:
        turn = Turn(trajectory_id="traj-1", request_id="req-1", round=2)
        [outcome] = await self.executor.run_turn([ToolCall("call_1", name, arguments)], turn, allowed)
        return outcome


def make_rig(capture: ArgumentCapture | None = None, tools: list[Tool] | None = None) -> Rig:
    exporter = InMemorySpanExporter()
    provider = build_provider(processors=[SimpleSpanProcessor(exporter)])
    registry = CollectorRegistry()
    instrumentation = Telemetry(tracer_of(provider), Metrics(registry), capture)
    available = ToolRegistry(tools) if tools else every_outcome_registry()
    return Rig(exporter, registry, ToolExecutor(available, instrumentation))


@pytest.fixture
def rig() -> Rig:
    return make_rig()


@dataclass(frozen=True)
class Case:
    tool: str
    arguments: str
    outcome: str
    label: str
    reason: str | None = None
    error_type: str | None = None
    children: tuple[str, ...] = ()
    allowed: tuple[str, ...] | None = None


CASES = [
    Case("read_file", '{"path": "a.txt"}', "ok", "read_file", children=("tool.parse", "tool.execute")),
    Case("locked", "{}", "error", "locked", error_type="ToolError", children=("tool.parse", "tool.execute")),
    Case("crash", "{}", "error", "crash", error_type="ValueError", children=("tool.parse", "tool.execute")),
    Case("slow", "{}", "timeout", "slow", error_type="timeout", children=("tool.parse", "tool.execute")),
    Case("review", "{}", "interrupted", "review", children=("tool.parse", "tool.execute")),
    Case("read_file", '{"path": ', "rejected", "read_file", "invalid_json", "invalid_json", ("tool.parse",)),
    Case("read_file", '{"file_path": "a"}', "rejected", "read_file", "missing_arguments", "missing_arguments",
         ("tool.parse",)),
    Case("strict", '{"path": "a"}', "rejected", "strict", "parser", "parser", ("tool.parse",)),
    Case("no_such_tool", "{}", "rejected", names.UNKNOWN_TOOL, "unknown_tool", "unknown_tool"),
    Case("admin", "{}", "rejected", "admin", "not_allowed", "not_allowed", allowed=("read_file",)),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.outcome}-{c.reason or c.error_type or 'plain'}")
async def test_every_outcome_gives_one_span_and_one_count(rig: Rig, case: Case) -> None:
    allowed = list(case.allowed) if case.allowed is not None else None
    outcome = await rig.call(case.tool, case.arguments, allowed)
    assert outcome.status == case.outcome

    [span] = rig.spans(names.SPAN_TOOL_CALL)
    attrs = span.attributes or {}
    assert attrs[names.ATTR_OPERATION_NAME] == "execute_tool"
    assert attrs[names.ATTR_TOOL_NAME] == case.tool
    assert attrs[names.ATTR_TOOL_CALL_ID] == "call_1"
    assert attrs[names.ATTR_TOOL_TYPE] == "function"
    assert attrs[names.ATTR_CONVERSATION_ID] == "traj-1"
    assert attrs[names.ATTR_ROUND] == 2
    assert attrs[names.ATTR_OUTCOME] == case.outcome
    assert attrs.get(names.ATTR_REJECTION_REASON) == case.reason
    assert attrs.get(names.ATTR_ERROR_TYPE) == case.error_type
    if case.outcome in ("ok", "interrupted"):
        assert span.status.status_code is StatusCode.UNSET
    else:
        assert span.status.status_code is StatusCode.ERROR
        # The first line says why, in a line a trace list shows; the model's message follows, whole.
        headline, message = (span.status.description or "").split("\n\n", 1)
        assert headline.startswith(f"{case.reason or case.error_type}: ")
        assert message == outcome.content == attrs[names.ATTR_TOOL_CALL_RESULT] == attrs[names.ATTR_OUTPUT_VALUE]

    children = [s for s in rig.exporter.get_finished_spans() if s.parent is not None]
    assert tuple(s.name for s in children) == case.children
    assert all(s.parent.span_id == span.context.span_id for s in children)  # type: ignore[union-attr]

    assert rig.total(names.METRIC_TOOL_CALLS) == 1
    assert rig.value(names.METRIC_TOOL_CALLS, tool=case.label, outcome=case.outcome) == 1
    assert rig.total(names.METRIC_TOOL_CALL_DURATION) == 1
    assert rig.total(names.METRIC_TOOL_REJECTIONS) == (1 if case.reason else 0)
    if case.reason:
        assert rig.value(names.METRIC_TOOL_REJECTIONS, tool=case.label, reason=case.reason) == 1


async def test_renamed_argument_lands_on_the_span(rig: Rig) -> None:
    await rig.call("read_file", '{"file_path": "a.txt"}')
    [span] = rig.spans(names.SPAN_TOOL_CALL)
    attrs = span.attributes or {}
    assert attrs[names.ATTR_ARGS_MISSING] == ("path",)
    assert attrs[names.ATTR_ARGS_UNRECOGNIZED] == ("file_path",)
    assert attrs[names.ATTR_ARGS_SUGGESTIONS] == ("file_path->path",)
    assert json.loads(str(attrs[names.ATTR_TOOL_CALL_ARGUMENTS])) == {"file_path": "a.txt"}


async def test_duration_exemplar_carries_the_trace_id(rig: Rig) -> None:
    await rig.call("read_file", '{"path": "a"}')
    [span] = rig.spans(names.SPAN_TOOL_CALL)
    exemplars = [s.exemplar for m in rig.registry.collect() for s in m.samples
                 if s.name == names.METRIC_TOOL_CALL_DURATION + "_bucket" and s.exemplar]
    assert [e.labels for e in exemplars] == [{names.EXEMPLAR_TRACE_ID: format(span.context.trace_id, "032x")}]


async def test_unknown_names_share_one_label() -> None:
    rig = make_rig()
    for index in range(5):
        await rig.call(f"invented_{index}", "{}")
    assert rig.value(names.METRIC_TOOL_CALLS, tool=names.UNKNOWN_TOOL, outcome="rejected") == 5
    tools = {s.labels["tool"] for m in rig.registry.collect() for s in m.samples if "tool" in s.labels}
    assert tools == {names.UNKNOWN_TOOL}


async def test_arguments_stay_off_successful_calls_unless_opted_in() -> None:
    quiet, loud = make_rig(), make_rig(ArgumentCapture(record_all=True))
    for rig in (quiet, loud):
        await rig.call("read_file", '{"path": "a"}')
    [quiet_span], [loud_span] = quiet.spans(names.SPAN_TOOL_CALL), loud.spans(names.SPAN_TOOL_CALL)
    assert names.ATTR_TOOL_CALL_ARGUMENTS not in (quiet_span.attributes or {})
    assert (loud_span.attributes or {})[names.ATTR_TOOL_CALL_ARGUMENTS] == '{"path": "a"}'


@pytest.mark.parametrize("arguments", [
    '{"file_path": "a", "api_key": "sk-live-123", "nested": {"Password": "hunter2"}}',
    '{"file_path": "a", "api_key": "sk-live-123", "nested": {"Password": "hunter2"',  # not JSON
])
async def test_recorded_arguments_are_redacted(arguments: str) -> None:
    rig = make_rig()
    await rig.call("read_file", arguments)
    [span] = rig.spans(names.SPAN_TOOL_CALL)
    recorded = str((span.attributes or {})[names.ATTR_TOOL_CALL_ARGUMENTS])
    assert "sk-live-123" not in recorded
    assert "hunter2" not in recorded
    assert "[REDACTED]" in recorded
    assert '"file_path"' in recorded


async def test_recorded_arguments_are_truncated() -> None:
    rig = make_rig(ArgumentCapture(max_chars=100))
    await rig.call("read_file", json.dumps({"file_path": "x" * 10_000}))
    [span] = rig.spans(names.SPAN_TOOL_CALL)
    recorded = str((span.attributes or {})[names.ATTR_TOOL_CALL_ARGUMENTS])
    assert recorded.startswith('{"file_path": "xxx')
    assert len(recorded) < 150
    assert "truncated" in recorded


async def test_spans_the_body_opens_nest_under_tool_execute() -> None:
    seen: list[int] = []

    async def body(args: dict[str, Any]) -> str:
        seen.append(trace.get_current_span().get_span_context().span_id)
        return "ok"

    rig = make_rig(tools=[Tool(name="probe", function=body)])
    await rig.call("probe", "{}")
    [execute] = rig.spans(names.SPAN_TOOL_EXECUTE)
    assert seen == [execute.context.span_id]


async def test_a_cancelled_call_still_ends_its_span_and_counts_once() -> None:
    started = asyncio.Event()

    async def body(args: dict[str, Any]) -> str:
        started.set()
        await asyncio.Event().wait()
        return "never"

    rig = make_rig(tools=[Tool(name="stuck", function=body)])
    task = asyncio.create_task(rig.call("stuck", "{}"))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    [span] = rig.spans(names.SPAN_TOOL_CALL)
    assert (span.attributes or {})[names.ATTR_OUTCOME] == "cancelled"
    assert span.status.status_code is StatusCode.ERROR
    assert {s.name for s in rig.exporter.get_finished_spans()} == {"tool.call", "tool.parse", "tool.execute"}
    assert rig.total(names.METRIC_TOOL_CALLS) == 1


def test_every_name_constant_is_unique() -> None:
    constants = {k: v for k, v in vars(names).items() if k.isupper() and isinstance(v, str)}
    spans = [v for k, v in constants.items() if k.startswith("SPAN_")]
    metrics = [v for k, v in constants.items() if k.startswith("METRIC_")]
    assert len(set(spans)) == len(spans)
    assert len(set(metrics)) == len(metrics)
    assert all(str(m).startswith("toolspan_") for m in metrics)


async def test_lone_surrogates_never_reach_span_attributes() -> None:
    rig = make_rig()
    await rig.call("read_file", '{"\\ud800key": 1}')
    [span] = rig.spans(names.SPAN_TOOL_CALL)
    attrs = span.attributes or {}
    for value in [*attrs[names.ATTR_ARGS_UNRECOGNIZED], span.status.description or ""]:  # type: ignore[misc]
        str(value).encode("utf-8")  # raises on a lone surrogate
