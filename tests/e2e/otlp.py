"""A real OTLP/HTTP endpoint for the tests: decodes the protobuf exports of spans (/v1/traces) and
log records (/v1/logs) the gateway sends. It runs on its own thread and loop, as a collector would:
the SDK exports synchronously (on flush and on shutdown), which must not wait on the loop the
gateway runs on."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest, ExportLogsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord as ProtoLogRecord
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan

from gateway.runtime.process import serving


@dataclass
class Receiver:
    """What arrived: spans, log records, and the content types they came as."""

    spans: list[ProtoSpan] = field(default_factory=list)
    records: list[ProtoLogRecord] = field(default_factory=list)
    received: threading.Event = field(default_factory=threading.Event)
    content_types: list[str] = field(default_factory=list)

    async def wait(self) -> None:
        assert await asyncio.to_thread(self.received.wait, 10), "no spans arrived over OTLP"

    async def traces(self, request: web.Request) -> web.Response:
        export = ExportTraceServiceRequest()
        export.ParseFromString(await request.read())
        self.content_types.append(request.content_type)
        for resource_spans in export.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                self.spans.extend(scope_spans.spans)
        self.received.set()
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    async def logs(self, request: web.Request) -> web.Response:
        export = ExportLogsServiceRequest()
        export.ParseFromString(await request.read())
        for resource_logs in export.resource_logs:
            for scope_logs in resource_logs.scope_logs:
                self.records.extend(scope_logs.log_records)
        return web.Response(body=ExportLogsServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    def named(self, name: str) -> list[ProtoSpan]:
        return sorted((s for s in self.spans if s.name == name), key=lambda s: s.start_time_unix_nano)


def attrs(item: ProtoSpan | ProtoLogRecord) -> dict[str, Any]:
    """A span's or a log record's attributes, as plain values (an array as a list of strings)."""
    return {kv.key: _plain(kv) for kv in item.attributes}


def _plain(kv: KeyValue) -> Any:
    value = kv.value
    kind = value.WhichOneof("value")
    return list(v.string_value for v in value.array_value.values) if kind == "array_value" else getattr(value, kind)


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, str]]:
    """A Receiver serving on loopback, and its base URL."""
    found = Receiver()
    app = web.Application()
    app.router.add_post("/v1/traces", found.traces)
    app.router.add_post("/v1/logs", found.logs)
    loop = asyncio.new_event_loop()
    ready: concurrent.futures.Future[str] = concurrent.futures.Future()
    stop = asyncio.Event()

    async def serve() -> None:
        async with serving(app, "127.0.0.1", 0) as url:
            ready.set_result(url)
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    yield found, ready.result(timeout=10)
    loop.call_soon_threadsafe(stop.set)
    thread.join(timeout=10)
    loop.close()
