"""Schemathesis against a live gateway: every route of /openapi.json fuzzed, with bodies that fit
the document and bodies that do not. No answer may be a 5xx, every error must be in its API's shape
(OpenAI's; Anthropic's on /v1/messages),
every response must fit the document, every request must leave its span, and the gateway must
be healthy afterwards, with nothing left in flight."""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client.parser import text_string_to_metric_families
from schemathesis import GenerationMode, checks

from gateway.instrumentation import PROBE_ROUTES
from gateway.runtime.process import gateway
from gateway.settings.model import Settings
from telemetry import names

EXAMPLES_PER_OPERATION = 60  # per operation, of each generation mode: about 600 requests in all


@dataclass
class LiveGateway:
    """`toolspan serve` with the built-in model, on its own event loop in a thread, so that a
    blocking client (Schemathesis speaks `requests`) can call it."""

    url: str = ""
    exporter: InMemorySpanExporter = field(default_factory=InMemorySpanExporter)

    def server_spans(self) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.kind is SpanKind.SERVER]


@pytest.fixture
def live_gateway() -> Iterator[LiveGateway]:
    live = LiveGateway()
    started = threading.Event()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def serve() -> None:
        async with gateway(Settings(port=0), processors=[SimpleSpanProcessor(live.exporter)]) as (url, _, _):
            live.url = url
            started.set()
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert started.wait(30), "the gateway did not start"
    yield live
    loop.call_soon_threadsafe(stop.set)
    thread.join(30)
    loop.close()


def _is_openai_error(body: object) -> bool:
    error = body.get("error") if isinstance(body, dict) else None
    return (isinstance(error, dict) and isinstance(error.get("message"), str) and error["message"] != ""
            and isinstance(error.get("type"), str) and {"param", "code"} <= error.keys())


def _is_anthropic_error(body: object) -> bool:
    error = body.get("error") if isinstance(body, dict) else None
    return (isinstance(body, dict) and body.get("type") == "error" and isinstance(error, dict)
            and isinstance(error.get("type"), str) and isinstance(error.get("message"), str) and error["message"] != "")


def _in_flight(metrics_text: str) -> float:
    return sum(sample.value for family in text_string_to_metric_families(metrics_text)
               if family.name == names.METRIC_REQUESTS_IN_FLIGHT for sample in family.samples)


def test_every_route_fuzzed_without_a_server_error(live_gateway: LiveGateway) -> None:
    schema = schemathesis.openapi.from_url(f"{live_gateway.url}/openapi.json")
    statuses: Counter[tuple[str, int]] = Counter()
    session = requests.Session()
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/chat/completions", "/v1/responses", "/v1/messages",
                                              "/v1/tools/{name}/invoke"}
    for operation in operations:
        cases = st.one_of(operation.as_strategy(GenerationMode.POSITIVE),
                          operation.as_strategy(GenerationMode.NEGATIVE))

        @settings(max_examples=2 * EXAMPLES_PER_OPERATION, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(cases)
        def fuzz(case: schemathesis.Case) -> None:
            response = case.call(session=session, timeout=30)
            statuses[(f"{case.method} {case.path}", response.status_code)] += 1
            case.validate_response(response, checks=[checks.not_a_server_error, checks.status_code_conformance,
                                                     checks.content_type_conformance,
                                                     checks.response_schema_conformance])
            if response.status_code >= 400:
                shaped = _is_anthropic_error if case.path == "/v1/messages" else _is_openai_error
                assert shaped(response.json()), response.text

        fuzz()

    sent = sum(statuses.values())
    assert sent >= 300, statuses
    assert not [key for key in statuses if key[1] >= 500]
    assert any(status == 200 for (_, status) in statuses)
    assert any(400 <= status < 500 for (_, status) in statuses)
    # Healthy afterwards and nothing left in flight (so every request's span has ended); one request
    # span for every request sent but the probes (which make none, nor count: PROBE_ROUTES), and for
    # the document.
    assert session.get(f"{live_gateway.url}/healthz").status_code == 200
    assert session.get(f"{live_gateway.url}/readyz").status_code == 200
    assert _in_flight(session.get(f"{live_gateway.url}/metrics").text) == 0  # the scrape is not counted either
    probes = sum(count for (operation, _), count in statuses.items() if operation.split()[1] in PROBE_ROUTES)
    assert len(live_gateway.server_spans()) == sent - probes + 1
    by_status = Counter(status for (_, status) in statuses.elements())
    print(json.dumps({"requests": sent, "operations": len(operations), "statuses": dict(sorted(by_status.items()))}))
