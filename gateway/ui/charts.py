"""Small charts as inline SVG, drawn on the server: no script, no build step, and the strict
Content-Security-Policy allows them (they are markup, styled by the page's stylesheet)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.ui.markup import Html, join, render


@dataclass(frozen=True)
class Bucket:
    """One time bucket of one tool's calls."""

    label: str  # when the bucket starts, as the page shows it
    calls: int
    rejected: int

    @property
    def rate(self) -> float:
        return self.rejected / self.calls if self.calls else 0.0


def percent(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "-"


def rejection_rate_chart(buckets: Sequence[Bucket], width: int = 160, height: int = 36) -> Html:
    """Rejection rate per bucket as columns on a 0-100% scale; a bucket without calls stays empty.
    Each column names its bucket, its rejections and its calls on hover."""
    if not buckets:
        return render('<span class="muted">no calls</span>')
    step = width / len(buckets)
    columns = []
    for index, bucket in enumerate(buckets):
        x = index * step
        bar = max(bucket.rate * (height - 2), 1.0 if bucket.rejected else 0.0)
        columns.append(render(
            '<g class="column"><title>{title}</title>'
            '<rect class="slot" x="{x}" y="0" width="{w}" height="{h}"/>'
            '<rect class="{kind}" x="{x}" y="{y}" width="{w}" height="{bar}"/></g>',
            title=f"{bucket.label}: {bucket.rejected} of {bucket.calls} calls rejected "
                  f"({percent(bucket.rejected, bucket.calls)})",
            x=f"{x + 1:.1f}", w=f"{max(step - 2, 1):.1f}", h=height, y=f"{height - bar:.1f}", bar=f"{bar:.1f}",
            kind="bad" if bucket.rejected else "good"))
    return render('<svg class="chart" role="img" viewBox="0 0 {w} {h}" width="{w}" height="{h}">'
                  '<desc>{desc}</desc>{columns}</svg>',
                  w=width, h=height, columns=join(columns),
                  desc=f"Rejection rate over {len(buckets)} time buckets, from {buckets[0].label}")


def count_chart(items: Sequence[tuple[str, int]]) -> Html:
    """Horizontal bars, one per (label, count), in the order given. Laid out by the stylesheet, not
    drawn as SVG text: the server cannot measure text, and a label drawn at a fixed x runs under
    its bar; in a grid column the browser cuts it with an ellipsis (the whole of it on hover)."""
    if not items:
        return render('<span class="muted">none yet</span>')
    most = max(count for _, count in items) or 1
    rows = [render(
        '<div class="row"><span class="name" title="{label}">{label}</span>'
        '<svg class="bar" viewBox="0 0 100 10" preserveAspectRatio="none" aria-hidden="true">'
        '<rect class="bad" x="0" y="0" width="{bar}" height="10"/></svg><span class="count">{count}</span></div>',
        label=label, count=f"{count:,}", bar=f"{max(100 * count / most, 1.0):.1f}")
        for label, count in items]
    return render('<div class="chart bars">{rows}</div>', rows=join(rows))
