"""Trajectories end to end: retries across rounds and requests, exported over real OTLP/HTTP."""

from __future__ import annotations

from openai import AsyncOpenAI

from gateway.demo.model import Reply
from gateway.runtime.process import gateway
from gateway.settings.model import Settings
from telemetry import names
from tests.conftest import TEST_KEY, USER, Script, Stack, StackFactory, sample_registry
from tests.e2e.otlp import Receiver, attrs


async def chat(stack: Stack, trajectory: str) -> str:
    raw = await stack.client.chat.completions.with_raw_response.create(
        model="m", messages=USER, extra_headers={"X-Trajectory-Id": trajectory})
    assert raw.headers["x-trajectory-id"] == trajectory
    return raw.headers["x-trace-id"]


async def test_retries_are_linked_and_exported_over_otlp(make_stack: StackFactory,
                                                         receiver: tuple[Receiver, str]) -> None:
    found, url = receiver
    stack = await make_stack(otel_exporter_otlp_endpoint=url, otel_service_name="toolspan-test")
    stack.script.then(
        Reply(tool_calls=[("read_file", {"file_path": "a"})]),  # 1 rejected
        Reply(tool_calls=[("read_file", {"file_path": "a"})]),  # 2 verbatim retry of 1, rejected
        Reply(tool_calls=[("read_file", {"path": "a"})]),  # 3 corrected retry of 2, ok
        Reply(content="read it"),
        Reply(tool_calls=[("add", {"a": 1})]),  # 4 rejected (second request, same trajectory)
        Reply(content="hm"),
        Reply(tool_calls=[("add", {"a": 1, "b": 2})]),  # 5 corrected retry of 4, across requests
        Reply(content="3"),
        Reply(tool_calls=[("add", {"a": 1, "b": 2})]),  # 6 other trajectory: not a retry
        Reply(content="3"),
    )
    traces = [await chat(stack, "agent-1"), await chat(stack, "agent-1"), await chat(stack, "agent-1"),
              await chat(stack, "agent-2")]
    provider = stack.observability.provider
    assert provider is not None
    assert provider.force_flush()
    await found.wait()

    assert found.content_types[0] == "application/x-protobuf"
    calls = found.named(names.SPAN_TOOL_CALL)
    assert [(attrs(s)[names.ATTR_TOOL_NAME], attrs(s)[names.ATTR_OUTCOME]) for s in calls] == [
        ("read_file", "rejected"), ("read_file", "rejected"), ("read_file", "ok"), ("add", "rejected"),
        ("add", "ok"), ("add", "ok")]
    assert attrs(calls[0])[names.ATTR_REJECTION_REASON] == "missing_arguments"
    assert attrs(calls[0])[names.ATTR_ARGS_SUGGESTIONS] == ["file_path->path"]
    assert [attrs(s).get(names.ATTR_RETRY_KIND) for s in calls] == [
        None, "verbatim", "corrected", None, "corrected", None]
    linked = [[(link.span_id, attrs(link).get(names.ATTR_RETRY_KIND)) for link in s.links] for s in calls]  # type: ignore[arg-type]
    assert linked == [[], [(calls[0].span_id, "verbatim")], [(calls[1].span_id, "corrected")], [],
                      [(calls[3].span_id, "corrected")], []]
    assert calls[4].trace_id != calls[3].trace_id  # the link crosses requests

    servers = {s.trace_id: s for s in found.named("POST /v1/chat/completions")}
    assert {s.trace_id.hex() for s in servers.values()} == set(traces)
    for call in calls:  # each tool.call hangs under its request's SERVER span
        assert call.parent_span_id == servers[call.trace_id].span_id
        assert attrs(call)[names.ATTR_CONVERSATION_ID] == attrs(servers[call.trace_id])[names.ATTR_CONVERSATION_ID]
    assert attrs(calls[5])[names.ATTR_CONVERSATION_ID] == "agent-2"

    assert stack.metric(names.METRIC_TOOL_RETRIES, tool="read_file", kind="verbatim") == 1
    assert stack.metric(names.METRIC_TOOL_RETRIES, tool="read_file", kind="corrected") == 1
    assert stack.metric(names.METRIC_TOOL_RETRIES, tool="add", kind="corrected") == 1
    assert stack.metric(names.METRIC_TOOL_RECOVERIES, tool="read_file", kind="corrected") == 1
    assert stack.metric(names.METRIC_TOOL_RECOVERIES, tool="add", kind="corrected") == 1


async def test_trajectory_can_be_named_in_metadata(stack: Stack) -> None:
    stack.script.then(Reply(tool_calls=[("add", {"a": 1})]), Reply(content="?"),
                      Reply(tool_calls=[("add", {"a": 1, "b": 1})]), Reply(content="2"))
    for _ in range(2):
        raw = await stack.client.chat.completions.with_raw_response.create(
            model="m", messages=USER, metadata={"trajectory_id": "from-metadata"})
        assert raw.headers["x-trajectory-id"] == "from-metadata"
    assert stack.metric(names.METRIC_TOOL_RETRIES, tool="add", kind="corrected") == 1


async def test_requests_without_a_trajectory_do_not_retry_each_other(stack: Stack) -> None:
    stack.script.then(Reply(tool_calls=[("add", {"a": 1})]), Reply(content="?"),
                      Reply(tool_calls=[("add", {"a": 1})]), Reply(content="?"))
    first = await stack.client.chat.completions.with_raw_response.create(model="m", messages=USER)
    second = await stack.client.chat.completions.with_raw_response.create(model="m", messages=USER)
    assert first.headers["x-trajectory-id"] != second.headers["x-trajectory-id"]
    assert stack.metric(names.METRIC_TOOL_RETRIES, tool="add", kind="verbatim") == 0


async def test_the_last_spans_are_flushed_on_shutdown(receiver: tuple[Receiver, str]) -> None:
    found, url = receiver
    script = Script().then(Reply(tool_calls=[("add", {"a": 1, "b": 2})]), Reply(content="3"))
    settings = Settings(port=0, otel_exporter_otlp_endpoint=url)
    # `gateway()` itself, not the fixtures: what is under test is that leaving it (as `toolspan serve` does)
    # shuts the tracer provider down, and the fixtures would do that only after the test.
    async with gateway(settings, sample_registry(), policy=script) as (gateway_url, _, _):
        async with AsyncOpenAI(base_url=f"{gateway_url}/v1", api_key=TEST_KEY, max_retries=0) as client:
            raw = await client.chat.completions.with_raw_response.create(model="m", messages=USER)
        assert not found.received.is_set()  # still in the batch: nothing forced it out yet
    await found.wait()  # leaving the gateway shut the provider down, which exported the batch
    trace_id = bytes.fromhex(raw.headers["x-trace-id"])
    assert {s.name for s in found.spans if s.trace_id == trace_id} == {
        "POST /v1/chat/completions", "chat m", "tool.call", "tool.parse", "tool.execute"}
