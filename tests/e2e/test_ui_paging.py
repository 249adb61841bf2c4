"""A long trajectory on the page (GET /ui/trajectories/{id}), in a real headless Chromium: the first
200 requests and how many there are, the next page and back, retry links across pages; another
key's pages are none of its business; page parameters the page does not take are a 400."""

from __future__ import annotations

import pytest
from playwright.async_api import Browser, Page, expect

from gateway.ui.pages import CONTENT_SECURITY_POLICY
from telemetry import names
from telemetry.store.records import stored_id
from tests.conftest import AUTH, TEST_KEY, Stack, StackFactory, grow_trajectory

BOB_KEY = "sk-bob-key-0000"
KEYS = {"alice": {"key": TEST_KEY}, "bob": {"key": BOB_KEY}}
LONG = "long-run"  # the X-Trajectory-Id both keys send
BOB = {"Authorization": f"Bearer {BOB_KEY}"}
PAGE_ROUTE = "/ui/trajectories/{id}"


@pytest.fixture
async def keyed(make_stack: StackFactory) -> Stack:
    return await make_stack(keys=KEYS)


async def _signed_in(browser: Browser, stack: Stack, path: str) -> Page:
    page = await browser.new_page()
    await page.goto(f"{stack.url}{path}")
    await page.get_by_label("Gateway key").fill(TEST_KEY)
    async with page.expect_navigation():
        await page.get_by_role("button", name="Sign in").click()
    return page


async def test_a_long_trajectory_is_shown_a_page_at_a_time(keyed: Stack, browser: Browser) -> None:
    alice = await grow_trajectory(keyed, LONG, 205, failing_at=200)
    await grow_trajectory(keyed, LONG, 3, key=BOB_KEY)
    page = await _signed_in(browser, keyed, f"/ui/trajectories/{LONG}")
    requests = page.locator("section.request")
    await expect(requests).to_have_count(200)
    await expect(page.locator("nav.pages").first).to_contain_text("Showing requests 1-200 of 205 (page 1 of 2)")
    await expect(page.locator("main")).to_contain_text("205 requests · 205 tool calls, 1 failed")
    await expect(requests.last.locator("h2")).to_have_text("Request 200: POST /v1/chat/completions")
    assert alice[0] in await requests.first.inner_text()

    await page.locator("nav.pages").first.get_by_role("link", name="next →").click()
    await page.wait_for_url(f"**/ui/trajectories/{stored_id('alice', LONG)}?page=2")
    await expect(requests).to_have_count(5)
    await expect(page.locator("nav.pages").first).to_contain_text("Showing requests 201-205 of 205 (page 2 of 2)")
    await expect(requests.first.locator("h2")).to_have_text("Request 201: POST /v1/chat/completions")
    assert alice[-1] in await requests.last.inner_text()

    # Request 201 retries request 200's rejected call: the link goes to it on page 1, and back.
    await requests.first.get_by_role("link", name="the failed call").click()
    await page.wait_for_url("**#call-*")
    assert "?page=" not in page.url
    await expect(page.locator("li.call:target")).to_contain_text("read_file rejected (missing_arguments)")
    await page.locator("li.call:target").get_by_role("link", name="the next call").click()
    await page.wait_for_url("**?page=2#call-*")
    await expect(page.locator("li.call:target")).to_contain_text("corrected retry of the failed call")


async def test_another_key_sees_only_its_own_pages(keyed: Stack) -> None:
    await grow_trajectory(keyed, LONG, 12)
    bobs = await grow_trajectory(keyed, LONG, 3, key=BOB_KEY)
    mine = await keyed.http.get(f"/ui/trajectories/{LONG}?limit=2", headers=BOB)
    assert mine.status == 200
    text = await mine.text()
    assert "Showing requests 1-2 of 3 (page 1 of 2)" in text
    assert bobs[0] in text
    assert "12 requests" not in text
    past = await keyed.http.get(f"/ui/trajectories/{LONG}?page=3&limit=2", headers=BOB)
    assert past.status == 400
    assert "past the last page of this trajectory: 2 (3 requests, 2 a page)" in await past.text()
    for query in ("", "?page=2", "?page=6&limit=2", "?page=7&limit=2"):
        theirs = await keyed.http.get(f"/ui/trajectories/{stored_id('alice', LONG)}{query}", headers=BOB)
        assert theirs.status == 404  # not "past the last page": that would say it exists
        assert "no trajectory with this id" in await theirs.text()
    assert (await keyed.http.get(f"/ui/trajectories/{LONG}?page=6&limit=2", headers=AUTH)).status == 200


@pytest.mark.parametrize(("query", "said"), [
    ("page=0", "?page must be a whole number from 1 up, not '0'"),
    ("page=-1", "?page must be a whole number from 1 up, not '-1'"),
    ("page=two", "?page must be a whole number from 1 up, not 'two'"),
    ("page=%C2%B2", "?page must be a whole number from 1 up, not '²'"),
    ("page=1.5", "?page must be a whole number from 1 up"),
    ("page=" + "9" * 400, "?page must be a whole number from 1 up"),
    ("limit=0", "?limit must be a whole number from 1 to 1,000, not '0'"),
    ("limit=1001", "?limit must be a whole number from 1 to 1,000, not '1001'"),
    ("page=99999", "?page=99,999 is past the last page of this trajectory: 1 (2 requests, 200 a page)"),
], ids=["zero", "negative", "word", "superscript", "fraction", "huge", "limit-zero", "limit-too-big", "past-the-end"])
async def test_page_parameters_the_page_does_not_take_are_a_400(keyed: Stack, query: str, said: str) -> None:
    await grow_trajectory(keyed, LONG, 2)
    refused = await keyed.http.get(f"/ui/trajectories/{LONG}?{query}", headers=AUTH)
    assert refused.status == 400
    assert refused.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    text = await refused.text()
    assert said.replace("'", "&#x27;") in text
    assert 'class="card request"' not in text
    assert keyed.metric(names.METRIC_REQUESTS, route=PAGE_ROUTE, status="400") == 1
