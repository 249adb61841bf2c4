"""What a plain request's spans and metrics cost, against the OpenTelemetry SDK's own start and end
of the same two spans plus the same metric updates (issue 14: "telemetry at the cost of the SDK").

Per request, in one process and one run, with the same tracer provider (a BatchSpanProcessor to an
exporter that drops the spans) and a fresh prometheus_client registry for each side:
- sdk:  the floor. The SERVER span started and made current, the `chat` CLIENT span started as
        its child and its trace context written into the provider request's headers by the SDK's
        propagators, each given the attributes toolspan records, ended; then the metric updates a
        plain request makes, on label children looked up beforehand: in-flight up and down,
        requests, request duration, upstream requests, upstream duration, input and output tokens,
        tool rounds;
- ours: the gateway's Telemetry hooks as the gateway calls them: `request(...)` with its
        `chat(...)` inside, the trace context injected into the provider request's headers, the
        answer recorded, the request finished.
The sides take turns in each repeat; reported: CPU per request (all threads, so the batch
processor's export thread is counted on both sides), medians, and the ratio ours / sdk per repeat.
Target: <= 1.0.

    python bench/request_telemetry.py [--calls 5000] [--repeats 15]

Instructions instead of time (steady where CPU time is not, on a shared machine): each side alone
under callgrind, runs of 1000 and 5000 requests with PYTHONHASHSEED=0, the difference over 4000:

    python bench/request_telemetry.py --instructions [ours|sdk ...]
"""

from __future__ import annotations

import gc
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from contextvars import Token
from dataclasses import dataclass
from pathlib import Path

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, SpanKind, Tracer
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tool_pipeline import DropExporter, run_bench

from gateway.instrumentation import RequestInfo, RequestRecord
from telemetry import names
from telemetry.instrument import Telemetry
from telemetry.metrics import REQUEST_DURATION_BUCKETS, ROUND_BUCKETS, Metrics
from telemetry.tracing import INSTRUMENTATION_SCOPE, build_provider, tracer_of

ROUTE = "/v1/chat/completions"
MODEL = "bench-model"
TRAJECTORY = "019ad6f3a2c1" + "5" * 20
HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer sk-bench"}


@dataclass(frozen=True)
class Answer:  # a ModelAnswer
    api: str = "chat"
    output: tuple[()] = ()
    response_id: str | None = "chatcmpl-0123456789abcdef01234567"
    model: str | None = MODEL
    finish_reason: str | None = "stop"
    input_tokens: int | None = 31
    output_tokens: int | None = 1


ANSWER = Answer()


class SdkTelemetry:
    """What the OpenTelemetry SDK and prometheus_client alone do for a plain request: the SERVER span
    started and made current, the `chat` CLIENT span started as its child around the provider call,
    each ended with the attributes toolspan records, and the metric updates a plain request makes
    on prometheus_client's own metrics (named as toolspan's), on label children looked up
    beforehand. Used by `sdk_side` here and by bench/proxy.py's `floor-otel` target (the bare hop
    plus this)."""

    def __init__(self, tracer: Tracer, registry: CollectorRegistry) -> None:
        self._tracer = tracer
        # prometheus_client's own metrics, named and shaped as toolspan's.
        durations = {"buckets": REQUEST_DURATION_BUCKETS, "registry": registry}
        self._in_flight = Gauge(names.METRIC_REQUESTS_IN_FLIGHT, "in flight", registry=registry)
        self._requests = Counter(names.METRIC_REQUESTS, "requests", ("route", "status"),
                                 registry=registry).labels(ROUTE, "200")
        self._duration = Histogram(names.METRIC_REQUEST_DURATION, "duration", ("route",), **durations).labels(ROUTE)
        self._upstream = Counter(names.METRIC_UPSTREAM_REQUESTS, "upstream", ("model", "status"),
                                 registry=registry).labels(MODEL, "200")
        self._upstream_duration = Histogram(names.METRIC_UPSTREAM_DURATION, "upstream duration", ("model",),
                                            **durations).labels(MODEL)
        tokens = Counter(names.METRIC_TOKENS, "tokens", ("model", "type"), registry=registry)
        self._input_tokens = tokens.labels(MODEL, names.TOKEN_INPUT)
        self._output_tokens = tokens.labels(MODEL, names.TOKEN_OUTPUT)
        self._rounds = Histogram(names.METRIC_TOOL_ROUNDS, "rounds", buckets=ROUND_BUCKETS, registry=registry)

    def request(self) -> tuple[Span, Token[Context]]:
        server = self._tracer.start_span(f"POST {ROUTE}", kind=SpanKind.SERVER)
        token = otel_context.attach(trace.set_span_in_context(server))
        self._in_flight.inc()
        return server, token

    def chat(self) -> Span:
        return self._tracer.start_span(f"chat {MODEL}", kind=SpanKind.CLIENT)

    def inject(self, chat: Span, headers: dict[str, str]) -> None:
        """The chat span's trace context into the provider request's headers, by the SDK's
        propagators (W3C trace context and baggage), as toolspan writes it."""
        propagate.inject(headers, trace.set_span_in_context(chat))

    def chat_done(self, chat: Span, seconds: float) -> None:
        chat.set_attributes({
            names.ATTR_OPERATION_NAME: names.OPERATION_CHAT, names.ATTR_PROVIDER_NAME: "openai",
            names.ATTR_REQUEST_MODEL: MODEL, names.ATTR_REQUEST_STREAM: False,
            names.ATTR_RESPONSE_ID: ANSWER.response_id, names.ATTR_RESPONSE_MODEL: MODEL,
            names.ATTR_FINISH_REASONS: ["stop"], names.ATTR_INPUT_TOKENS: 31, names.ATTR_OUTPUT_TOKENS: 1})
        chat.end()
        self._input_tokens.inc(31)
        self._output_tokens.inc(1)
        self._upstream.inc()
        self._upstream_duration.observe(seconds)

    def request_done(self, server: Span, token: Token[Context], seconds: float) -> None:
        otel_context.detach(token)
        self._in_flight.dec()
        server.set_attributes({
            names.ATTR_HTTP_METHOD: "POST", names.ATTR_HTTP_ROUTE: ROUTE, names.ATTR_URL_PATH: ROUTE,
            names.ATTR_HTTP_STATUS: 200, names.ATTR_CONVERSATION_ID: TRAJECTORY, names.ATTR_ROUNDS: 1,
            names.ATTR_ROUND_LIMIT_REACHED: False})
        server.end()
        self._rounds.observe(1)
        self._requests.inc()
        self._duration.observe(seconds)


def sdk_side(tracer: Tracer, registry: CollectorRegistry) -> Callable[[], None]:
    sdk = SdkTelemetry(tracer, registry)

    def one() -> None:
        server, token = sdk.request()
        chat = sdk.chat()
        sdk.inject(chat, dict(HEADERS))
        sdk.chat_done(chat, 0.001)
        sdk.request_done(server, token, 0.002)

    return one


def our_side(tracer: Tracer, metrics: Metrics) -> Callable[[], None]:
    telemetry = Telemetry(tracer, metrics)
    info = RequestInfo("POST", ROUTE, ROUTE, HEADERS, TRAJECTORY)
    record = RequestRecord(TRAJECTORY, 1, False)

    def one() -> None:
        with telemetry.request(info) as request:
            with telemetry.chat(MODEL, False, "default", "openai") as chat:
                chat.inject(dict(HEADERS))
                chat.answered(ANSWER)
            request.finish(200, record)

    return one


def the_sides(provider: TracerProvider) -> dict[str, Callable[[], None]]:
    return {"sdk": sdk_side(provider.get_tracer(INSTRUMENTATION_SCOPE), CollectorRegistry()),  # the SDK's
            "ours": our_side(tracer_of(provider), Metrics(CollectorRegistry()))}


def run_one_side(side: str, calls: int) -> None:
    """`calls` requests of one side, and nothing else: what callgrind counts."""
    provider = build_provider()
    provider.add_span_processor(BatchSpanProcessor(DropExporter(), max_queue_size=2 * calls + 1024))
    one = the_sides(provider)[side]
    for _ in range(calls):
        one()
    provider.shutdown()


def instructions(side: str, calls: int) -> int:
    """The instructions callgrind counts for a process running `calls` requests of `side`."""
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__,
               "--one-side", side, str(calls)]
    done = subprocess.run(command, env={**os.environ, "PYTHONHASHSEED": "0"}, capture_output=True, text=True,
                          check=True)
    return int(re.findall(r"Collected : (\d+)", done.stderr)[-1])


def print_instructions(sides: list[str]) -> None:
    for side in sides or ["ours", "sdk"]:
        per_request = (instructions(side, 5000) - instructions(side, 1000)) / 4000
        print(f"  {side:4}  {per_request / 1000:6.1f} thousand instructions per request (callgrind)")


async def main(calls: int, repeats: int) -> None:
    provider = build_provider()
    provider.add_span_processor(BatchSpanProcessor(DropExporter(), max_queue_size=2 * calls + 1024))
    sides = the_sides(provider)
    cpu: dict[str, list[float]] = {name: [] for name in sides}
    for repeat in range(repeats + 1):  # the first round warms up
        for name, one in sides.items():
            provider.force_flush()
            gc.collect()
            started = time.process_time()
            for _ in range(calls):
                one()
            provider.force_flush()  # the export thread's share, inside the measurement
            if repeat:
                cpu[name].append((time.process_time() - started) / calls)
    provider.shutdown()
    ratios = [ours / sdk for ours, sdk in zip(cpu["ours"], cpu["sdk"], strict=True)]
    print(f"{calls} requests per run, {repeats} runs each; CPU per request (medians):")
    for name, values in cpu.items():
        print(f"  {name:4}  {statistics.median(values) * 1e6:6.1f} us")
    quartiles = statistics.quantiles(ratios, n=4)
    print(f"ours / sdk: median {statistics.median(ratios):.2f} (quartiles {quartiles[0]:.2f}-{quartiles[2]:.2f}); "
          "target <= 1.0")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one-side"]:
        run_one_side(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1:2] == ["--instructions"]:
        print_instructions(sys.argv[2:])
    else:
        run_bench(main, __doc__, calls=5000, repeats=15)
