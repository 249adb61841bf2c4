"""Property (issue 59): a credential the `secrets` guardrail masks leaves no trace past the gateway.

For any credential of the kinds the built-in detects, set in any text, returned by a gateway tool
(as its result or in its error) and brought back as the result of a client's own tool, through
any API, streamed or not: nothing the provider receives, no span (attributes, events, status), no
decision log record exported over OTLP, no log line and no row of the trajectory store holds it.
Message capture and recorded arguments are on, so every place that could hold it is written."""

from __future__ import annotations

import json
import logging
import sqlite3
import string
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import ReadableSpan

from gateway.demo.model import Reply
from gateway.tools import ToolError, ToolRegistry, tool
from tests.conftest import StackFactory
from tests.e2e.otlp import Receiver
from tests.e2e.test_guardrails_client import CONVERSATIONS

ALNUM = string.ascii_letters + string.digits
UPPER = string.ascii_uppercase + string.digits


def token(prefix: str, alphabet: str, size: int) -> st.SearchStrategy[str]:
    return st.text(alphabet, min_size=size, max_size=size).map(lambda body: prefix + body)


# Credentials of the shapes providers issue (made up here: none of them is live).
SECRETS = st.one_of(
    token("AKIA", UPPER, 16),  # an AWS access key id
    token("ghp_", ALNUM, 36),  # a GitHub personal access token
    token("github_pat_", ALNUM + "_", 82),  # a fine-grained GitHub token
    token("xoxb-", string.digits, 12).flatmap(lambda head: token(head + "-", ALNUM, 24)),  # a Slack bot token
    token("sk_live_", ALNUM, 24),  # a Stripe secret key
    token("glpat-", ALNUM, 20),  # a GitLab token
)
# Words around the credential; a line of its own, so that the text cannot run into it.
AROUND = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=30)
APIS = st.sampled_from(sorted(CONVERSATIONS))
GATEWAY_LOGGERS = ("toolspan", "gateway", "telemetry", "aiohttp")


def page_tool(page: dict[str, str]) -> ToolRegistry:
    """A gateway tool whose result (or error) is the example's text."""
    @tool
    def fetch_page(url: str) -> str:
        """Fetch a web page."""
        if page["fails"]:
            raise ToolError(f"could not parse the page: {page['text']}")
        return page["text"]

    return ToolRegistry([fetch_page])


def span_text(span: ReadableSpan) -> str:
    """Everything a span says, as text."""
    events = [(e.name, dict(e.attributes or {})) for e in span.events]
    return json.dumps([span.name, dict(span.attributes or {}), events, span.status.description], default=str)


def store_text(path: Any) -> str:
    with sqlite3.connect(path) as db:
        return "\n".join(db.iterdump())


@pytest.fixture
def once() -> dict[str, Any]:
    """What the examples share: one gateway for them all."""
    return {}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(secret=SECRETS, before=AROUND, after=AROUND, api=APIS, stream=st.booleans(), fails=st.booleans())
async def test_a_masked_secret_reaches_no_provider_span_record_log_or_row(
        make_stack: StackFactory, receiver: tuple[Receiver, str], once: dict[str, Any],
        caplog: pytest.LogCaptureFixture, secret: str, before: str, after: str, api: str, stream: bool,
        fails: bool) -> None:
    if not once:
        page: dict[str, Any] = {"text": "", "fails": False}
        caplog.set_level(logging.DEBUG)
        stack = await make_stack(page_tool(page), guardrails=["secrets"], capture_message_content=True,
                                 record_tool_arguments=True, otel_logs_exporter="otlp",
                                 otel_exporter_otlp_endpoint=receiver[1])
        once.update(stack=stack, page=page)
    stack, page = once["stack"], once["page"]
    text = f"{before}\n{secret}\n{after}"
    page.update(text=text, fails=fails)
    stack.script.then(Reply(tool_calls=[("fetch_page", {"url": "https://example.com/a"})]),
                      Reply(tool_calls=[("read_env", {"name": "DEPLOY_KEY"})]),
                      Reply(content="done"))
    conversation = CONVERSATIONS[api](stack, stream)
    [(call_id, name, _)] = (await conversation.turn())[0]
    assert name == "read_env"
    conversation.answer(call_id, text)
    assert (await conversation.turn())[1] == "done"

    assert secret not in json.dumps(stack.upstream_requests)
    assert "[REDACTED]" in json.dumps(stack.upstream_requests[-1])  # it was there, masked
    assert not [span.name for span in stack.spans() if secret in span_text(span)]
    exported, _ = receiver
    assert stack.observability.provider is not None
    assert stack.observability.log_provider is not None
    stack.observability.provider.force_flush()
    stack.observability.log_provider.force_flush()
    assert exported.spans, "no spans arrived over OTLP"
    assert exported.records, "no decision records arrived over OTLP"
    assert not [s.name for s in exported.spans if secret.encode() in s.SerializeToString()]
    assert not [r for r in exported.records if secret.encode() in r.SerializeToString()]
    # the gateway's lines (the clients' own debug lines show what they sent, the secret included)
    lines = [r.getMessage() for r in caplog.records if r.name.startswith(GATEWAY_LOGGERS)]
    assert lines
    assert not [line for line in lines if secret in line]
    await stack.store.flushed()
    assert secret not in store_text(stack.store.path)
