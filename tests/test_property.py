"""Property: whatever the model sends and whatever a tool does, the executor never raises, returns
exactly one outcome per call (same call id, same order), and the telemetry sees each call exactly
once: one `tool.call` span and one increment of `toolspan_tool_calls_total`.

Hypothesis drives arbitrary argument text (any JSON value, non-JSON text, huge and deeply nested
payloads) against tools declared every supported way, with every kind of parser and body
behaviour, plus unknown names and names outside an allowlist. A parametrized test pins the
hostile edges so they run on every invocation, not only when hypothesis happens to draw them."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from pydantic import BaseModel

from gateway.tools import (
    Interrupt,
    Param,
    Tool,
    ToolCall,
    ToolError,
    ToolExecutor,
    ToolOutcome,
    ToolRegistry,
    ToolResult,
    Turn,
)
from telemetry import names
from telemetry.instrument import Instrumentation
from telemetry.metrics import Metrics
from telemetry.tracing import build_provider, tracer_of

STATUSES = {"ok", "error", "rejected", "timeout", "interrupted"}
BOUND = 10.0  # seconds; only a broken executor gets near it
TIMEOUT = 0.02  # the tool timeout of bodies that never finish

# --- what the model sends ---------------------------------------------------------------------------

ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=30)  # lone surrogates too
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ANY_TEXT, inner, max_size=4),
    max_leaves=12,
)
ARGUMENT_NAMES = st.sampled_from(["path", "n", "Path", "file_path", "count", "x"]) | ANY_TEXT
ARGUMENT_OBJECTS = st.dictionaries(ARGUMENT_NAMES, JSON_VALUES, max_size=4)


def nested(depth: int) -> str:
    return '{"path": ' + "[" * depth + "]" * depth + "}"


EXTREME_ARGUMENTS = {
    "open-brackets-5000": "[" * 5000,
    "open-braces-5000": "{" * 5000,
    "nested-3000": nested(3000),
    "nested-300": nested(300),  # decodes, but is too deep to serialise back
    "long-value-100k": json.dumps({"path": "x" * 100_000}),
    "long-text-100k": "x" * 100_000,
    "long-json-string-100k": json.dumps("y" * 100_000),
    "huge-integer": "9" * 5000,
    "huge-integer-value": '{"n": ' + "9" * 5000 + "}",
    "many-keys": json.dumps({f"k{i}": i for i in range(5000)}),
    "nan-value": '{"path": NaN}',
    "lone-surrogate": '{"path": "\\ud800"}',
    "empty": "",
    "blank": "  \n ",
    "null": "null",
    "array": "[1, 2]",
    "truncated": '{"path": "a',
}
ARGUMENTS = st.one_of(
    st.builds(json.dumps, ARGUMENT_OBJECTS),
    st.builds(json.dumps, JSON_VALUES),
    ANY_TEXT,
    st.sampled_from(sorted(EXTREME_ARGUMENTS.values())),
)

# --- what a tool does -------------------------------------------------------------------------------


class BrokenText(Exception):
    """An exception that cannot even be turned into text."""

    def __str__(self) -> str:
        raise RuntimeError("no text for you")

    __repr__ = __str__


class Unserialisable:
    def __repr__(self) -> str:
        return "Unserialisable()"


def circular() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


@dataclass(frozen=True)
class Returns:
    value: Any
    label: str | None = None  # for values whose repr is useless or raises

    def __call__(self, args: dict[str, Any]) -> Any:
        return self.value

    def __repr__(self) -> str:
        return f"Returns({self.label or repr(self.value)})"


@dataclass(frozen=True)
class Raises:
    make: Callable[[], BaseException]
    label: str

    def __call__(self, args: dict[str, Any]) -> Any:
        raise self.make()

    def __repr__(self) -> str:
        return f"Raises({self.label})"


def echo(args: dict[str, Any]) -> Any:
    return args


def read_path(args: dict[str, Any]) -> Any:
    return args["path"]  # a KeyError when the model left it out


def hang(args: dict[str, Any]) -> Any:
    raise AssertionError("never called: bodies built from `hang` wait forever instead")


RETURNED = [Returns(value, label) for label, value in {
    "object": Unserialisable(),
    "circular-list": circular(),
    "invalid-utf8-bytes": b"\xff",
    "5000-digit-int": 10**5000,
    "set": {1, 2},
    "lone-surrogate": "\ud800",
    "nan": float("nan"),
    "Interrupt": Interrupt("needs review", data=Unserialisable()),
    "ToolResult": ToolResult(content="fine"),
    "ToolResult-parts": ToolResult(content=[{"type": "text", "text": "part"}], processed_content=Unserialisable()),
    "ToolResult-is_error": ToolResult(content="failed on purpose", is_error=True, display_text="shown"),
    "ToolResult-int-content": ToolResult(content=42),  # type: ignore[arg-type]
    "ToolResult-int-parts": ToolResult(content=[1, 2]),  # type: ignore[list-item]
    "ToolResult-unserialisable-part": ToolResult(content=[{"type": "text", "text": Unserialisable()}]),
    "ToolResult-options-None": ToolResult(content="no options", options=None),  # type: ignore[arg-type]
}.items()]
RAISED: list[Raises] = [
    Raises(lambda: ToolError("deliberate refusal"), "ToolError"),
    Raises(lambda: ToolError(ValueError("wrapped")), "ToolError(exception)"),  # type: ignore[arg-type]
    Raises(lambda: Interrupt("approve?", data={"plan": 1}), "Interrupt"),
    Raises(lambda: Interrupt(42), "Interrupt(42)"),  # type: ignore[arg-type]
    Raises(lambda: KeyError("path"), "KeyError(path)"),
    Raises(lambda: KeyError("unrelated"), "KeyError(unrelated)"),
    Raises(lambda: KeyError(42), "KeyError(42)"),
    Raises(lambda: TypeError("f() got an unexpected keyword argument 'paht'"), "TypeError(unexpected)"),
    Raises(lambda: TypeError("f() missing 1 required positional argument: 'path'"), "TypeError(missing)"),
    Raises(lambda: TypeError(), "TypeError()"),
    Raises(lambda: ValueError("bad value"), "ValueError"),
    Raises(lambda: RuntimeError("boom"), "RuntimeError"),
    Raises(lambda: TimeoutError("inner timeout"), "TimeoutError"),
    Raises(lambda: ZeroDivisionError("division by zero"), "ZeroDivisionError"),
    Raises(BrokenText, "BrokenText"),
    Raises(lambda: SystemExit(2), "SystemExit"),
]
ACTS = st.one_of(
    st.sampled_from([echo, read_path, hang, *RAISED, *RETURNED]),
    st.builds(Returns, ANY_TEXT | JSON_VALUES),
)


def make_body(act: Callable[[dict[str, Any]], Any], is_async: bool, with_context: bool) -> Callable[..., Any]:
    if act is hang:
        async def waits_forever(args: dict[str, Any], context: Any = None) -> Any:
            await asyncio.Event().wait()
        return waits_forever
    if is_async:
        async def async_body(args: dict[str, Any], context: Any) -> Any:
            return act(args)

        async def async_body_no_context(args: dict[str, Any]) -> Any:
            return act(args)
        return async_body if with_context else async_body_no_context

    def sync_body(args: dict[str, Any], context: Any) -> Any:
        return act(args)

    def sync_body_no_context(args: dict[str, Any]) -> Any:
        return act(args)
    return sync_body if with_context else sync_body_no_context


def parser_returning(value: Any) -> Callable[[dict[str, Any]], Any]:
    def parse(args: dict[str, Any]) -> Any:
        return value
    return parse


def parser_raising(make: Callable[[], BaseException]) -> Callable[[dict[str, Any], Any], Any]:
    def parse(args: dict[str, Any], context: Any) -> Any:
        raise make()
    return parse


async def async_parser(args: dict[str, Any], context: Any) -> dict[str, Any]:
    return {**args, "parsed": True}


PARSERS: dict[str, Callable[..., Any]] = {
    "returns-None": parser_returning(None),
    "returns-dict": parser_returning({"path": "p"}),
    "returns-int": parser_returning(42),
    "returns-str": parser_returning("not a dict"),
    "async": async_parser,
    **{f"raises-{r.label}": parser_raising(r.make) for r in RAISED},
}


class Invoice(BaseModel):
    path: str
    n: int = 0


DECLARATIONS: dict[str, dict[str, Any]] = {
    "undeclared": {},
    "parameters": {"parameters": [Param("path", "string", required=True), Param("n", "integer")]},
    "parameters_schema": {"parameters_schema": {
        "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
    "open-schema": {"parameters_schema": {"type": "object"}},  # enumerates no names to check
    "args_model": {"args_model": Invoice},
}


@st.composite
def tools(draw: st.DrawFn, name: str) -> Tool:
    act = draw(ACTS)
    declaration = draw(st.sampled_from(list(DECLARATIONS.values())))
    parser = draw(st.none() | st.sampled_from(list(PARSERS.values())))
    return Tool(name=name, function=make_body(act, draw(st.booleans()), draw(st.booleans())),
                parse_args=parser, concurrent=draw(st.booleans()),
                timeout=TIMEOUT if act is hang else None, **declaration)


@dataclass(frozen=True)
class TurnCase:
    tools: Sequence[Tool]
    calls: Sequence[ToolCall]
    allowed: Collection[str] | None = None
    turn: Turn = field(default_factory=Turn)


@st.composite
def turn_cases(draw: st.DrawFn) -> TurnCase:
    tool_names = [f"tool_{i}" for i in range(draw(st.integers(0, 4)))]
    registered = [draw(tools(name)) for name in tool_names]
    known = st.sampled_from(tool_names) if tool_names else st.nothing()
    unknown = st.sampled_from(["tool_9", "Tool_0", "tool-0", "x" * 200]) | ANY_TEXT
    calls = draw(st.lists(
        st.builds(ToolCall, id=st.text(max_size=140), name=known | unknown, arguments=ARGUMENTS), max_size=6))
    allowed = draw(st.none() | st.sets(st.sampled_from(tool_names)) if tool_names else st.none())
    turn = Turn(trajectory_id=draw(st.none() | ANY_TEXT), request_id="req-1", principal=draw(st.none() | ANY_TEXT),
                metadata=draw(st.dictionaries(ANY_TEXT, JSON_VALUES, max_size=2)), round=draw(st.integers(1, 9)))
    return TurnCase(registered, calls, allowed, turn)


# --- the property -----------------------------------------------------------------------------------


def counts(registry: CollectorRegistry, metric: str) -> Counter[tuple[str, ...]]:
    """Sample values of `metric` by label values, as a multiset."""
    out: Counter[tuple[str, ...]] = Counter()
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == metric and sample.value:
                out[tuple(sample.labels.values())] += int(sample.value)
    return out


def check_turn(case: TurnCase) -> list[ToolOutcome]:
    exporter = InMemorySpanExporter()
    provider = build_provider(processors=[SimpleSpanProcessor(exporter)])
    metrics_registry = CollectorRegistry()
    tool_registry = ToolRegistry(case.tools)
    executor = ToolExecutor(tool_registry, hooks=Instrumentation(tracer_of(provider), Metrics(metrics_registry)),
                            default_timeout=BOUND)
    try:
        outcomes = asyncio.run(asyncio.wait_for(executor.run_turn(case.calls, case.turn, case.allowed), 2 * BOUND))
        spans = [s for s in exporter.get_finished_spans() if s.name == names.SPAN_TOOL_CALL]
    finally:
        provider.shutdown()

    assert [o.call_id for o in outcomes] == [c.id for c in case.calls]
    assert [o.tool_name for o in outcomes] == [c.name for c in case.calls]
    for call, outcome in zip(case.calls, outcomes, strict=True):
        assert outcome.status in STATUSES
        assert isinstance(outcome.content, str | list)
        if call.name not in tool_registry:
            assert outcome.rejection is not None
            assert outcome.rejection.reason == "unknown_tool"
        elif case.allowed is not None and call.name not in case.allowed:
            assert outcome.rejection is not None
            assert outcome.rejection.reason == "not_allowed"

    assert Counter((s.attributes or {}).get(names.ATTR_TOOL_CALL_ID) for s in spans) == Counter(
        c.id[:128] for c in case.calls)
    assert Counter(((s.attributes or {}).get(names.ATTR_TOOL_CALL_ID), (s.attributes or {}).get(names.ATTR_OUTCOME))
                   for s in spans) == Counter((o.call_id[:128], o.status) for o in outcomes)

    labels = [(c.name if c.name in tool_registry else names.UNKNOWN_TOOL, o.status)
              for c, o in zip(case.calls, outcomes, strict=True)]
    assert counts(metrics_registry, names.METRIC_TOOL_CALLS) == Counter(labels)
    rejections = [(tool, o.rejection.reason) for (tool, _), o in zip(labels, outcomes, strict=True) if o.rejection]
    assert counts(metrics_registry, names.METRIC_TOOL_REJECTIONS) == Counter(rejections)
    return outcomes


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(turn_cases())
def test_every_call_gets_one_outcome_one_span_and_one_count(case: TurnCase) -> None:
    check_turn(case)


# --- the hostile edges, every run -------------------------------------------------------------------

@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("declaration", list(DECLARATIONS.values()), ids=list(DECLARATIONS))
@pytest.mark.parametrize("arguments", list(EXTREME_ARGUMENTS.values()), ids=list(EXTREME_ARGUMENTS))
def test_extreme_arguments_get_one_outcome(arguments: str, declaration: dict[str, Any], is_async: bool) -> None:
    tool = Tool(name="echo", function=make_body(echo, is_async, True), **declaration)
    [outcome] = check_turn(TurnCase([tool], [ToolCall(id="call_1", name="echo", arguments=arguments)]))
    assert outcome.status in {"ok", "rejected", "error"}


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("act", [*RAISED, *RETURNED], ids=repr)
def test_any_body_behaviour_gets_one_outcome(act: Callable[[dict[str, Any]], Any], is_async: bool) -> None:
    tool = Tool(name="act", function=make_body(act, is_async, True))
    [outcome] = check_turn(TurnCase([tool], [ToolCall(id="call_1", name="act", arguments='{"path": "p"}')]))
    assert outcome.status in {"ok", "error", "interrupted"}


@pytest.mark.parametrize("parser", list(PARSERS.values()), ids=list(PARSERS))
def test_any_parser_behaviour_gets_one_outcome(parser: Callable[..., Any]) -> None:
    tool = Tool(name="parsed", function=make_body(echo, True, True), parse_args=parser)
    [outcome] = check_turn(TurnCase([tool], [ToolCall(id="call_1", name="parsed", arguments='{"path": "p"}')]))
    assert outcome.status in {"ok", "rejected"}
