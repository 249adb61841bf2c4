"""The report page's comparison (`/ui?by=model`, `upstream`, `key` or `tool`) and its renames per
model with the alias lines they suggest, rendered from `telemetry.store.compare`'s and
`telemetry.store.report`'s shapes. Every rate is shown with the counts behind it, and marked when
they are a small sample: 33% (2 of 6, small sample)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gateway.ui.layout import breakable, notice, number, rate, table
from gateway.ui.markup import EMPTY, Html, join, render, when
from telemetry.store.compare import GROUPINGS

_NO_GROUP = {"model": "no model", "upstream": "no upstream", "key": "no key", "tool": "no tool"}


def compare_links(current: str | None) -> Html:
    """Links to the comparison by each grouping, the one shown marked."""
    links = [render('<a href="/ui?by={by}#compared"{mark}>{by}</a>', by=by,
                    mark=Html(' aria-current="true"') if by == current else EMPTY) for by in GROUPINGS]
    return render('<p class="compare-by">Compare, each rate with its counts, by {links}</p>',
                  links=join(links, " · "))


def _counts(share: Mapping[str, Any]) -> str:
    small = ", small sample" if share["small_sample"] and share["of"] else ""
    return f"({share['count']:,} of {share['of']:,}{small})"


def _share(share: Mapping[str, Any]) -> Html:
    """A cell: the rate, and the counts behind it (sortable by the rate)."""
    value = share["rate"] if share["rate"] is not None else -1
    return render('<td class="num" data-value="{value}">{rate} <span class="muted">{counts}</span></td>',
                  value=value, rate=rate(share["rate"]), counts=_counts(share))


def _reasons(by_reason: Mapping[str, Mapping[str, Any]]) -> Html:
    return join((render("{reason} {count}", reason=reason, count=share["count"]) for reason, share in
                 by_reason.items()), "; ") or render('<span class="muted">-</span>')


def _rounds(rounds: Mapping[str, Any]) -> Html:
    small = ", small sample" if rounds["small_sample"] and rounds["requests"] else ""
    mean = "-" if rounds["mean"] is None else f"{rounds['mean']:.2f}"
    return render('<td class="num" data-value="{value}">{mean} <span class="muted">({rounds} in {requests}'
                  '{small})</span></td>', value=rounds["mean"] if rounds["mean"] is not None else -1, mean=mean,
                  rounds=f"{rounds['rounds']:,}", requests=f"{rounds['requests']:,}", small=small)


def _name(by: str, name: str | None) -> Html:
    return render("<code>{name}</code>", name=breakable(name)) if name is not None else \
        render('<span class="muted">{none}</span>', none=_NO_GROUP[by])


def compared_section(figures: Mapping[str, Any]) -> Html:
    """The comparison: a row a group."""
    by = figures["by"]
    rows = [render('<tr data-group="{group}"><td>{name}</td>{calls}{requests}{rejected}<td>{reasons}</td>'
                   '{verbatim}{recovered}{rounds}</tr>', group=group[by] or "", name=_name(by, group[by]),
                   calls=number(group["calls"]), requests=number(group["requests"]),
                   rejected=_share(group["rejections"]), reasons=_reasons(group["rejections_by_reason"]),
                   verbatim=_share(group["verbatim_retries"]), recovered=_share(group["recoveries"]),
                   rounds=_rounds(group["rounds_per_request"]))
            for group in figures["groups"]]
    listed = table([(by, False), ("calls", True), ("requests", True), ("rejected (of calls)", False),
                    ("by reason", False), ("verbatim retries (of failed calls)", True),
                    ("recovered (of failures)", True), ("rounds per request", True)], rows, "compared") \
        if rows else notice(f"Nothing recorded to compare by {by}.")
    return render('<section class="card" id="compared"><h2>Compared by {by}</h2>{links}'
                  '<p class="muted">A small sample: fewer than {under} counted; one more or less moves its rate '
                  'by several points.</p>{listed}</section>', by=by, links=compare_links(by),
                  under=figures["small_sample_under"], listed=listed)


def renames_section(renames: Sequence[Mapping[str, Any]], aliases: Sequence[Mapping[str, Any]]) -> Html:
    """The renames per tool and model, how many of their calls recovered, and the alias lines to add."""
    if not renames:
        return EMPTY
    no_name = render('<span class="muted">no close name</span>')
    rows = [render('<tr class="renamed"><td><code>{tool}</code></td><td>{model}</td><td><code>{sent}</code></td>'
                   '<td>{accepted}</td>{count}{recovered}</tr>', tool=breakable(item["tool"]),
                   model=_name("model", item["model"]), sent=breakable(item["from"]), count=number(item["count"]),
                   recovered=number(item["recovered"]),
                   accepted=render("<code>{a}</code>", a=breakable(item["to"])) if item["to"] else no_name)
            for item in renames]
    lines = when(aliases, render(
        '<h3>Aliases to add to the settings</h3><p class="muted">The gateway then takes these names for the '
        'accepted ones, and the model saves the round a rejection costs it.</p><pre class="aliases"><code>{toml}'
        '</code></pre>', toml="\n\n".join(str(alias["toml"]) for alias in aliases)))
    return render('<section class="card"><h2>Renamed arguments, per model</h2>{table}{lines}</section>',
                  table=table([("tool", False), ("model", False), ("name sent", False), ("accepted name", False),
                               ("times", True), ("recovered", True)], rows, "renamed"), lines=lines)
