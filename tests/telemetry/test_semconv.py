"""toolspan's conventional telemetry names against the convention packages' own constants, at the
versions the tests install: OpenTelemetry's semantic conventions (the release the pinned SDK requires)
and OpenInference's (pinned exactly in pyproject's test extra).

Every constant of telemetry/names.py whose value starts with a conventional prefix is in one of three
tables: CONVENTIONAL (it must equal the convention's constant), NOT_IN_CONVENTIONS_YET (the pinned
conventions have no such name yet) or OWN_NAMES (toolspan's own name that happens to share a prefix),
so that a new conventional name cannot slip in unchecked."""

from __future__ import annotations

from enum import Enum
from types import ModuleType

import pytest
from openinference.semconv.trace import OpenInferenceMimeTypeValues, OpenInferenceSpanKindValues, SpanAttributes

# The conventions still in development (GenAI, MCP, session) are published under `_incubating`: that
# module path is the package's public home for them. Only this test reads them.
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv._incubating.attributes import mcp_attributes as mcp
from opentelemetry.semconv._incubating.attributes import session_attributes as session
from opentelemetry.semconv.attributes import error_attributes as error
from opentelemetry.semconv.attributes import http_attributes as http
from opentelemetry.semconv.attributes import network_attributes as network
from opentelemetry.semconv.attributes import url_attributes as url

from gateway.mcp.tools import METHOD_CALL_TOOL
from gateway.provider.client import PROVIDER_NAMES
from telemetry import names

CONVENTIONAL_PREFIXES = ("gen_ai.", "http.", "url.", "error.", "mcp.", "network.", "session.", "input.", "output.",
                         "tool.", "openinference.")
CONVENTION_MODULES: tuple[ModuleType, ...] = (gen_ai, mcp, session, error, http, network, url)

# names.py constant -> the convention constants it must equal (two, where both conventions name it).
CONVENTIONAL: dict[str, tuple[str, ...]] = {
    # OpenTelemetry GenAI (development)
    "ATTR_OPERATION_NAME": (gen_ai.GEN_AI_OPERATION_NAME,),
    "ATTR_PROVIDER_NAME": (gen_ai.GEN_AI_PROVIDER_NAME,),
    "ATTR_CONVERSATION_ID": (gen_ai.GEN_AI_CONVERSATION_ID,),
    "ATTR_REQUEST_MODEL": (gen_ai.GEN_AI_REQUEST_MODEL,),
    "ATTR_REQUEST_STREAM": (gen_ai.GEN_AI_REQUEST_STREAM,),
    "ATTR_RESPONSE_ID": (gen_ai.GEN_AI_RESPONSE_ID,),
    "ATTR_RESPONSE_MODEL": (gen_ai.GEN_AI_RESPONSE_MODEL,),
    "ATTR_FINISH_REASONS": (gen_ai.GEN_AI_RESPONSE_FINISH_REASONS,),
    "ATTR_INPUT_TOKENS": (gen_ai.GEN_AI_USAGE_INPUT_TOKENS,),
    "ATTR_OUTPUT_TOKENS": (gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS,),
    "ATTR_INPUT_MESSAGES": (gen_ai.GEN_AI_INPUT_MESSAGES,),
    "ATTR_OUTPUT_MESSAGES": (gen_ai.GEN_AI_OUTPUT_MESSAGES,),
    "ATTR_SYSTEM_INSTRUCTIONS": (gen_ai.GEN_AI_SYSTEM_INSTRUCTIONS,),
    "ATTR_TOOL_DEFINITIONS": (gen_ai.GEN_AI_TOOL_DEFINITIONS,),
    "ATTR_TOOL_NAME": (gen_ai.GEN_AI_TOOL_NAME,),
    "ATTR_TOOL_CALL_ID": (gen_ai.GEN_AI_TOOL_CALL_ID,),
    "ATTR_TOOL_TYPE": (gen_ai.GEN_AI_TOOL_TYPE,),
    "ATTR_TOOL_CALL_ARGUMENTS": (gen_ai.GEN_AI_TOOL_CALL_ARGUMENTS,),
    "ATTR_TOOL_CALL_RESULT": (gen_ai.GEN_AI_TOOL_CALL_RESULT,),
    # OpenTelemetry HTTP, URL, error, network (stable)
    "ATTR_HTTP_METHOD": (http.HTTP_REQUEST_METHOD,),
    "ATTR_HTTP_METHOD_ORIGINAL": (http.HTTP_REQUEST_METHOD_ORIGINAL,),
    "ATTR_HTTP_RESEND_COUNT": (http.HTTP_REQUEST_RESEND_COUNT,),
    "ATTR_HTTP_ROUTE": (http.HTTP_ROUTE,),
    "ATTR_HTTP_STATUS": (http.HTTP_RESPONSE_STATUS_CODE,),
    "ATTR_URL_PATH": (url.URL_PATH,),
    "ATTR_ERROR_TYPE": (error.ERROR_TYPE,),
    "ATTR_NETWORK_TRANSPORT": (network.NETWORK_TRANSPORT,),
    # OpenTelemetry MCP (development)
    "ATTR_MCP_METHOD_NAME": (mcp.MCP_METHOD_NAME,),
    "ATTR_MCP_PROTOCOL_VERSION": (mcp.MCP_PROTOCOL_VERSION,),
    # OpenTelemetry session (development) and OpenInference: Phoenix's sessions, Langfuse's too
    "ATTR_SESSION_ID": (session.SESSION_ID, SpanAttributes.SESSION_ID),
    # OpenInference
    "ATTR_OPENINFERENCE_SPAN_KIND": (SpanAttributes.OPENINFERENCE_SPAN_KIND,),
    "ATTR_INPUT_VALUE": (SpanAttributes.INPUT_VALUE,),
    "ATTR_INPUT_MIME_TYPE": (SpanAttributes.INPUT_MIME_TYPE,),
    "ATTR_OUTPUT_VALUE": (SpanAttributes.OUTPUT_VALUE,),
    "ATTR_OUTPUT_MIME_TYPE": (SpanAttributes.OUTPUT_MIME_TYPE,),
    "ATTR_OI_TOOL_NAME": (SpanAttributes.TOOL_NAME,),
    "ATTR_OI_TOOL_PARAMETERS": (SpanAttributes.TOOL_PARAMETERS,),
}

# Conventional names the pinned conventions do not have yet: each says where it comes from. When a
# release adds one, test_not_yet_is_not_there fails and the name moves to CONVENTIONAL.
NOT_IN_CONVENTIONS_YET: dict[str, str] = {
    "EVENT_TOOL_DECISION": "gen_ai.tool.call.decision: the proposed GenAI event for an approval decision (an open "
                           "semantic-conventions proposal), the tool.call span's event until it settles",
    "ATTR_EVENT_DECISION": "that proposed event's attribute, of the same name",
}

# toolspan's own names under a conventional prefix: not attribute keys of any convention.
OWN_NAMES: dict[str, str] = {
    "SPAN_TOOL_CALL": "a span name (DESIGN.md's tool.call); the GenAI conventions would call an execute_tool span "
                      "'execute_tool {tool}', and span names are not attribute keys",
    "SPAN_TOOL_PARSE": "the tool.call span's parse step, a span name",
    "SPAN_TOOL_EXECUTE": "the tool.call span's execute step, a span name",
}

# gen_ai.provider.name values toolspan gives upstream kinds the GenAI conventions list no provider for
# (each a custom value, as the conventions allow for providers they do not name).
PROVIDERS_NOT_IN_CONVENTIONS = {
    "vllm": "a vLLM server",
    "ollama": "an Ollama server",
    "openai_compatible": "any other server of OpenAI's API",
}


def _under_conventional_prefix() -> dict[str, str]:
    """Every constant of names.py whose value is a name under a conventional prefix."""
    return {name: value for name, value in vars(names).items()
            if name.isupper() and isinstance(value, str) and value.startswith(CONVENTIONAL_PREFIXES)}


def _convention_names() -> set[str]:
    """Every name the pinned conventions define (the attribute modules above and OpenInference's)."""
    found = {value for module in CONVENTION_MODULES for key, value in vars(module).items()
             if key.isupper() and isinstance(value, str)}
    return found | {value for key, value in vars(SpanAttributes).items() if key.isupper() and isinstance(value, str)}


@pytest.mark.parametrize(("ours", "theirs"), sorted(CONVENTIONAL.items()), ids=sorted(CONVENTIONAL))
def test_each_name_is_the_conventions_own(ours: str, theirs: tuple[str, ...]) -> None:
    value = getattr(names, ours, None)
    assert value is not None, f"telemetry/names.py has no {ours}"
    for conventional in theirs:
        assert value == conventional, f"names.{ours} is {value!r}; the pinned convention says {conventional!r}"


def test_no_conventional_name_goes_unchecked() -> None:
    listed = CONVENTIONAL.keys() | NOT_IN_CONVENTIONS_YET.keys() | OWN_NAMES.keys()
    unchecked = {name: value for name, value in _under_conventional_prefix().items() if name not in listed}
    assert not unchecked, ("names under a conventional prefix in no table of this test (CONVENTIONAL if the "
                           f"conventions have them, NOT_IN_CONVENTIONS_YET with a reason if not): {unchecked}")


def test_the_tables_name_what_names_py_has() -> None:
    """A table entry for a constant names.py no longer has would check nothing."""
    stale = sorted(name for name in NOT_IN_CONVENTIONS_YET.keys() | OWN_NAMES.keys() if not hasattr(names, name))
    assert not stale, f"in this test's tables but not in telemetry/names.py: {stale}"


@pytest.mark.parametrize("name", sorted(NOT_IN_CONVENTIONS_YET))
def test_not_yet_is_not_there(name: str) -> None:
    value = getattr(names, name)
    assert value not in _convention_names(), f"the pinned conventions now have {value!r}: move {name} to CONVENTIONAL"


@pytest.mark.parametrize(("ours", "theirs"), [
    ("OPERATION_CHAT", gen_ai.GenAiOperationNameValues.CHAT),
    ("OPERATION_EXECUTE_TOOL", gen_ai.GenAiOperationNameValues.EXECUTE_TOOL),
    ("OPERATION_INVOKE_AGENT", gen_ai.GenAiOperationNameValues.INVOKE_AGENT),
    ("TOKEN_INPUT", gen_ai.GenAiTokenTypeValues.INPUT),  # the `type` label of the token metric: gen_ai.token.type's
    ("TOKEN_OUTPUT", gen_ai.GenAiTokenTypeValues.OUTPUT),
    ("HTTP_METHOD_OTHER", http.HttpRequestMethodValues.OTHER),
    ("SPAN_KIND_AGENT", OpenInferenceSpanKindValues.AGENT),
    ("SPAN_KIND_TOOL", OpenInferenceSpanKindValues.TOOL),
    ("SPAN_KIND_LLM", OpenInferenceSpanKindValues.LLM),
    ("MIME_JSON", OpenInferenceMimeTypeValues.JSON),
    ("MIME_TEXT", OpenInferenceMimeTypeValues.TEXT),
])
def test_each_value_is_the_conventions_own(ours: str, theirs: Enum) -> None:
    value = getattr(names, ours, None)
    assert value is not None, f"telemetry/names.py has no {ours}"
    assert value == theirs.value, f"names.{ours} is {value!r}; the pinned convention says {theirs.value!r}"


def test_known_http_methods_are_the_conventions() -> None:
    known = {method.value for method in http.HttpRequestMethodValues} - {http.HttpRequestMethodValues.OTHER.value}
    assert known == names.HTTP_METHODS


def test_the_mcp_tool_call_method_is_the_conventions() -> None:
    assert mcp.McpMethodNameValues.TOOLS_CALL.value == METHOD_CALL_TOOL


def test_provider_names_are_the_conventions_or_listed() -> None:
    conventional = {provider.value for provider in gen_ai.GenAiProviderNameValues}
    own = set(PROVIDER_NAMES.values()) - conventional
    assert own == PROVIDERS_NOT_IN_CONVENTIONS.keys(), (
        f"gen_ai.provider.name values the conventions do not list: {sorted(own)}")
