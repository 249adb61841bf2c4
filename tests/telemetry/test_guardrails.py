"""Every guardrail decision recorded (issue 59): on the tool.call span (an event each, the decision
that stands as attributes), in the metrics, as decision log records; on the client's execute span
for its results; and the values a guardrail hid masked in all of it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk._logs import LoggerProvider, ReadableLogRecord
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client import CollectorRegistry

from gateway.guardrails import (
    Chains,
    GuardedCall,
    Guardrail,
    GuardrailRecord,
    Guardrails,
    Verdict,
    allow,
    deny,
    flag,
    mask,
)
from gateway.guardrails.verdicts import Decision, Moment
from gateway.tools import Tool, ToolCall, ToolExecutor, ToolOutcome, ToolRegistry, Turn
from gateway.tools.hooks import ClientResult
from gateway.tools.results import Rejection, rejected
from telemetry import names
from telemetry.decisions import DecisionLog
from telemetry.guardrails import standing_index
from telemetry.instrument import ArgumentCapture, Telemetry
from telemetry.metrics import Metrics
from telemetry.tracing import build_provider, tracer_of
from tests.conftest import metric_sum

TOKEN = "ghp_" + "x7" * 18  # what the guardrails below find and hide
TURN = Turn(trajectory_id="traj-g", request_id="req-g", principal="agent", round=1)


class Refuses(Guardrail):
    """Denies a call whose arguments hold `secret`, and (carelessly) quotes it in its reason."""

    name = "refuses"

    def __init__(self, secret: str = TOKEN) -> None:
        self.secret = secret

    async def before_execute(self, call: GuardedCall) -> Verdict | None:
        if any(self.secret in str(value) for value in call.arguments.values()):
            return deny(f"the arguments hold {self.secret}", hidden=(self.secret,))
        return None


class Masks(Guardrail):
    name = "masks"

    async def after_execute(self, call: GuardedCall, result: str) -> Verdict | None:
        if TOKEN in result:
            return mask(result.replace(TOKEN, "[masked]"), "credentials masked (a GitHub token)", hidden=(TOKEN,))
        return None


class Flags(Guardrail):
    name = "flags"

    async def before_execute(self, call: GuardedCall) -> Verdict | None:
        return flag("a production host")


@dataclass
class Allows(Guardrail):
    name: str = "allows"

    async def before_execute(self, call: GuardedCall) -> Verdict | None:
        return allow()

    async def after_execute(self, call: GuardedCall, result: str) -> Verdict | None:
        return None


class Raises(Guardrail):
    name = "raises"

    async def after_execute(self, call: GuardedCall, result: str) -> Verdict | None:
        raise ValueError("broken")


class Sleeps(Guardrail):
    name = "sleeps"

    async def before_execute(self, call: GuardedCall) -> Verdict | None:
        await asyncio.Event().wait()  # stalls until the chain's timeout cancels it
        return None


def _tools() -> ToolRegistry:
    return ToolRegistry([Tool(name="fetch", function=lambda args: f"a page with the token {TOKEN} in it"),
                         Tool(name="deploy", function=lambda args: "deployed")])


@dataclass
class Rig:
    spans: InMemorySpanExporter
    logs: InMemoryLogRecordExporter
    registry: CollectorRegistry
    telemetry: Telemetry

    def executor(self, *guards: object, timeout: float = 2.0) -> ToolExecutor:
        return ToolExecutor(_tools(), self.telemetry,
                            guardrails=Guardrails(Chains(timeout=timeout), gateway=list(guards)))

    def span(self, name: str = names.SPAN_TOOL_CALL) -> ReadableSpan:
        [found] = [s for s in self.spans.get_finished_spans() if s.name == name]
        return found

    def records(self, event: str = names.EVENT_TOOL_GUARDRAIL) -> list[ReadableLogRecord]:
        return [r for r in self.logs.get_finished_logs() if r.log_record.event_name == event]

    def value(self, metric: str, **labels: str) -> float:
        return metric_sum(self.registry, metric, **labels)

    def everything(self) -> str:
        """All the spans and log records exported, as text."""
        return "\n".join([s.to_json() for s in self.spans.get_finished_spans()]
                         + [r.to_json() for r in self.logs.get_finished_logs()])


def make_rig(capture: ArgumentCapture | None = None) -> Rig:
    spans, logs = InMemorySpanExporter(), InMemoryLogRecordExporter()
    log_provider = LoggerProvider()
    log_provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
    registry = CollectorRegistry()
    telemetry = Telemetry(tracer_of(build_provider(processors=[SimpleSpanProcessor(spans)])), Metrics(registry),
                          capture, decisions=DecisionLog(log_provider.get_logger(names.LOGGER_DECISIONS)))
    return Rig(spans, logs, registry, telemetry)


@pytest.fixture
def rig() -> Rig:
    return make_rig()


async def _call(executor: ToolExecutor, tool: str, arguments: dict[str, Any] | str) -> ToolOutcome:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    async with executor:
        [outcome] = await executor.run_turn([ToolCall("call_g", tool, raw)], TURN)
    return outcome


def _events(span: ReadableSpan) -> list[tuple[Any, ...]]:
    return [(e.attributes.get(names.ATTR_GUARDRAIL_NAME), e.attributes.get(names.ATTR_GUARDRAIL_DECISION),
             e.attributes.get(names.ATTR_GUARDRAIL_MOMENT), e.attributes.get(names.ATTR_GUARDRAIL_REASON))
            for e in span.events if e.name == names.EVENT_GUARDRAIL and e.attributes is not None]


def _standing(span: ReadableSpan) -> tuple[Any, ...]:
    attributes = span.attributes or {}
    return tuple(attributes.get(key) for key in (names.ATTR_GUARDRAIL_NAME, names.ATTR_GUARDRAIL_DECISION,
                                                 names.ATTR_GUARDRAIL_MOMENT, names.ATTR_GUARDRAIL_REASON))


async def test_a_denied_call_is_rejected_and_what_the_guardrail_hid_is_masked_everywhere(rig: Rig) -> None:
    outcome = await _call(rig.executor(Flags(), Refuses()), "deploy", {"host": "prod", "key": TOKEN})
    assert (outcome.status, outcome.rejection and outcome.rejection.reason) == ("rejected", "guardrail_denied")
    assert TOKEN in outcome.content_text()  # the model's copy says what it sent

    span = rig.span()
    attributes = span.attributes or {}
    assert (attributes[names.ATTR_OUTCOME], attributes[names.ATTR_REJECTION_REASON]) == ("rejected",
                                                                                          "guardrail_denied")
    assert _events(span) == [("flags", "flag", "before", "a production host"),
                             ("refuses", "deny", "before", "the arguments hold [REDACTED]")]
    assert _standing(span) == ("refuses", "deny", "before", "the arguments hold [REDACTED]")
    assert span.status.status_code is StatusCode.ERROR
    headline, message = (span.status.description or "").split("\n\n", 1)
    assert headline == "guardrail_denied: guardrail refuses denied the call: the arguments hold [REDACTED]"
    assert message == attributes[names.ATTR_TOOL_CALL_RESULT] == attributes[names.ATTR_OUTPUT_VALUE]
    assert json.loads(str(attributes[names.ATTR_TOOL_CALL_ARGUMENTS])) == {"host": "prod", "key": "[REDACTED]"}
    assert attributes[names.ATTR_INPUT_VALUE] == attributes[names.ATTR_TOOL_CALL_ARGUMENTS]
    assert TOKEN not in rig.everything()

    assert rig.value(names.METRIC_GUARDRAIL_DECISIONS, guardrail="flags", tool="deploy",
                     decision="flag") == 1
    assert rig.value(names.METRIC_GUARDRAIL_DECISIONS, guardrail="refuses", tool="deploy",
                     decision="deny") == 1
    assert rig.value(names.METRIC_TOOL_REJECTIONS, reason="guardrail_denied") == 1
    assert rig.value(names.METRIC_GUARDRAIL_FAILURES) == 0

    flagged, denied = rig.records()
    for record in (flagged, denied):
        assert (record.log_record.trace_id, record.log_record.span_id) == (span.context.trace_id,
                                                                           span.context.span_id)
        assert (record.log_record.attributes or {})[names.ATTR_TOOL_SIDE] == "gateway"
        assert (record.log_record.attributes or {})[names.ATTR_TOOL_CALL_ID] == "call_g"
        assert (record.log_record.attributes or {})[names.ATTR_CONVERSATION_ID] == "traj-g"
    assert (flagged.log_record.severity_text, denied.log_record.severity_text) == ("INFO", "WARN")
    assert (denied.log_record.attributes or {})[names.ATTR_GUARDRAIL_REASON] == "the arguments hold [REDACTED]"
    assert denied.log_record.body == "deploy: deny by guardrail refuses (before the call ran)"


async def test_a_masked_result_stands_over_the_allows_around_it_and_reaches_no_span() -> None:
    rig = make_rig(ArgumentCapture(record_all=True))
    outcome = await _call(rig.executor(Allows("first"), Masks()), "fetch", {"url": "https://example.com"})
    assert outcome.status == "ok"
    assert outcome.content_text() == "a page with the token [masked] in it"
    span = rig.span()
    assert _events(span) == [("first", "allow", "before", None), ("first", "allow", "after", None),
                             ("masks", "mask", "after", "credentials masked (a GitHub token)")]
    assert _standing(span) == ("masks", "mask", "after", "credentials masked (a GitHub token)")
    assert (span.attributes or {})[names.ATTR_TOOL_CALL_RESULT] == "a page with the token [masked] in it"
    assert span.status.status_code is StatusCode.UNSET
    assert TOKEN not in rig.everything()
    decisions = names.METRIC_GUARDRAIL_DECISIONS
    assert rig.value(decisions, guardrail="first", tool="fetch", decision="allow") == 2  # every decision counts
    assert rig.value(decisions, guardrail="masks", tool="fetch", decision="mask") == 1
    assert [r.log_record.severity_text for r in rig.records()] == ["INFO", "INFO", "INFO"]


async def test_when_every_guardrail_allows_the_last_of_the_chain_stands(rig: Rig) -> None:
    await _call(rig.executor(Allows("first"), Allows("second")), "deploy", {})
    span = rig.span()
    assert [event[:3] for event in _events(span)] == [("first", "allow", "before"), ("second", "allow", "before"),
                                                      ("first", "allow", "after"), ("second", "allow", "after")]
    assert _standing(span) == ("second", "allow", "after", None)


@pytest.mark.parametrize(("guard", "outcome", "headline", "event", "kind"), [
    (Raises(), "error", "guardrail_blocked: guardrail raises withheld the result: the guardrail raised ValueError; "
                        "guardrail_failure is deny", ("raises", "block", "after"), "error"),
    (Sleeps(), "rejected", "guardrail_denied: guardrail sleeps denied the call: the guardrail timed out after "
                           "0.05 s; guardrail_failure is deny", ("sleeps", "deny", "before"), "timeout"),
], ids=["raises", "times-out"])
async def test_a_guardrail_that_fails_is_recorded_with_how_it_failed(rig: Rig, guard: Guardrail, outcome: str,
                                                                      headline: str, event: tuple[str, ...],
                                                                      kind: str) -> None:
    done = await _call(rig.executor(guard, timeout=0.05), "deploy", {})
    assert done.status == outcome
    span = rig.span()
    attributes = span.attributes or {}
    if outcome == "error":
        assert attributes[names.ATTR_ERROR_TYPE] == names.ERROR_GUARDRAIL_BLOCKED
    assert (span.status.description or "").split("\n\n", 1)[0] == headline
    [recorded] = [e for e in span.events if e.name == names.EVENT_GUARDRAIL]
    recorded_attributes = recorded.attributes or {}
    assert tuple(recorded_attributes[key] for key in (names.ATTR_GUARDRAIL_NAME, names.ATTR_GUARDRAIL_DECISION,
                                                      names.ATTR_GUARDRAIL_MOMENT)) == event
    assert recorded_attributes[names.ATTR_GUARDRAIL_FAILED] == ("ValueError" if kind == "error" else "timeout")
    assert names.ATTR_GUARDRAIL_FAILED not in attributes  # the span says what stands, the event how it failed
    assert rig.value(names.METRIC_GUARDRAIL_FAILURES, guardrail=guard.name, kind=kind) == 1
    assert (rig.records()[0].log_record.attributes or {})[names.ATTR_GUARDRAIL_FAILED] == recorded_attributes[
        names.ATTR_GUARDRAIL_FAILED]


async def test_a_client_calls_check_and_its_result_record_their_decisions(rig: Rig) -> None:
    call = ToolCall("call_c", "shell", json.dumps({"command": f"echo {TOKEN}"}))
    async with rig.telemetry.tool_call(call, None, TURN, side="client") as trace:
        trace.guarded([GuardrailRecord("refuses", "before", "deny", f"holds {TOKEN}", side="client")], [TOKEN])
        trace.finish(rejected(call.id, call.name, Rejection("guardrail_denied", f"denied: holds {TOKEN}")))
    checked = rig.span()
    assert _standing(checked) == ("refuses", "deny", "before", "holds [REDACTED]")
    assert (checked.attributes or {})[names.ATTR_TOOL_SIDE] == "client"
    result = ClientResult("call_c", "shell", sent_at=None, size=12, error=False, guardrails=(
        GuardrailRecord("first", "after", "allow", side="client"),
        GuardrailRecord("masks", "after", "mask", f"masked {TOKEN}", side="client")), hidden=(TOKEN,))
    rig.telemetry.client_result(result, TURN)
    executed = rig.span(names.SPAN_TOOL_EXECUTE)
    assert _events(executed) == [("first", "allow", "after", None), ("masks", "mask", "after", "masked [REDACTED]")]
    assert _standing(executed) == ("masks", "mask", "after", "masked [REDACTED]")
    assert TOKEN not in rig.everything()
    decisions = names.METRIC_GUARDRAIL_DECISIONS
    assert rig.value(decisions, guardrail="refuses", tool="shell", decision="deny") == 1
    assert rig.value(decisions, guardrail="masks", tool="shell", decision="mask") == 1
    assert rig.value(names.METRIC_CLIENT_TOOL_ROUNDTRIP + "_count") == 0  # when it was handed over is not known
    records = rig.records()
    assert [(r.log_record.attributes or {})[names.ATTR_TOOL_SIDE] for r in records] == ["client"] * 3
    assert {r.log_record.span_id for r in records[1:]} == {executed.context.span_id}


async def test_a_client_result_no_guardrail_saw_is_as_before(rig: Rig) -> None:
    rig.telemetry.client_result(ClientResult("call_c", "shell", sent_at=0.0, size=3, error=False), TURN)
    executed = rig.span(names.SPAN_TOOL_EXECUTE)
    assert not executed.events
    assert _standing(executed) == (None, None, None, None)
    assert rig.value(names.METRIC_CLIENT_TOOL_ROUNDTRIP + "_count") == 1


async def test_without_guardrails_nothing_of_them_is_recorded(rig: Rig) -> None:
    executor = ToolExecutor(_tools(), rig.telemetry)
    assert executor.guardrails is None
    await _call(executor, "fetch", {})
    span = rig.span()
    assert not span.events
    assert not [key for key in span.attributes or {} if key.startswith("toolspan.guardrail")]
    assert not [s for m in rig.registry.collect() for s in m.samples if "guardrail" in s.name]
    assert rig.records() == []
    assert [r.log_record.event_name for r in rig.logs.get_finished_logs()] == [names.EVENT_TOOL_PARSE]


@pytest.mark.parametrize(("decisions", "index"), [
    ((), 0), (("allow",), 0), (("allow", "allow", "allow"), 2), (("flag", "allow"), 0),
    (("mask", "flag", "allow"), 0), (("rewrite", "mask"), 1), (("ask", "mask"), 0), (("flag", "deny"), 1),
    (("rewrite", "block"), 1), (("deny",), 0)])
def test_the_strongest_decision_stands_and_of_equals_the_later(decisions: Sequence[str], index: int) -> None:
    assert standing_index(decisions) == index


def test_the_guardrail_names_follow_the_guardrails_own_types() -> None:
    assert get_args(Decision) == names.GUARDRAIL_DECISIONS
    assert get_args(Moment) == names.GUARDRAIL_MOMENTS
    assert set(names.GUARDRAIL_STRENGTH) == set(names.GUARDRAIL_DECISIONS)
    assert "guardrail_denied" in names.REJECTION_REASONS


def test_no_guardrail_attribute_key_is_a_prefix_of_another_key() -> None:
    """Phoenix nests dotted keys: a key that is another's prefix would lose one of them."""
    ours = {value for key, value in vars(names).items() if key.startswith("ATTR_GUARDRAIL_")}
    every = {value for key, value in vars(names).items() if key.startswith("ATTR_") and isinstance(value, str)}
    assert len(ours) == 5
    assert not [(a, b) for a in ours for b in every if a != b and (b.startswith(a + ".") or a.startswith(b + "."))]


# --- whatever a guardrail hides, no record of the call shows it ---------------------------------------

# Hidden values are drawn with a `Q` in them, and nothing else recorded of the call holds one.
hidden_value = st.text(min_size=1, max_size=24).map(lambda text: f"Q{text}")


def _recorded_nowhere(secret: str, arguments: str, record_all: bool) -> str:
    async def scenario() -> str:
        rig = make_rig(ArgumentCapture(record_all=record_all, max_chars=64))
        await _call(rig.executor(Refuses(secret)), "deploy", arguments)
        return rig.everything()

    return asyncio.run(scenario())


@settings(max_examples=60, deadline=None)
@given(secret=hidden_value, before=st.text(alphabet="abc -/", max_size=80), record_all=st.booleans(),
       escape_slashes=st.booleans())
def test_a_hidden_value_reaches_no_span_and_no_record(secret: str, before: str, record_all: bool,
                                                      escape_slashes: bool) -> None:
    arguments = json.dumps({"note": f"{before}{secret}", "host": "prod"}, ensure_ascii=bool(len(before) % 2))
    if escape_slashes:  # JSON lets a model escape a slash: the text it sent holds the value in no plain form
        arguments = arguments.replace("/", "\\/")
    recorded = _recorded_nowhere(secret, arguments, record_all)
    assert "Q" not in recorded, recorded[recorded.find("Q") - 80:recorded.find("Q") + 80]
