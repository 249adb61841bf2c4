"""Small charts as inline SVG, drawn on the server: no script, no build step, and the strict
Content-Security-Policy allows them (they are markup, styled by the page's stylesheet)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.routes.ui_markup import Html, join, render


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


def count_chart(items: Sequence[tuple[str, int]], width: int = 420, row: int = 22) -> Html:
    """Horizontal bars, one per (label, count), longest first as given; labels are drawn as text."""
    if not items:
        return render('<span class="muted">none yet</span>')
    label_width = width * 0.55
    most = max(count for _, count in items) or 1
    rows = []
    for index, (label, count) in enumerate(items):
        shown = label if len(label) <= 40 else label[:39] + "…"  # the whole of it on hover
        y = index * row
        bar = max((width - label_width - 40) * count / most, 2.0)
        rows.append(render(
            '<g class="row"><title>{label}: {count}</title>'
            '<text class="name" x="0" y="{ty}">{shown}</text>'
            '<rect class="bad" x="{bx}" y="{by}" width="{bar}" height="{bh}"/>'
            '<text class="count" x="{cx}" y="{ty}">{count}</text></g>',
            label=label, shown=shown, count=count, ty=y + row * 0.68, bx=f"{label_width:.0f}", by=y + 4, bh=row - 8,
            bar=f"{bar:.1f}", cx=f"{label_width + bar + 6:.1f}"))
    height = row * len(items)
    return render('<svg class="chart" role="img" viewBox="0 0 {w} {h}" width="{w}" height="{h}">{rows}</svg>',
                  w=width, h=height, rows=join(rows))
