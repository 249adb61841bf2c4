"""A web page must not drive a gateway it can reach (issue 31, item 5): a keyless gateway on
loopback, sent what a browser sends for a cross-site page (a POST with a body type that needs no
preflight) and for a DNS-rebinding one (a foreign Host); the page's own forms, the configured
names, and the non-loopback default still get through. Two cases go through a real headless
Chromium: a page of another site, and a name re-pointed at the gateway."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp import web
from playwright.async_api import Browser
from pydantic import ValidationError
from pytest_aiohttp import AiohttpServer

from gateway.demo.model import Reply
from gateway.http.keys import SETTINGS
from gateway.settings.model import Settings
from gateway.tools import Param, Tool, ToolRegistry
from gateway.ui.pages import CONTENT_SECURITY_POLICY
from telemetry import names
from tests.conftest import AUTH, TEST_KEY, USER, Stack, StackFactory
from tests.e2e.test_faults import assert_openai_error

EVIL_PAGE = "https://evil.example"
# The three body types a page may post anywhere without asking first (CORS-safelisted).
SIMPLE_TYPES = ["text/plain;charset=UTF-8", "application/x-www-form-urlencoded", "multipart/form-data"]
INVOKE = "/v1/tools/write_note/invoke"
CHAT = "/v1/chat/completions"
ATTACK = {"arguments": {"text": "pwned"}}
CHAT_ATTACK = {"model": "m", "messages": [{"role": "user", "content": "write pwned"}]}


class Notes:
    """A tool with an effect: the notes it wrote are what a page would have made it do."""

    def __init__(self) -> None:
        self.written: list[str] = []

    def write(self, args: dict[str, Any]) -> str:
        self.written.append(str(args["text"]))
        return "written"

    def registry(self) -> ToolRegistry:
        return ToolRegistry([Tool(name="write_note", description="Write a note", function=self.write,
                                  parameters=[Param("text", "string", required=True)])])


@pytest.fixture
def notes() -> Notes:
    return Notes()


@pytest.fixture
async def local(make_stack: StackFactory, notes: Notes) -> Stack:
    """A gateway on loopback without keys: the one a developer runs on their machine."""
    stack = await make_stack(registry=notes.registry())
    assert stack.http.app is not None
    assert stack.http.app[SETTINGS].host == "127.0.0.1"  # the default
    return stack


def cross_site(content_type: str, origin: str = EVIL_PAGE) -> dict[str, str]:
    """What Chromium sends with `fetch(url, {method: "POST", mode: "no-cors", body})` from `origin`."""
    return {"Origin": origin, "Content-Type": content_type, "Sec-Fetch-Site": "cross-site",
            "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "empty", "Accept": "*/*"}


def rebound(stack: Stack, name: str = "evil.example") -> dict[str, str]:
    """What a DNS-rebinding page's own (same-origin) request carries: its name, the gateway's port."""
    return {"Host": f"{name}:{stack.http.port}", "Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors"}


async def post(stack: Stack, path: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, Any]:
    """The status and the answer (decoded when it is JSON, as the gateway's errors are)."""
    async with stack.http.post(path, data=json.dumps(body).encode(), headers=headers) as response:
        text = await response.text()
        return response.status, json.loads(text) if response.content_type == "application/json" else text


# --- cross-site posts --------------------------------------------------------------------------------

@pytest.mark.parametrize("content_type", SIMPLE_TYPES)
@pytest.mark.parametrize(("path", "body"), [(INVOKE, ATTACK), (CHAT, CHAT_ATTACK)], ids=["invoke", "chat"])
async def test_a_cross_site_post_runs_nothing(local: Stack, notes: Notes, path: str, body: dict[str, Any],
                                              content_type: str) -> None:
    local.script.then(Reply(tool_calls=[("write_note", {"text": "pwned"})]), Reply(content="done"))
    status, answer = await post(local, path, body, cross_site(content_type))
    assert status == 403
    error = assert_openai_error(answer, type_="permission_error", code="origin_not_allowed")
    assert EVIL_PAGE in error["message"]
    assert notes.written == []
    assert local.upstream_requests == []


@pytest.mark.parametrize("origin", ["null", "http://127.0.0.1:1", "https://127.0.0.1:{port}", "http://localhost:{port}"],
                         ids=["null", "other-port", "other-scheme", "other-name"])
async def test_an_origin_that_only_looks_local_is_foreign(local: Stack, notes: Notes, origin: str) -> None:
    """A sandboxed frame (Origin: null), another local server, the gateway's address over another
    scheme, and a name for the same address other than the one the request was sent to."""
    sent = origin.format(port=local.http.port)
    status, answer = await post(local, INVOKE, ATTACK, cross_site("text/plain;charset=UTF-8", sent))
    assert status == 403
    assert_openai_error(answer, type_="permission_error", code="origin_not_allowed")
    assert notes.written == []


@pytest.mark.parametrize("content_type", [*SIMPLE_TYPES, None], ids=["text", "form", "multipart", "none"])
@pytest.mark.parametrize(("path", "body"), [
    (INVOKE, ATTACK), (CHAT, CHAT_ATTACK), ("/v1/responses", {"model": "m", "input": "hi"}),
    ("/v1/tools/write_note/parse", ATTACK)], ids=["invoke", "chat", "responses", "parse"])
async def test_a_json_route_refuses_a_body_not_typed_json(local: Stack, notes: Notes, path: str,
                                                          body: dict[str, Any], content_type: str | None) -> None:
    """Without an Origin (a client that is not a browser, or one that left it out): a 415 naming the header."""
    local.script.then(Reply(tool_calls=[("write_note", {"text": "pwned"})]), Reply(content="done"))
    raw = json.dumps(body).encode()
    headers = {"Content-Type": content_type} if content_type else {}
    async with local.http.post(path, data=raw, headers=headers, skip_auto_headers=["Content-Type"]) as response:
        assert response.status == 415
        error = assert_openai_error(await response.json(), type_="invalid_request_error",
                                    code="unsupported_media_type")
    assert "Content-Type" in error["message"]
    assert notes.written == []
    assert local.upstream_requests == []


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "Application/JSON",
                                          "application/merge-patch+json"])
async def test_any_json_type_is_read(local: Stack, notes: Notes, content_type: str) -> None:
    status, answer = await post(local, INVOKE, ATTACK, {"Content-Type": content_type})
    assert (status, answer["status"]) == (200, "ok")
    assert notes.written == ["pwned"]


async def test_the_official_client_and_a_same_origin_page_still_work(local: Stack, notes: Notes) -> None:
    local.script.then(Reply(tool_calls=[("write_note", {"text": "from the client"})]), Reply(content="done"))
    completion = await local.client.chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]
    assert completion.choices[0].message.content == "done"
    own = {"Origin": local.url, "Content-Type": "application/json", "Sec-Fetch-Site": "same-origin"}
    status, _ = await post(local, INVOKE, {"arguments": {"text": "from the page"}}, own)
    assert status == 200
    by_name = {"Host": f"localhost:{local.http.port}", "Origin": f"http://localhost:{local.http.port}",
               "Content-Type": "application/json"}
    status, _ = await post(local, INVOKE, {"arguments": {"text": "from localhost"}}, by_name)
    assert status == 200
    assert notes.written == ["from the client", "from the page", "from localhost"]


# --- DNS rebinding -----------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/v1/tools", "/ui", "/ui/trajectories", "/metrics", "/healthz", "/v1/models"])
async def test_a_rebinding_page_reads_nothing(local: Stack, path: str) -> None:
    local.script.then(Reply(content="a trajectory to hide"))
    await local.ask(False, messages=USER)
    async with local.http.get(path, headers=rebound(local)) as response:
        assert response.status == 421
        text = await response.text()
    error = assert_openai_error(json.loads(text), type_="invalid_request_error", code="host_not_allowed")
    assert "evil.example" in error["message"]
    assert "write_note" not in text
    assert len(local.upstream_requests) == 1  # /v1/models went nowhere either
    probe = path in ("/metrics", "/healthz")  # probes are not counted as requests (issue 35)
    assert local.metric(names.METRIC_REQUESTS, route=path if path != "/v1/models" else "/v1/{tail}",
                        status="421") == (0 if probe else 1)


async def test_a_rebinding_page_cannot_run_a_tool_or_reach_mcp(local: Stack, notes: Notes) -> None:
    json_type = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    status, answer = await post(local, INVOKE, ATTACK, {**rebound(local), **json_type})
    assert status == 421
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "page", "version": "1"}}}
    status, answer = await post(local, "/mcp", initialize, {**rebound(local), **json_type})
    assert status == 421
    assert_openai_error(answer, type_="invalid_request_error", code="host_not_allowed")
    assert notes.written == []


async def test_mcp_answers_foreign_origins_and_other_types_as_every_route_does(local: Stack) -> None:
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "page", "version": "1"}}}
    accept = {"Accept": "application/json, text/event-stream"}
    status, answer = await post(local, "/mcp", initialize, {**cross_site("text/plain"), **accept})
    assert status == 403
    assert_openai_error(answer, type_="permission_error", code="origin_not_allowed")
    status, answer = await post(local, "/mcp", initialize, {"Content-Type": "text/plain", **accept})
    assert status == 415
    assert_openai_error(answer, type_="invalid_request_error", code="unsupported_media_type")
    status, answer = await post(local, "/mcp", initialize, {"Content-Type": "application/json", **accept})
    assert status == 200
    assert answer["result"]["serverInfo"]["name"] == "toolspan"


# --- configured names, and other addresses -----------------------------------------------------------

async def test_configured_hosts_and_origins_get_through(make_stack: StackFactory, notes: Notes) -> None:
    stack = await make_stack(registry=notes.registry(), allowed_hosts=["gateway.internal", ".example.com"],
                             allowed_origins=["https://app.example.com"])
    port = stack.http.port
    for host in ("gateway.internal", "example.com", "api.example.com", "GATEWAY.internal."):
        async with stack.http.get("/v1/tools", headers={"Host": f"{host}:{port}"}) as response:
            assert response.status == 200, host
    for host in ("127.0.0.1", "evil.example", "badexample.com"):  # the list replaces the loopback default
        async with stack.http.get("/v1/tools", headers={"Host": f"{host}:{port}"}) as response:
            assert response.status == 421, host
    page = {"Host": "api.example.com", "Origin": "https://app.example.com", "Content-Type": "application/json"}
    status, _ = await post(stack, INVOKE, ATTACK, page)
    assert status == 200
    status, _ = await post(stack, INVOKE, ATTACK, {**page, "Content-Type": "text/plain"})
    assert status == 415  # an allowed page still posts JSON as JSON
    status, _ = await post(stack, INVOKE, ATTACK, {**page, "Origin": "https://app.example.com.evil.example"})
    assert status == 403
    assert notes.written == ["pwned"]


async def test_any_host_when_allowed_hosts_is_a_star(make_stack: StackFactory) -> None:
    stack = await make_stack(allowed_hosts=["*"])
    async with stack.http.get("/v1/tools", headers={"Host": "anything.example"}) as response:
        assert response.status == 200


async def test_on_another_address_no_host_check_but_origins_still(make_stack: StackFactory, notes: Notes) -> None:
    """Listening on every interface (compose, behind a load balancer): any Host, as before; a
    foreign page is still refused."""
    stack = await make_stack(registry=notes.registry(), host="0.0.0.0")
    async with stack.http.get("/v1/tools", headers={"Host": "toolspan-1:8080"}) as response:
        assert response.status == 200
    status, _ = await post(stack, INVOKE, ATTACK, cross_site("text/plain"))
    assert status == 403
    status, _ = await post(stack, INVOKE, ATTACK, {"Host": "gateway.example", "Origin": "https://gateway.example",
                                                   "X-Forwarded-Proto": "https", "Content-Type": "application/json"})
    assert status == 200  # its own page, behind a proxy that ends TLS
    assert notes.written == ["pwned"]


@pytest.mark.parametrize(("setting", "value", "said"), [
    ("allowed_hosts", ["gateway.internal:8080"], "without a port"),
    ("allowed_hosts", ["http://gateway.internal"], "without a port"), ("allowed_hosts", [], "lists no name"),
    ("allowed_origins", ["null"], "no path"), ("allowed_origins", ["https://app.example.com/app"], "no path"),
    ("allowed_origins", ["app.example.com"], "a scheme")])
def test_an_entry_that_could_never_match_fails_at_start_up(setting: str, value: list[str], said: str) -> None:
    with pytest.raises(ValidationError, match=f"{setting} .*{said}"):
        Settings(**{setting: value})


# --- the page ---------------------------------------------------------------------------------------

async def test_every_page_answer_carries_the_page_headers(make_stack: StackFactory) -> None:
    stack = await make_stack(keys={"ops": {"key": TEST_KEY}})
    answers = [await stack.http.get("/ui"), await stack.http.get("/ui", headers=AUTH),
               await stack.http.get("/ui/no/such/page", headers=AUTH),
               await stack.http.get("/ui/trajectories/unknown", headers=AUTH),
               await stack.http.get("/ui/assets/ui.css"), await stack.http.get("/ui/assets/nothing.js"),
               await stack.http.post("/ui/login", data={"key": TEST_KEY}, allow_redirects=False),
               await stack.http.post("/ui/logout", allow_redirects=False),
               await stack.http.get("/ui", headers=rebound(stack))]
    for answer in answers:
        assert answer.headers.get("X-Frame-Options") == "DENY", answer.url
        assert answer.headers.get("Content-Security-Policy") == CONTENT_SECURITY_POLICY, answer.url
        assert answer.headers.get("X-Content-Type-Options") == "nosniff", answer.url
    assert [a.status for a in answers] == [401, 200, 404, 404, 200, 404, 303, 303, 421]


async def test_the_pages_own_sign_in_form_works_and_no_other_page_may_post_it(make_stack: StackFactory) -> None:
    stack = await make_stack(keys={"ops": {"key": TEST_KEY}}, allowed_origins=["https://app.example.com"])
    own = await stack.http.post("/ui/login", data={"key": TEST_KEY, "next": "/ui"}, allow_redirects=False,
                                headers={"Origin": stack.url, "Sec-Fetch-Site": "same-origin"})
    assert own.status == 303
    assert own.cookies["toolspan_ui"].value
    for origin in (EVIL_PAGE, "https://app.example.com"):  # an allowed page may call the API, not sign in
        other = await stack.http.post("/ui/login", data={"key": TEST_KEY}, allow_redirects=False,
                                      headers={"Origin": origin})
        assert other.status == 403, origin
        assert "toolspan_ui" not in other.cookies


# --- a real browser ---------------------------------------------------------------------------------

async def attacker_site(aiohttp_server: AiohttpServer) -> str:
    """Another site's page (a second server, named attacker.test in the browser): nothing but a blank page."""
    async def blank(request: web.Request) -> web.Response:
        return web.Response(text="<!doctype html><title>a page</title>", content_type="text/html")

    app = web.Application()
    app.router.add_get("/", blank)
    server = await aiohttp_server(app)
    return f"http://attacker.test:{server.port}/"


async def test_a_page_of_another_site_cannot_run_a_tool_in_chromium(local: Stack, notes: Notes, browser: Browser,
                                                                    aiohttp_server: AiohttpServer) -> None:
    page = await browser.new_page()
    await page.goto(await attacker_site(aiohttp_server))
    sent = await page.evaluate("""url => fetch(url, {method: "POST", mode: "no-cors",
                                                     body: JSON.stringify({arguments: {text: "pwned"}})})
                                     .then(answer => answer.type, error => String(error))""",
                               f"{local.url}{INVOKE}")
    assert sent == "opaque"  # the gateway answered; the page could not read what
    assert notes.written == []
    assert local.metric(names.METRIC_REQUESTS, route="/v1/tools/{name}/invoke", status="403") == 1


async def test_a_rebound_name_reads_nothing_in_chromium(local: Stack, browser: Browser) -> None:
    """The browser resolves rebinding.test to 127.0.0.1, as a rebinding page's name ends up resolving."""
    page = await browser.new_page()
    answer = await page.goto(f"http://rebinding.test:{local.http.port}/v1/tools")
    assert answer is not None
    assert answer.status == 421
    assert "write_note" not in await answer.text()
