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
from hypothesis import HealthCheck, event, given, settings
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
from telemetry.instrument import Telemetry
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
    "nested-300": nested(300),  # decodes, but deeper than a tool's arguments may be
    "long-value-100k": json.dumps({"path": "x" * 100_000}),
    "long-text-100k": "x" * 100_000,
    "long-json-string-100k": json.dumps("y" * 100_000),
    "huge-integer": "9" * 5000,
    "huge-integer-value": '{"n": ' + "9" * 5000 + "}",
    "many-keys": json.dumps({f"k{i}": i for i in range(5000)}),
    "long-key-100k": json.dumps({"q" * 100_000: 1}),
    "nan-value": '{"path": NaN}',
    "lone-surrogate": '{"path": "\\ud800"}',
    "empty": "",
    "blank": "  \n ",
    "null": "null",
    "array": "[1, 2]",
    "truncated": '{"path": "a',
}
UNREADABLE = {"open-brackets-5000", "open-braces-5000", "nested-3000", "nested-300", "long-text-100k",
              "long-json-string-100k", "huge-integer", "huge-integer-value", "null", "array",
              "truncated"}  # not (as) a JSON object, or too deep
FITTING_OBJECTS = st.fixed_dictionaries({"path": ANY_TEXT}, optional={"n": st.integers(), "extra": JSON_VALUES})


def weighted(*choices: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """Draw from one of `choices`, picked in proportion to its weight."""
    return st.sampled_from([strategy for weight, strategy in choices for _ in range(weight)]).flatmap(lambda s: s)


ARGUMENTS = weighted(
    (4, st.builds(json.dumps, FITTING_OBJECTS)),
    (2, st.builds(json.dumps, ARGUMENT_OBJECTS)),
    (1, st.builds(json.dumps, JSON_VALUES)),
    (1, ANY_TEXT),
    (1, st.sampled_from(sorted(EXTREME_ARGUMENTS.values()))),
)

# --- what a tool does -------------------------------------------------------------------------------


class BrokenText(TypeError):
    """An exception that cannot even be turned into text (a TypeError, which the executor reads
    for argument-name hints)."""

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
    expect: str | None = None  # the status this result must get, where the test pins it

    def __call__(self, args: dict[str, Any]) -> Any:
        return self.value

    def __repr__(self) -> str:
        return f"Returns({self.label or repr(self.value)})"


@dataclass(frozen=True)
class Raises:
    make: Callable[[], BaseException]
    label: str
    expect: str = "error"
    content: str | None = None  # the exact text the model must get, where the test pins it

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


RETURNED = [Returns(value, label, expect) for label, (value, expect) in {
    "object": (Unserialisable(), "error"),
    "circular-list": (circular(), "error"),
    "invalid-utf8-bytes": (b"\xff", "error"),
    "5000-digit-int": (10**5000, "ok"),
    "set": ({1, 2}, "ok"),
    "lone-surrogate": ("\ud800", "ok"),
    "nan": (float("nan"), "ok"),
    "Interrupt": (Interrupt("needs review", data=Unserialisable()), "interrupted"),
    "ToolResult": (ToolResult(content="fine"), "ok"),
    "ToolResult-parts": (ToolResult(content=[{"type": "text", "text": "part"}],
                                    processed_content=Unserialisable()), "ok"),
    "ToolResult-is_error": (ToolResult(content="failed on purpose", is_error=True, display_text="shown"), "error"),
    "ToolResult-int-content": (ToolResult(content=42), "error"),  # type: ignore[arg-type]
    "ToolResult-int-parts": (ToolResult(content=[1, 2]), "error"),  # type: ignore[list-item]
    "ToolResult-unserialisable-part": (ToolResult(content=[{"type": "text", "text": Unserialisable()}]), "error"),
    "ToolResult-options-None": (ToolResult(content="no options", options=None), "error"),  # type: ignore[arg-type]
}.items()]
RAISED: list[Raises] = [
    Raises(lambda: ToolError("deliberate refusal"), "ToolError", content="deliberate refusal"),
    Raises(lambda: ToolError(ValueError("wrapped")), "ToolError(exception)",  # type: ignore[arg-type]
           content="wrapped"),
    Raises(lambda: Interrupt("approve?", data={"plan": 1}), "Interrupt", "interrupted", "approve?"),
    Raises(lambda: Interrupt(42), "Interrupt(42)", "interrupted", "42"),  # type: ignore[arg-type]
    Raises(lambda: KeyError("path"), "KeyError(path)"),
    Raises(lambda: KeyError("unrelated"), "KeyError(unrelated)"),
    Raises(lambda: KeyError(42), "KeyError(42)"),
    Raises(lambda: TypeError("f() got an unexpected keyword argument 'paht'"), "TypeError(unexpected)"),
    Raises(lambda: TypeError("f() missing 1 required positional argument: 'path'"), "TypeError(missing)"),
    Raises(lambda: TypeError(), "TypeError()"),
    Raises(lambda: ValueError("bad value"), "ValueError", content="ERROR: (ValueError) bad value"),
    Raises(lambda: RuntimeError("boom"), "RuntimeError", content="ERROR: (RuntimeError) boom"),
    Raises(lambda: TimeoutError("inner timeout"), "TimeoutError", content="ERROR: (TimeoutError) inner timeout"),
    Raises(lambda: ZeroDivisionError("division by zero"), "ZeroDivisionError"),
    Raises(BrokenText, "BrokenText", content="ERROR: (BrokenText) <exception str() failed>"),
    Raises(lambda: SystemExit(2), "SystemExit", content="ERROR: (SystemExit) 2"),
]
ACTS = st.one_of(
    st.sampled_from([echo, read_path, hang]),
    st.sampled_from(RAISED),
    st.sampled_from(RETURNED),
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
    "async": async_parser,
    "returns-int": parser_returning(42),
    "returns-str": parser_returning("not a dict"),
    **{f"raises-{r.label}": parser_raising(r.make) for r in RAISED},
}
ACCEPTING_PARSERS = ("returns-None", "returns-dict", "async")


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
    parser = draw(weighted((4, st.none()), (1, st.sampled_from(list(PARSERS.values())))))
    return Tool(name=name, function=make_body(act, draw(st.booleans()), draw(st.booleans())),
                parse_args=parser, concurrent=draw(st.booleans()),
                timeout=TIMEOUT if act is hang else None, **declaration)


@dataclass(frozen=True)
class TurnCase:
    tools: Sequence[Tool]
    calls: Sequence[ToolCall]
    allowed: Collection[str] | None = None
    turn: Turn = field(default_factory=Turn)


UNKNOWN_NAMES = st.sampled_from(["tool_9", "Tool_0", "tool-0", "x" * 200]) | ANY_TEXT


def call_names(registered: list[str]) -> st.SearchStrategy[str]:
    """Mostly registered names, so that bodies run; otherwise a near miss or anything at all."""
    return weighted((4, st.sampled_from(registered)), (1, UNKNOWN_NAMES))


@st.composite
def turn_cases(draw: st.DrawFn) -> TurnCase:
    tool_names = [f"tool_{i}" for i in range(draw(st.integers(1, 4)))]
    registered = [draw(tools(name)) for name in tool_names]
    calls = draw(st.lists(st.builds(ToolCall, id=st.text(max_size=140), name=call_names(tool_names),
                                    arguments=ARGUMENTS), min_size=1, max_size=6))
    allowed = draw(weighted((3, st.none()), (1, st.sets(st.sampled_from(tool_names)))))
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
    executor = ToolExecutor(tool_registry, hooks=Telemetry(tracer_of(provider), Metrics(metrics_registry)),
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
        assert isinstance(outcome.content, str) or all(isinstance(part, dict) for part in outcome.content)
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

    labels = [(c.name if c.name in tool_registry else names.UNKNOWN_TOOL, o.status, names.SIDE_GATEWAY)
              for c, o in zip(case.calls, outcomes, strict=True)]
    assert counts(metrics_registry, names.METRIC_TOOL_CALLS) == Counter(labels)
    rejections = [(tool, o.rejection.reason, side) for (tool, _, side), o in zip(labels, outcomes, strict=True)
                  if o.rejection]
    assert counts(metrics_registry, names.METRIC_TOOL_REJECTIONS) == Counter(rejections)
    return outcomes


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(turn_cases())
def test_every_call_gets_one_outcome_one_span_and_one_count(case: TurnCase) -> None:
    for outcome in check_turn(case):  # the mix shows in --hypothesis-show-statistics
        event(f"status {outcome.status}" + (f" ({outcome.rejection.reason})" if outcome.rejection else ""))


# --- the hostile edges, every run -------------------------------------------------------------------

@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("declaration", list(DECLARATIONS.values()), ids=list(DECLARATIONS))
@pytest.mark.parametrize(("label", "arguments"), list(EXTREME_ARGUMENTS.items()), ids=list(EXTREME_ARGUMENTS))
def test_extreme_arguments_get_one_outcome(label: str, arguments: str, declaration: dict[str, Any],
                                           is_async: bool) -> None:
    tool = Tool(name="echo", function=make_body(echo, is_async, True), **declaration)
    [outcome] = check_turn(TurnCase([tool], [ToolCall(id="call_1", name="echo", arguments=arguments)]))
    reason = outcome.rejection.reason if outcome.rejection else None
    assert (reason == "invalid_json") == (label in UNREADABLE)


BODY_EXPECTATIONS = [
    *((act, act.expect, act.content) for act in RAISED),
    *((act, act.expect, None) for act in RETURNED),
    (echo, "ok", '{"path":"p"}'),
    (read_path, "ok", "p"),
    (hang, "timeout", None),
]


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(("act", "status", "content"), BODY_EXPECTATIONS,
                         ids=[getattr(act, "__name__", repr(act)) for act, _, _ in BODY_EXPECTATIONS])
def test_any_body_behaviour_gets_one_outcome(act: Callable[[dict[str, Any]], Any], status: str,
                                             content: str | None, is_async: bool) -> None:
    tool = Tool(name="act", function=make_body(act, is_async, True), timeout=TIMEOUT if act is hang else None)
    [outcome] = check_turn(TurnCase([tool], [ToolCall(id="call_1", name="act", arguments='{"path": "p"}')]))
    assert outcome.status == status
    if content is not None:
        assert outcome.content == content


@pytest.mark.parametrize(("label", "parser"), list(PARSERS.items()), ids=list(PARSERS))
def test_any_parser_behaviour_gets_one_outcome(label: str, parser: Callable[..., Any]) -> None:
    tool = Tool(name="parsed", function=make_body(echo, True, True), parse_args=parser)
    [outcome] = check_turn(TurnCase([tool], [ToolCall(id="call_1", name="parsed", arguments='{"path": "p"}')]))
    if label in ACCEPTING_PARSERS:
        assert outcome.status == "ok"
    else:
        assert outcome.rejection is not None
        assert outcome.rejection.reason == "parser"


@pytest.mark.parametrize("allowed", [None, set(), {"tool_0"}], ids=["no-allowlist", "empty-allowlist", "allowed"])
@pytest.mark.parametrize("name", ["tool_0", "", "tool_0 ", "TOOL_0", "tool_0\n", "\ud800", "x" * 200, "[" * 5000])
def test_any_tool_name_gets_one_outcome(name: str, allowed: set[str] | None) -> None:
    tool = Tool(name="tool_0", function=make_body(echo, False, True))
    [outcome] = check_turn(TurnCase([tool], [ToolCall(id="call_1", name=name, arguments="{}")], allowed))
    if name != "tool_0":
        assert outcome.rejection is not None
        assert outcome.rejection.reason == "unknown_tool"
    elif allowed is not None and name not in allowed:
        assert outcome.rejection is not None
        assert outcome.rejection.reason == "not_allowed"
    else:
        assert outcome.status == "ok"
