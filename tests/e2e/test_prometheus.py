"""The dashboards against a real Prometheus scraping a real gateway.

A Prometheus (Debian package `prometheus`, installed by .ci/run) scrapes the gateway every second
with exemplar storage on. A scripted session produces every tool outcome and both retry kinds;
then every PromQL expression of every dashboard panel must parse and return data (but the shared
state store's, which this gateway has none of: its panel reads "not configured"), and the
exemplars Prometheus stored must point at traces this test captured. A gateway on a real Redis
reads "reachable" there.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.demo.model import Reply
from gateway.guardrails import GuardedCall, Guardrail, Verdict, deny
from gateway.http.keys import APPROVALS
from gateway.tools import Tool
from telemetry import names
from tests.conftest import AUTH, TEST_KEY, USER, Stack, StackFactory, every_outcome_registry, free_port
from tests.dashboards import DASHBOARD_DIR, all_panels, load_dashboard, panel_querying, shown
from tests.e2e.redis_server import RedisServer
from tests.mcp.conftest import Recorded, lose_once, stdio_server

GRAFANA_VARIABLES = {"__rate_interval": "20s", "__interval": "5s", "__range": "5m", "__range_s": "300",
                     "__interval_ms": "5000"}
PROMETHEUS_TIMEOUT = aiohttp.ClientTimeout(total=10)  # one request to the Prometheus process


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(dashboard, panel title, PromQL) for every Prometheus target of every panel."""
    found = []
    for path in sorted(DASHBOARD_DIR.glob("*.json")):
        for panel in all_panels(load_dashboard(path)):
            for target in panel.get("targets", []):
                if target.get("expr"):
                    found.append((path.name, panel.get("title", ""), target["expr"]))
    return found


STATE_STORE_UP = f"min({names.METRIC_STATE_STORE_UP})"  # the query of the shared state store's panel


async def state_store_panel_reads(prometheus: str) -> str:
    """What the Tools dashboard's shared state store panel shows from this Prometheus now."""
    result = (await query(prometheus, STATE_STORE_UP))["data"]["result"]
    return shown(panel_querying(load_dashboard(DASHBOARD_DIR / "tools.json"), STATE_STORE_UP),
                 float(result[0]["value"][1]) if result else None)


def substitute(expr: str) -> str:
    """Grafana's variables as Grafana would fill them in; dashboard variables match everything."""
    def fill(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return GRAFANA_VARIABLES.get(name, ".*")
    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", fill, expr)


SESSION = [
    Reply(tool_calls=[("read_file", {"file_path": "a"}), ("crash", {}), ("locked", {}), ("slow", {}),
                      ("strict", {"path": "a"}), ("add", "{oops"), ("nope", {}), ("admin", {}),
                      ("checked", {"n": "7"}),  # schema_violation; its repair observed (the Aliases panel)
                      # guardrail_denied; then a result whose guardrail raises: withheld (a guardrail failure)
                      ("deploy", {"host": "prod"}), ("deploy", {"host": "staging"})],
          usage=(40, 12)),
    Reply(tool_calls=[("read_file", {"file_path": "a"})]),  # verbatim retry: rejected again
    # corrected retries (read_file's through an alias), recovered; and a tool that pauses for review: the
    # request waits for the reviewer
    Reply(tool_calls=[("read_file", {"filepath": "a"}), ("strict", {"path": "/a"}), ("review", {})]),
]
LOOKUP: Any = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}]
# A client tool whose schema names another document: the gateway never fetches it, and its calls go unchecked.
ELSEWHERE: Any = [{"type": "function", "function": {"name": "fetch", "parameters": {
    "type": "object", "properties": {"url": {"$ref": "http://127.0.0.1:9/url.json"}}}}}]
RESUMED = Reply(content="done", usage=(60, 20))  # the answer once the reviewer decided the paused call


@asynccontextmanager
async def scraping(tmp_path: Path, stack: Stack) -> AsyncIterator[str]:
    """A Prometheus scraping `stack`'s gateway every second, until the block ends; its URL."""
    binary = shutil.which("prometheus")
    assert binary, "the prometheus binary is missing: .ci/run installs the Debian package 'prometheus'"
    target = stack.url.removeprefix("http://")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"scrape_configs:\n  - job_name: toolspan\n    static_configs:\n      - targets: ['{target}']\n")
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}", "--enable-feature=exemplar-storage",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        await _until(lambda body: True, url + "/-/ready", process, raw=True)
        yield url
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 20)


@pytest.fixture
async def prometheus(tmp_path: Path, stack_with_tools: Stack) -> AsyncIterator[str]:
    async with scraping(tmp_path, stack_with_tools) as url:
        yield url


class NoProduction(Guardrail):
    """Denies a deploy to production; fails on every result (a bug of its own): the Guardrails panels."""

    name = "no_production"

    def before_execute(self, call: GuardedCall) -> Verdict | None:
        return deny("production is off limits") if call.arguments.get("host") == "prod" else None

    def after_execute(self, call: GuardedCall, result: str) -> Verdict | None:
        raise ValueError("a guardrail with a bug")


@pytest.fixture
async def stack_with_tools(make_stack: StackFactory, tmp_path: Path) -> Stack:
    registry = every_outcome_registry()
    registry.register(Tool(name="deploy", function=lambda args: "deployed", guardrails=(NoProduction(),)))
    allowed = [name for name in registry.names() if name != "admin"]  # so that not_allowed happens too
    # An MCP server too, for the MCP panels (test_every_dashboard_query_returns_data loses it once).
    mcp = stdio_server(Recorded(tmp_path / "mcp.jsonl"), reconnect_min_seconds=0.05, ping_interval_seconds=0)
    # A second upstream that cannot be reached, for the model `fallible`, falling back to the scripted
    # one (the upstream named default): the Upstreams panels.
    flaky = {"url": f"http://127.0.0.1:{free_port()}/v1", "kind": "compatible", "models": ["fallible"],
             "fallbacks": ["default"]}
    # A key of one request a minute: the Limits panels.
    keys = {"tester": {"key": TEST_KEY, "tools": allowed, "approver": True},
            "limited": {"key": LIMITED_KEY, "requests_per_minute": 1}}
    # An alias of read_file's path, and checked's repairs observed: the panel of aliases and repairs.
    return await make_stack(registry=registry, keys=keys,
                            mcp_servers={"files": mcp}, upstreams={"flaky": flaky},
                            tool_aliases={"read_file": {"path": ["filepath"]}},
                            tool_argument_repair={"checked": "observe"},
                            upstream_kind="openai")  # no Messages: a Messages request is translated


LIMITED_KEY = "sk-limited-key-001"


async def _until(check: Any, url: str, process: asyncio.subprocess.Process | None = None, *, raw: bool = False,
                 params: dict[str, str] | None = None, seconds: float = 60.0) -> Any:
    """GET `url` until `check(json)` holds. Prometheus is a separate process that scrapes on its own
    clock, so there is nothing to await but the data itself: this polls, bounded by `seconds`, and
    fails naming what it waited for. (Nothing here polls the gateway: its spans and metrics are
    recorded by the time a response has been read.)"""
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession(timeout=PROMETHEUS_TIMEOUT) as http:
        while True:
            if process is not None and process.returncode is not None:
                stderr = (await process.stderr.read()).decode() if process.stderr else ""
                raise AssertionError(f"prometheus exited: {stderr[-2000:]}")
            try:
                async with http.get(url, params=params) as response:
                    if response.status == 200:
                        body = await (response.text() if raw else response.json())
                        if check(body):
                            return body
            except aiohttp.ClientError:
                pass
            assert time.monotonic() < deadline, f"gave up waiting on {url} {params}"
            await asyncio.sleep(0.25)


async def query(prometheus: str, expr: str) -> dict[str, Any]:
    # Prometheus is not an aiohttp app of this test: a plain session to its real port.
    async with aiohttp.ClientSession(timeout=PROMETHEUS_TIMEOUT) as http, \
            http.get(prometheus + "/api/v1/query", params={"query": expr}) as response:
        body: dict[str, Any] = await response.json()
        return body


def total(body: dict[str, Any]) -> float:
    return sum(float(sample["value"][1]) for sample in body["data"]["result"])


async def review(stack: Stack, decision: str) -> None:
    """The reviewer: decides the first approval to be asked, as soon as it is."""
    approvals = stack.http.server.app[APPROVALS]
    async with asyncio.timeout(30):
        await _review(stack, approvals, decision)


async def _review(stack: Stack, approvals: Any, decision: str) -> None:
    while True:
        changed = approvals.next_change()
        listed = await (await stack.http.get("/v1/approvals", headers=AUTH)).json()
        if listed["data"]:
            decided = await stack.http.post(f"/v1/approvals/{listed['data'][0]['id']}", headers=AUTH,
                                            json={"decision": decision, "output": "approved"})
            assert decided.status == 200
            return
        await changed.wait()


async def run_session(stack: Stack, prometheus: str) -> set[str]:
    """Runs the scripted session twice (so counters increase between scrapes), its paused call
    approved the first time and denied the second; returns trace ids."""
    traces = set()
    for rounds in range(2):
        stack.script.then(*SESSION, RESUMED, Reply(status=500, error="provider down"))
        trajectory = {"X-Trajectory-Id": f"run-{rounds}"}
        asking = stack.client.chat.completions.with_raw_response.create(model="m", messages=USER,
                                                                        extra_headers=trajectory)
        raw, _ = await asyncio.gather(asking, review(stack, "deny" if rounds else "approve"))
        traces.add(raw.headers["x-trace-id"])
        assert raw.parse().choices[0].message.content == "done"
        for body in (b"{not json", json.dumps({"model": "m", "messages": USER}).encode()):  # a 400, a 502
            async with stack.http.post("/v1/chat/completions", data=body,
                                       headers={**AUTH, "Content-Type": "application/json"}) as response:
                assert response.status in (400, 502)
        # A call of the client's own tool, handed back, and its result in the next request.
        stack.script.then(Reply(tool_calls=[("lookup", {})]), Reply(content="found"))
        first = await stack.client.chat.completions.create(model="m", messages=USER, tools=LOOKUP,
                                                           extra_headers=trajectory)
        [call] = first.choices[0].message.tool_calls or []
        handed = [*USER, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                  {"role": "tool", "tool_call_id": call.id, "content": "it is there"}]
        await stack.client.chat.completions.create(model="m", messages=handed, tools=LOOKUP, extra_headers=trajectory)
        # A call of a client tool whose schema the gateway does not follow (remote_ref).
        stack.script.then(Reply(tool_calls=[("fetch", {"url": "x"})]))
        await stack.client.chat.completions.create(model="m", messages=USER, tools=ELSEWHERE, extra_headers=trajectory)
        # A provider failure after a gateway tool ran, which the gateway retries itself.
        stack.script.then(Reply(tool_calls=[("add", {"a": 1, "b": 2})]), Reply(status=500, error="a blip"),
                          Reply(content="3"))
        await stack.client.chat.completions.create(model="m", messages=USER, extra_headers=trajectory)
        # A call to an upstream that is down, answered by its fallback.
        stack.script.then(Reply(content="from the fallback"))
        await stack.client.chat.completions.create(model="fallible", messages=USER, extra_headers=trajectory)
        # A Messages request, which the OpenAI upstream is asked in Chat Completions.
        stack.script.then(Reply(content="translated"))
        async with stack.http.post("/v1/messages", json={"model": "m", "max_tokens": 64, "messages": USER},
                                   headers={**AUTH, **trajectory}) as translated:
            assert translated.status == 200, await translated.text()
        # A key past its requests per minute: the second of these is refused (both, the second time).
        if rounds == 0:  # within the same minute, the second time through has no request left
            stack.script.then(Reply(content="limited"))
        for _ in range(2):
            async with stack.http.post("/v1/chat/completions", json={"model": "m", "messages": USER},
                                       headers={"Authorization": f"Bearer {LIMITED_KEY}"}) as limited:
                assert limited.status in (200, 429)
        expected = 18 * (rounds + 1)
        await _until(lambda body, n=expected: total(body) >= n, prometheus + "/api/v1/query",
                     params={"query": f"sum({names.METRIC_TOOL_CALLS})"})
    return traces


async def test_every_dashboard_query_returns_data(stack_with_tools: Stack, prometheus: str, tmp_path: Path) -> None:
    stack = stack_with_tools
    await lose_once(stack, Recorded(tmp_path / "mcp.jsonl"))
    traces = await run_session(stack, prometheus)
    outcomes = await query(prometheus, f"sum by (outcome) ({names.METRIC_TOOL_CALLS})")
    assert {s["metric"]["outcome"] for s in outcomes["data"]["result"]} == {
        "ok", "error", "rejected", "timeout", "denied", "unchecked"}
    reasons = await query(prometheus, f"sum by (reason) ({names.METRIC_TOOL_REJECTIONS})")
    assert {s["metric"]["reason"] for s in reasons["data"]["result"]} == set(names.REJECTION_REASONS)
    kinds = await query(prometheus, f"sum by (kind) ({names.METRIC_TOOL_RETRIES})")
    assert {s["metric"]["kind"] for s in kinds["data"]["result"]} == {"verbatim", "corrected"}

    queries = dashboard_queries()
    assert len(queries) >= 15, "the dashboards should hold a panel per operator question"
    empty = []
    for dashboard, title, expr in queries:
        body = await query(prometheus, substitute(expr))
        assert body["status"] == "success", f"{dashboard} / {title}: {expr}: {body.get('error')}"
        if not body["data"]["result"]:
            empty.append((f"{dashboard} / {title}", expr))
    # No Redis here: the gateway exports no toolspan_state_store_up, which its panel reads as such.
    assert [expr for _, expr in empty] == [STATE_STORE_UP], empty
    assert await state_store_panel_reads(prometheus) == "not configured"

    spans = {format(s.context.trace_id, "032x") for s in stack.spans()}
    assert traces <= spans
    now = time.time()
    exemplars = await _until(
        lambda body: bool(body["data"]), prometheus + "/api/v1/query_exemplars",
        params={"query": names.METRIC_TOOL_CALL_DURATION + "_bucket", "start": str(now - 600), "end": str(now + 60)})
    seen = {e["labels"][names.EXEMPLAR_TRACE_ID] for series in exemplars["data"] for e in series["exemplars"]}
    assert seen
    assert seen <= spans  # every exemplar opens a trace this gateway really recorded


async def test_the_state_store_panel_reads_reachable_on_redis(make_stack: StackFactory, redis_up: RedisServer,
                                                              tmp_path: Path) -> None:
    stack = await make_stack(state_url=redis_up.url)
    ready = await stack.http.get("/readyz")  # which asks Redis
    assert await ready.json() == {"status": "ready", "state_store": "up"}
    async with scraping(tmp_path, stack) as prometheus:
        await _until(lambda body: bool(body["data"]["result"]), prometheus + "/api/v1/query",
                     params={"query": STATE_STORE_UP})
        assert await state_store_panel_reads(prometheus) == "reachable"
