"""The page's pieces on their own: escaping, sign-in redirects, trace links, chart buckets, a retry's
diff, the messages a turn added, the capture setting the page names."""

from __future__ import annotations

import html
import json
from typing import Any

import pytest

from gateway.settings.model import Settings
from gateway.ui.auth import page_after_sign_in
from gateway.ui.diff import arguments_diff, key_changes
from gateway.ui.layout import trace_link
from gateway.ui.markup import Html, render
from gateway.ui.messages import CAPTURE_SETTING, CAPTURE_VARIABLE, added_messages
from gateway.ui.report import chart_buckets

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


def test_values_are_escaped_and_markup_is_not() -> None:
    shown = render("<td title={quoted}>{text}{markup}</td>", quoted='"x" onclick="y"', text="<b>&</b>",
                   markup=Html("<br>"))
    assert shown == "<td title=&quot;x&quot; onclick=&quot;y&quot;>&lt;b&gt;&amp;&lt;/b&gt;<br></td>"


@pytest.mark.parametrize(("asked", "goes_to"), [
    ("/ui/trajectories?tool=a", "/ui/trajectories?tool=a"), ("//evil.example/ui", "/ui"),
    ("https://evil.example/ui", "/ui"), ("/v1/models", "/ui"), ("/ui\\..\\x", "/ui"), (None, "/ui")])
def test_sign_in_returns_only_to_a_page_of_its_own(asked: str | None, goes_to: str) -> None:
    assert page_after_sign_in(asked) == goes_to


def test_trace_ids_link_only_when_they_are_trace_ids() -> None:
    template = "https://tempo.example/trace/{trace_id}"
    assert f'href="https://tempo.example/trace/{TRACE_ID}"' in trace_link(TRACE_ID, template)
    assert "href" not in trace_link("javascript:alert(1)", template)
    assert "href" not in trace_link(TRACE_ID, None)


def test_chart_buckets_share_one_time_axis_and_keep_empty_steps() -> None:
    rows = [{"tool": "a", "bucket_start": 0.0, "calls": 4, "rejections": 1},
            {"tool": "b", "bucket_start": 2400.0, "calls": 2, "rejections": 2}]
    buckets = chart_buckets(rows)
    assert [len(series) for series in buckets.values()] == [24, 24]
    assert [(b.calls, b.rejected) for b in buckets["a"] if b.calls] == [(4, 1)]
    assert buckets["a"][0].label == buckets["b"][0].label == "1970-01-01 00:00 UTC"
    assert (buckets["b"][-1].calls, buckets["b"][-1].rate) == (2, 1.0)


@pytest.mark.parametrize("asked", ["/ui\r\nSet-Cookie: x=1", "/ui\n", "/ui\x00", "/ui\t", "/ui x", "/ui\x7f",
                                   "/ui\u2028", "/ui\u00a0"])
def test_sign_in_never_returns_to_a_path_with_control_characters_or_spaces(asked: str) -> None:
    assert page_after_sign_in(asked) == "/ui"


def test_the_capture_setting_the_page_names_turns_capture_on(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings(**{CAPTURE_SETTING: True}).capture_message_content
    monkeypatch.setenv(CAPTURE_VARIABLE, "true")
    assert Settings().capture_message_content


@pytest.mark.parametrize(("failed", "corrected", "changes"), [
    ('{"city": "Lisbon"}', '{"location": "Lisbon"}', [("-", 'city: "Lisbon"'), ("+", 'location: "Lisbon"')]),
    ('{"celsius": "9", "unit": "c"}', '{"celsius": 9, "unit": "c"}', [("~", 'celsius: "9" → 9')]),
])
def test_a_retry_diff_names_keys_removed_added_and_changed(failed: str, corrected: str,
                                                           changes: list[tuple[str, str]]) -> None:
    assert key_changes(json.loads(failed), json.loads(corrected)) == changes
    shown = arguments_diff(failed, corrected)
    assert shown.count("<li ") == len(changes)
    assert html.escape(changes[0][1], quote=True) in shown


def test_arguments_that_are_not_json_are_compared_line_by_line() -> None:
    shown = arguments_diff('{"city": "<b>Lisbon"', '{"city": "<b>Lisbon"}')
    assert '<li class="removed"><code>- {&quot;city&quot;: &quot;&lt;b&gt;Lisbon&quot;</code></li>' in shown
    assert '<li class="added"><code>+ {&quot;city&quot;: &quot;&lt;b&gt;Lisbon&quot;}</code></li>' in shown


def test_a_retry_that_changed_nothing_says_so() -> None:
    assert "the same arguments" in arguments_diff('{"a": 1}', '{ "a" : 1 }')


@pytest.mark.parametrize(("sent", "before", "added"), [
    ([{"role": "user", "content": "q"}], None, None),  # the first turn: nothing before it
    ([1, 2, {"role": "assistant"}, 3], [1, 2], [3]),  # the previous answer comes back first
    ([1, {"role": "assistant", "n": 9}, 4], [1, 2, 3], [4]),  # the client's own history, without the tool rounds
    ([2, 3, {"role": "assistant"}, 4], [1, 2, 3], [4]),  # capture left out the oldest message
    ([7, 8], [1, 2], None),  # another conversation
])
def test_a_turn_shows_the_messages_it_added(sent: list[Any], before: list[Any] | None,
                                            added: list[Any] | None) -> None:
    assert added_messages(sent, before) == added
