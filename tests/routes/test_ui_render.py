"""The page's pieces on their own: escaping, sign-in redirects, trace links, chart buckets."""

from __future__ import annotations

import pytest

from gateway.routes.ui_auth import page_after_sign_in
from gateway.routes.ui_layout import trace_link
from gateway.routes.ui_markup import Html, render
from gateway.routes.ui_report import chart_buckets

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
