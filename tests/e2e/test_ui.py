"""The trajectory page (GET /ui) in a real headless Chromium (Debian's `chromium`, driven by
Playwright; no browser of Playwright's own): a scripted session through the gateway, then the
report, the trajectory list and the timeline as a reader sees them, sign-in with a gateway key,
and hostile names and arguments shown as text. TOOLSPAN_UPDATE_SCREENSHOT=1 rewrites the README's
screenshots (docs/ui.png, docs/ui-trajectory.png)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, Page, expect

from gateway.demo.model import Reply
from gateway.demo.tools import demo_registry
from gateway.ui.auth import SESSION_COOKIE
from gateway.ui.pages import CONTENT_SECURITY_POLICY
from tests.conftest import AUTH, TEST_KEY, Stack, StackFactory

TRACE_UI = "https://grafana.example/explore?left=%7B%22queries%22:%5B%7B%22query%22:%22{trace_id}%22%7D%5D%7D"
KEYS = {"ops": {"key": TEST_KEY}}
QUESTION = [{"role": "user", "content": "What is the weather in Lisbon?"}]
HOSTILE_TOOL = "<img src=x onerror=window.pwned=1>"
HOSTILE_CITY = "<script>window.pwned=2</script>Lisbon"
DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture
async def keyed(make_stack: StackFactory) -> Stack:
    # Messages captured, as toolspan demo does: the screenshots show its trajectories.
    return await make_stack(registry=demo_registry(), keys=KEYS, trace_ui_url=TRACE_UI, capture_message_content=True)


async def _session(stack: Stack, *replies: Reply) -> dict[str, str]:
    """One request through the gateway, the model answering with `replies`; its response headers,
    once the store has written its spans."""
    stack.script.then(*replies)
    answer = await stack.ask(False, messages=QUESTION)
    await stack.store.flushed()
    return answer.headers


async def _renamed_then_corrected(stack: Stack, city: str = "Lisbon") -> dict[str, str]:
    """toolspan demo's session: a renamed argument rejected, the corrected retry, the answer."""
    return await _session(stack, Reply(tool_calls=[("get_weather", {"city_name": city})]),
                          Reply(tool_calls=[("get_weather", {"city": "Lisbon"})]),
                          Reply(tool_calls=[("to_fahrenheit", {"celsius": 9})]),
                          Reply(content="In Lisbon it is 9 °C (48.2 °F)."))


async def _stuck_in_verbatim_retries(stack: Stack) -> dict[str, str]:
    """A model that re-sends the same rejected call twice, then gives up."""
    wrong = Reply(tool_calls=[("to_fahrenheit", {"celsius_value": 9})])
    return await _session(stack, wrong, wrong, wrong, Reply(content="I could not convert it."))


async def _signed_in(browser: Browser, stack: Stack, path: str) -> Page:
    """A browser page that asked for `path`, got the sign-in form, and signed in with the key."""
    page = await browser.new_page(viewport={"width": 1400, "height": 900}, locale="en-GB", timezone_id="Europe/Berlin")
    refused = await page.goto(f"{stack.url}{path}")
    assert refused is not None
    assert refused.status == 401
    await page.get_by_label("Gateway key").fill(TEST_KEY)
    async with page.expect_navigation() as navigation:
        await page.get_by_role("button", name="Sign in").click()
    signed_in = await navigation.value
    assert signed_in is not None
    assert signed_in.status == 200, await page.content()
    assert page.url == f"{stack.url}{path}"
    return page


async def test_the_page_shows_the_report_the_list_and_a_timeline(keyed: Stack, browser: Browser) -> None:
    stuck = await _stuck_in_verbatim_retries(keyed)
    headers = await _renamed_then_corrected(keyed)
    page = await _signed_in(browser, keyed, "/ui")

    tool = page.locator('#tools tr[data-tool="get_weather"]')
    await expect(tool).to_contain_text("missing_arguments 1")
    cells = await tool.locator("td").all_inner_texts()
    assert cells[1:4] == ["2", "1", "50%"]  # calls, rejected, rejection rate
    assert cells[6:8] == ["1", "1 of 1 (100%)"]  # corrected retries, recovered
    assert await tool.locator("svg.chart rect.bad").count() == 1  # the rejection, on its chart
    rename = page.locator("#renames tr.rename", has_text="get_weather")
    assert await rename.locator("td").all_inner_texts() == ["get_weather", "city_name", "city", "1"]
    await expect(page.locator(".chart .name")).to_have_text(["to_fahrenheit: celsius_value → celsius",
                                                                    "get_weather: city_name → city"])
    flagged = page.locator("#stuck tbody tr")
    assert await flagged.locator("td").all_inner_texts() == [stuck["x-trajectory-id"], "ops", "to_fahrenheit",
                                                             "test-model", "2"]

    # The page's own script ran under its Content-Security-Policy: times are in the reader's zone.
    assert await page.locator("time").first.get_attribute("title") is not None
    if os.environ.get("TOOLSPAN_UPDATE_SCREENSHOT") == "1":
        await page.screenshot(path=str(DOCS / "ui.png"), full_page=True)

    await page.get_by_role("link", name="Trajectories", exact=True).click()
    await page.get_by_label("tool", exact=True).fill("to_fahrenheit")
    await page.get_by_label("outcome").select_option("rejected")
    await page.get_by_role("button", name="Filter").click()
    listed = page.locator("#trajectories tbody tr")
    await expect(listed).to_have_count(1)
    await expect(listed).to_contain_text(stuck["x-trajectory-id"])
    await page.get_by_label("tool", exact=True).fill("")
    await page.get_by_role("button", name="Filter").click()
    await expect(listed).to_have_count(2)

    await page.locator("#trajectories a", has_text=headers["x-trajectory-id"]).click()
    await page.wait_for_url(f"**/ui/trajectories/ops~{headers['x-trajectory-id']}")
    failed = page.locator("li.call.failed")
    await expect(failed.locator("pre.arguments")).to_have_text('{\n  "city_name": "Lisbon"\n}')
    await expect(failed.locator("pre.diagnostic")).to_contain_text("Unrecognized: city_name (did you mean 'city'?)")
    await expect(failed).to_contain_text("rejected (missing_arguments) round 1")
    await expect(page.locator("li.turn").first).to_contain_text("round 1 · finish tool_calls")
    trace = page.locator("a.trace")
    assert await trace.get_attribute("href") == TRACE_UI.replace("{trace_id}", headers["x-trace-id"])
    if os.environ.get("TOOLSPAN_UPDATE_SCREENSHOT") == "1":
        await page.screenshot(path=str(DOCS / "ui-trajectory.png"), full_page=True)

    await failed.get_by_role("link", name="the next call").click()
    retry = page.locator("li.call:target")
    await expect(retry).to_contain_text("get_weather ok")
    await expect(retry).to_contain_text("corrected retry of the failed call")


async def test_hostile_names_and_arguments_are_shown_as_text(keyed: Stack, browser: Browser) -> None:
    headers = await _session(keyed, Reply(tool_calls=[(HOSTILE_TOOL, {"q": 1}),
                                                      ("get_weather", {"city_name": HOSTILE_CITY})]),
                             Reply(content="no"))
    page = await _signed_in(browser, keyed, f"/ui/trajectories/{headers['x-trajectory-id']}")
    await expect(page.locator("li.call.failed code").first).to_have_text(HOSTILE_TOOL)
    await expect(page.locator("li.call.failed pre.arguments").nth(1)).to_contain_text(HOSTILE_CITY)
    await page.goto(f"{keyed.url}/ui")
    await expect(page.locator("#tools")).to_contain_text(HOSTILE_TOOL)
    # Nothing the model chose became markup: no image, one script (the page's own), nothing ran.
    found = await page.evaluate("[document.images.length, Array.from(document.scripts).map(s => s.src), "
                                "window.pwned === undefined]")
    assert found == [0, [f"{keyed.url}/ui/assets/ui.js"], True]


async def test_without_a_key_the_page_is_refused(keyed: Stack) -> None:
    await _renamed_then_corrected(keyed)
    for path in ("/ui", "/ui/trajectories", "/ui/trajectories/anything"):
        refused = await keyed.http.get(path)
        assert refused.status == 401
        assert refused.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
        assert "get_weather" not in await refused.text()
    wrong = await keyed.http.get("/ui", headers={"Authorization": "Bearer not-the-key"})
    assert wrong.status == 401
    assert (await keyed.http.get("/ui", headers=AUTH)).status == 200


async def test_signing_in_sets_a_strict_httponly_cookie(keyed: Stack) -> None:
    wrong = await keyed.http.post("/ui/login", data={"key": "not-the-key", "next": "/ui"}, allow_redirects=False)
    assert wrong.status == 401
    assert SESSION_COOKIE not in wrong.cookies
    foreign = await keyed.http.post("/ui/login", data={"key": TEST_KEY}, headers={"Origin": "https://evil.example"},
                                    allow_redirects=False)
    assert foreign.status == 403
    signed = await keyed.http.post("/ui/login", data={"key": TEST_KEY, "next": "//evil.example/ui"},
                                   allow_redirects=False)
    assert signed.status == 303
    assert signed.headers["Location"] == "/ui"
    cookie = signed.cookies[SESSION_COOKIE]
    assert TEST_KEY not in cookie.value
    assert (cookie["httponly"], cookie["samesite"], cookie["path"]) == (True, "Strict", "/ui")
    session = {SESSION_COOKIE: cookie.value}
    assert (await keyed.http.get("/ui", cookies=session)).status == 200
    assert (await keyed.http.get("/ui", cookies={SESSION_COOKIE: "0" * 64})).status == 401


@pytest.mark.parametrize("path", ["/ui", "/ui/trajectories", "/ui/assets/ui.js"])
async def test_the_page_can_be_turned_off(make_stack: StackFactory, path: str) -> None:
    stack = await make_stack(ui=False)
    assert (await stack.http.get(path)).status == 404


async def test_an_unknown_trajectory_is_a_404_page(keyed: Stack) -> None:
    missing = await keyed.http.get("/ui/trajectories/no-such-trajectory", headers=AUTH)
    assert missing.status == 404
    assert "no trajectory with this id" in await missing.text()


async def test_without_a_store_the_page_says_so(make_stack: StackFactory) -> None:
    stack = await make_stack(trajectory_store=False)
    shown: Any = await stack.http.get("/ui")
    assert shown.status == 200
    assert "trajectory store is off" in await shown.text()


@pytest.mark.parametrize("since", ["%C2%B2", "9" * 5000, "9" * 400, "9" * 10, "-1", "garbage"])
async def test_a_since_the_form_does_not_offer_is_ignored(keyed: Stack, since: str) -> None:
    await _renamed_then_corrected(keyed)
    shown = await keyed.http.get(f"/ui/trajectories?since={since}", headers=AUTH)
    assert shown.status == 200
    assert "get_weather" in await shown.text()


async def test_a_control_character_in_next_never_reaches_the_location(keyed: Stack) -> None:
    signed = await keyed.http.post("/ui/login", data={"key": TEST_KEY, "next": "/ui\r\nSet-Cookie: evil=1"},
                                   allow_redirects=False)
    assert signed.status == 303
    assert signed.headers["Location"] == "/ui"
    assert "evil" not in signed.cookies


async def test_a_key_sees_only_its_own_trajectories_and_the_operator_every_one(make_stack: StackFactory) -> None:
    """Restricted or not, a key's page shows its own calls only: another key's trajectory, by its
    stored id or by the id its caller knows, is a 404 page; a key marked operator sees them all."""
    stack = await make_stack(registry=demo_registry(), keys={
        "ops": {"key": TEST_KEY}, "tools-only": {"key": "sk-tools-only", "tools": ["get_weather"]},
        "root": {"key": "sk-root-key", "operator": True}})
    theirs = (await _renamed_then_corrected(stack))["x-trajectory-id"]  # made with the "ops" key
    for path in ("/ui", "/ui/trajectories", f"/ui/trajectories/{theirs}", f"/ui/trajectories/ops~{theirs}"):
        shown = await stack.http.get(path, headers={"Authorization": "Bearer sk-tools-only"})
        assert shown.status == (404 if "/trajectories/" in path else 200)
        text = await shown.text()
        assert "get_weather" not in text
        assert theirs not in text or path.endswith(theirs)  # the 404 page names only the id asked for
    signed = await stack.http.post("/ui/login", data={"key": "sk-tools-only", "next": "/ui"}, allow_redirects=False)
    assert signed.status == 303
    for key in (TEST_KEY, "sk-root-key"):
        listed = await stack.http.get("/ui/trajectories", headers={"Authorization": f"Bearer {key}"})
        assert theirs in await listed.text()
        own = await stack.http.get(f"/ui/trajectories/ops~{theirs}", headers={"Authorization": f"Bearer {key}"})
        assert own.status == 200
        assert "get_weather" in await own.text()


async def test_the_report_shows_each_keys_usage_of_its_limits(make_stack: StackFactory, browser: Browser) -> None:
    """The Limits section: a key sees its own limits used against their bounds; the operator every key's."""
    stack = await make_stack(registry=demo_registry(), keys={
        "ops": {"key": TEST_KEY, "requests_per_minute": 4}, "other": {"key": "sk-other-key"},
        "root": {"key": "sk-root-key", "operator": True}}, default_limits={"requests_per_minute": 10,
                                                                         "tokens_per_day": 1000})
    await _renamed_then_corrected(stack)  # four provider calls of 15 tokens each
    page = await _signed_in(browser, stack, "/ui")
    rows = page.locator("#limits tbody tr")
    await expect(rows).to_have_count(2)
    requests = await rows.nth(0).locator("td").all_inner_texts()
    shown = [cell.strip() for cell in requests[:6]]
    assert shown == ["ops", "requests_per_minute", "1", "4", "3", "25%"]  # its own bound, not the default
    assert re.fullmatch(r"in [1-6]?[0-9] s", requests[6])  # when the request leaves the sliding minute
    tokens = await rows.nth(1).locator("td").all_inner_texts()
    assert tokens[:5] == ["ops", "tokens_per_day", "60", "1,000", "940"]
    assert await rows.nth(1).locator("meter").get_attribute("value") == "60"
    assert await rows.nth(1).locator("time").get_attribute("title") is not None  # the page's script ran on it
    for key, shown in (("sk-other-key", {"other"}), ("sk-root-key", {"ops", "other", "root"})):
        text = await (await stack.http.get("/ui", headers={"Authorization": f"Bearer {key}"})).text()
        assert {name for name in ("ops", "other", "root") if f'data-key="{name}"' in text} == shown


async def test_without_limits_the_report_has_no_limits_section(keyed: Stack) -> None:
    text = await (await keyed.http.get("/ui", headers=AUTH)).text()
    assert 'id="limits"' not in text
