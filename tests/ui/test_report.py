"""The report page (gateway.ui.report): the buckets of its charts."""

from __future__ import annotations

from gateway.ui.report import chart_buckets


def test_chart_buckets_share_one_time_axis_and_keep_empty_steps() -> None:
    rows = [{"tool": "a", "bucket_start": 0.0, "calls": 4, "rejections": 1},
            {"tool": "b", "bucket_start": 2400.0, "calls": 2, "rejections": 2}]
    buckets = chart_buckets(rows)
    assert [len(series) for series in buckets.values()] == [24, 24]
    assert [(b.calls, b.rejected) for b in buckets["a"] if b.calls] == [(4, 1)]
    assert buckets["a"][0].label == buckets["b"][0].label == "1970-01-01 00:00 UTC"
    assert (buckets["b"][-1].calls, buckets["b"][-1].rate) == (2, 1.0)
