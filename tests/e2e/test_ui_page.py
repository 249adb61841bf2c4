"""The trajectory page's layout and what it shows of a retry, of times and of messages, in the
real headless Chromium (tests/conftest.py's `browser`): geometry read from the laid-out page (no
text drawn over a bar, no table wider than its box at 1400 px), the diff of a corrected retry's
arguments, times in the viewer's zone (Playwright's `timezone_id`), the messages each turn added,
and what the page says when messages were not captured."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from playwright.async_api import Browser, Page, expect

from gateway.demo.model import Reply
from gateway.demo.tools import demo_registry
from gateway.tools import Param, Tool, ToolRegistry
from tests.conftest import Stack, StackFactory

# As long as a tool name may be (64), and no spaces to break it at.
LONG_TOOL = "look_up_the_current_weather_conditions_for_one_city_by_its_name_"[:64]
LONG_ARGUMENT = "the_name_of_the_city_whose_weather_is_wanted"
QUESTION = [{"role": "user", "content": "What is the weather in Lisbon?"}]
WIDTH = 1400


def _long_named(args: dict[str, Any]) -> str:
    return f"fine in {args['city']}"


def long_names_registry() -> ToolRegistry:
    registry = demo_registry()
    registry.register(Tool(name=LONG_TOOL, description="The weather, under a long name.",
                           parameters=[Param("city", "string", required=True)], function=_long_named))
    return registry


@pytest.fixture
async def long_names(make_stack: StackFactory) -> Stack:
    return await make_stack(registry=long_names_registry(), capture_message_content=True)


async def _session(stack: Stack, *replies: Reply, messages: list[dict[str, Any]] | None = None) -> dict[str, str]:
    stack.script.then(*replies)
    answer = await stack.ask(False, messages=messages or QUESTION)
    await stack.store.flushed()
    return answer.headers


async def _open(browser: Browser, stack: Stack, path: str, **context: Any) -> Page:
    opened = await browser.new_context(viewport={"width": WIDTH, "height": 900}, **context)
    page = await opened.new_page()
    shown = await page.goto(f"{stack.url}{path}")
    assert shown is not None
    assert shown.status == 200
    return page


async def _long_names_session(stack: Stack) -> dict[str, str]:
    """A rejected call of the long-named tool under a long wrong argument name, its corrected retry."""
    return await _session(stack, Reply(tool_calls=[(LONG_TOOL, {LONG_ARGUMENT: "Lisbon"})]),
                          Reply(tool_calls=[(LONG_TOOL, {"city": "Lisbon"})]),
                          Reply(tool_calls=[("get_weather", {"city_name": "Lisbon"})]),
                          Reply(tool_calls=[("get_weather", {"city": "Lisbon", "unit": "celsius"})]),
                          Reply(content="Fine, 9 °C."))


# Each chart row's label and its bar: the right edge of the label's visible box, the bar's left.
_LABELS_AND_BARS = """() => Array.from(document.querySelectorAll('.card .chart .row')).map(row => {
  const name = row.querySelector('.name'), bar = row.querySelector('.bad');
  return {right: name.getBoundingClientRect().right, bar: bar.getBoundingClientRect().left,
          clipped: name.scrollWidth > name.clientWidth, title: name.title, text: name.textContent};
})"""


async def test_long_tool_names_stop_short_of_their_bars(long_names: Stack, browser: Browser, tmp_path: Path) -> None:
    await _long_names_session(long_names)
    page = await _open(browser, long_names, "/ui")
    await page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
    rows = await page.evaluate(_LABELS_AND_BARS)
    assert len(rows) == 2
    for row in rows:
        assert row["right"] <= row["bar"], row  # the label's box ends before its bar begins
    long_row = next(row for row in rows if row["title"].startswith(LONG_TOOL))
    # Cut with an ellipsis on the page, whole on hover.
    assert long_row["clipped"]
    assert long_row["title"] == f"{LONG_TOOL}: {LONG_ARGUMENT} → city"
    assert await page.locator(".chart .name").first.evaluate("n => getComputedStyle(n).textOverflow") \
        == "ellipsis"


async def test_the_tools_table_fits_a_1400_pixel_window(long_names: Stack, browser: Browser) -> None:
    await _long_names_session(long_names)
    page = await _open(browser, long_names, "/ui")
    sizes = await page.evaluate("""() => Array.from(document.querySelectorAll('.scroll')).map(box =>
        [box.querySelector('table').id, box.scrollWidth, box.clientWidth])""")
    assert sizes, "the report has tables"
    for table, scrolled, width in sizes:
        assert scrolled <= width, f"#{table} is {scrolled} px wide in a box of {width} px"
    assert await page.evaluate("document.documentElement.scrollWidth") <= WIDTH


async def test_a_corrected_retry_shows_what_it_changed(long_names: Stack, browser: Browser, tmp_path: Path) -> None:
    headers = await _long_names_session(long_names)
    page = await _open(browser, long_names, f"/ui/trajectories/{headers['x-trajectory-id']}")
    await page.screenshot(path=str(tmp_path / "timeline.png"), full_page=True)
    retries = page.locator("li.call", has_text="corrected retry of the failed call")
    await expect(retries).to_have_count(2)
    await expect(retries.nth(0).locator(".diff li")).to_have_text([f'- {LONG_ARGUMENT}: "Lisbon"',
                                                                    '+ city: "Lisbon"'])
    await expect(retries.nth(1).locator(".diff li")).to_have_text(['- city_name: "Lisbon"', '+ city: "Lisbon"',
                                                                    '+ unit: "celsius"'])
    # Beside the retry's classification, above the arguments.
    classified = retries.nth(1).locator(".retry + .diff")
    await expect(classified).to_be_visible()


@pytest.mark.parametrize(("zone", "named"), [("America/New_York", ("EST", "EDT")),
                                             ("America/Los_Angeles", ("PST", "PDT"))])
async def test_times_are_in_the_viewers_zone_and_name_it(long_names: Stack, browser: Browser, zone: str,
                                                         named: tuple[str, str]) -> None:
    headers = await _long_names_session(long_names)
    page = await _open(browser, long_names, f"/ui/trajectories/{headers['x-trajectory-id']}", timezone_id=zone,
                       locale="en-US")
    first = page.locator("time").first
    local = datetime.fromisoformat(str(await first.get_attribute("datetime"))).astimezone(ZoneInfo(zone))
    shown = await first.inner_text()
    assert shown.endswith(local.tzname() or "?"), shown
    assert local.tzname() in named
    assert f"{local.hour % 12 or 12}:{local.minute:02d}:{local.second:02d}" in shown, shown
    assert str(local.year) in shown
    assert (await first.get_attribute("title") or "").endswith(" UTC")  # the server's text, on hover


async def test_without_scripts_times_are_in_utc_and_say_so(long_names: Stack, browser: Browser) -> None:
    headers = await _long_names_session(long_names)
    page = await _open(browser, long_names, f"/ui/trajectories/{headers['x-trajectory-id']}",
                       timezone_id="America/New_York", java_script_enabled=False)
    first = page.locator("time").first
    utc = datetime.fromisoformat(str(await first.get_attribute("datetime")))
    assert utc.utcoffset() == timedelta(0)
    assert await first.inner_text() == utc.strftime("%Y-%m-%d %H:%M:%S UTC")


async def test_messages_sent_show_what_each_turn_added(long_names: Stack, browser: Browser, tmp_path: Path) -> None:
    """Two requests of one trajectory: each turn shows the messages it added (the first turn its
    question, the next the tool's result, the second request's first turn the new question), and
    the whole request only collapsed."""
    first = await _session(long_names, Reply(tool_calls=[("get_weather", {"city": "Lisbon"})]),
                           Reply(content="Lisbon: fine."))
    trajectory = first["x-trajectory-id"]
    history = [*QUESTION, {"role": "assistant", "content": "Lisbon: fine."},
               {"role": "user", "content": "And in Porto?"}]
    long_names.script.then(Reply(content="Porto: fine too."))
    await long_names.ask(False, messages=history, extra_headers={"X-Trajectory-Id": trajectory})
    await long_names.store.flushed()
    page = await _open(browser, long_names, f"/ui/trajectories/{trajectory}")
    await page.screenshot(path=str(tmp_path / "messages.png"), full_page=True)
    turns = page.locator("li.turn")
    await expect(turns).to_have_count(3)
    added = [turns.nth(index).locator(".new-messages li.message") for index in range(3)]
    await expect(added[0].locator(".role")).to_have_text(["user"])
    await expect(added[0].locator(".part")).to_have_text(["What is the weather in Lisbon?"])
    await expect(added[1].locator(".role")).to_have_text(["tool"])  # get_weather's result, alone
    await expect(added[1]).to_contain_text('"city": "Lisbon"')
    await expect(added[2].locator(".role")).to_have_text(["user"])
    await expect(added[2].locator(".part")).to_have_text(["And in Porto?"])
    for index in range(3):
        whole = turns.nth(index).locator("details.whole-request")
        assert await whole.get_attribute("open") is None  # collapsed, and holds the request as sent
        assert "What is the weather in Lisbon?" in (await whole.locator("pre").text_content() or "")
    await expect(turns.nth(2).locator(".answer .part")).to_have_text("Porto: fine too.")


async def test_a_trajectory_without_messages_says_how_to_capture_them(make_stack: StackFactory,
                                                                      browser: Browser) -> None:
    quiet = await make_stack(registry=demo_registry())  # serve's default: messages not captured
    headers = await _session(quiet, Reply(tool_calls=[("get_weather", {"city": "Lisbon"})]), Reply(content="Fine."))
    page = await _open(browser, quiet, f"/ui/trajectories/{headers['x-trajectory-id']}")
    said = page.locator(".capture-off")
    await expect(said).to_have_count(1)
    await expect(said).to_contain_text("Messages were not captured")
    await expect(said.locator("code")).to_contain_text(["capture_message_content",
                                                        "TOOLSPAN_CAPTURE_MESSAGE_CONTENT=true"])
    assert await page.locator("li.turn .new-messages").count() == 0


async def test_a_trajectory_with_messages_says_nothing_of_capture(long_names: Stack, browser: Browser) -> None:
    headers = await _session(long_names, Reply(content="Fine."))
    page = await _open(browser, long_names, f"/ui/trajectories/{headers['x-trajectory-id']}")
    await expect(page.locator("li.turn .new-messages")).to_have_count(1)
    assert await page.locator(".capture-off").count() == 0
