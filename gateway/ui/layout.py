"""The frame every /ui page shares, and the small pieces the views have in common: times,
numbers, outcome tags, trace links."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from gateway.ui.markup import EMPTY, Html, escape, render, when

_TRACE_ID = re.compile(r"[0-9a-f]{32}")
_AFTER_SEPARATOR = re.compile(r"(?<=[_./-])")
BREAK_RUN = 16
NAV = (("/ui", "Report"), ("/ui/trajectories", "Trajectories"), ("/ui/approvals", "Approvals"))


def page(title: str, body: Html, current: str | None = None, signed_in: bool = False) -> Html:
    nav = [render('<a href="{href}"{mark}>{label}</a>', href=href, label=label,
                  mark=Html(' aria-current="page"') if href == current else EMPTY) for href, label in NAV]
    sign_out = when(signed_in, render('<form class="sign-out" method="post" action="/ui/logout">'
                                      '<button type="submit">Sign out</button></form>'))
    return render(
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<title>{title} · toolspan</title><link rel="stylesheet" href="/ui/assets/ui.css"></head>'
        '<body><header><strong>toolspan</strong><nav>{nav}</nav>{sign_out}</header>'
        '<main><h1>{title}</h1>{body}</main><script src="/ui/assets/ui.js"></script></body></html>',
        title=title, nav=Html(" ".join(nav)), sign_out=sign_out, body=body)


def when_at(seconds: float | None) -> Html:
    """A time, in UTC; the page's script shows it in the reader's zone."""
    if seconds is None:
        return render('<span class="muted">-</span>')
    moment = datetime.fromtimestamp(seconds, UTC)
    return render('<time datetime="{iso}">{text}</time>', iso=moment.isoformat(timespec="milliseconds"),
                  text=moment.strftime("%Y-%m-%d %H:%M:%S UTC"))


def ms(duration: float | None) -> str:
    if duration is None:
        return "-"
    return f"{duration:.2f} ms" if duration < 10 else f"{duration:,.0f} ms"


def rate(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def number(value: Any) -> Html:
    """A table cell holding a number, sortable by its value."""
    shown = "-" if value is None else f"{value:,}" if isinstance(value, int) else f"{value:.2f}"
    return render('<td class="num" data-value="{value}">{shown}</td>', value=value if value is not None else -1,
                  shown=shown)


def tag(text: object, kind: object = None) -> Html:
    return render('<span class="tag {kind}">{text}</span>', kind=kind if kind is not None else text, text=text)


def trace_link(trace_id: str | None, template: str | None) -> Html:
    """A trace id, linked to the trace UI when one is configured (the id is checked to be one:
    it goes into a URL)."""
    if not trace_id:
        return EMPTY
    if template is None or not _TRACE_ID.fullmatch(trace_id):
        return render('<code class="trace">{id}</code>', id=trace_id)
    return render('<a class="trace" href="{href}" rel="noreferrer" target="_blank"><code>{id}</code></a>',
                  href=template.replace("{trace_id}", trace_id), id=trace_id)


def trajectory_link(trajectory_id: str, shown: str | None = None) -> Html:
    """A link to a trajectory by its stored id, showing `shown` (the id its caller knows) or that id."""
    return render('<a href="/ui/trajectories/{path}"><code>{id}</code></a>', path=quote(trajectory_id, safe=""),
                  id=shown or trajectory_id)


def key_cell(key: str | None) -> Html:
    """The table cell naming the gateway key a trajectory is of."""
    return render('<td class="key">{key}</td>', key=key) if key else render('<td class="key muted">-</td>')


def notice(text: str) -> Html:
    return render('<p class="muted">{text}</p>', text=text)


def table(headers: list[tuple[str, bool]], rows: list[Html], table_id: str | None = None) -> Html:
    """A sortable table: headers as (title, numeric), rows as `<tr>` markup."""
    head = Html("".join(render('<th{cls}>{title}</th>', title=title, cls=Html(' class="num"') if numeric else EMPTY)
                        for title, numeric in headers))
    return render('<div class="scroll"><table class="sortable"{id}><thead><tr>{head}</tr></thead>'
                  '<tbody>{rows}</tbody></table></div>',
                  id=render(' id="{id}"', id=table_id) if table_id else EMPTY, head=head, rows=Html("".join(rows)))


def escape_all(values: list[Any]) -> Html:
    return Html(", ".join(escape(v) for v in values))


def breakable(name: object) -> Html:
    """A name (a tool's, an argument's, a model's: up to 64 characters, rarely a space) that may
    wrap after each `_ - . /` and within any run of more than BREAK_RUN characters without one: a
    table then fits its box, and narrows a column no further than such a run. The name whole is
    its title, so the markup holds it as it is (a search of the page's source finds it)."""
    text = str(name)
    runs = [piece[start:start + BREAK_RUN] for piece in _AFTER_SEPARATOR.split(text)
            for start in range(0, len(piece), BREAK_RUN)]
    if len(runs) < 2:
        return escape(text)
    return render('<span title="{name}">{runs}</span>', name=text, runs=Html("<wbr>".join(escape(r) for r in runs)))


def breakable_all(values: list[Any]) -> Html:
    return Html(", ".join(breakable(v) for v in values))


def plural(count: int, noun: str) -> str:
    return f"{count:,} {noun}" if count == 1 else f"{count:,} {noun}s"
