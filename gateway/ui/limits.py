"""The Limits section of the report page (/ui): each gateway key's usage of its limits against
their bounds, as GET /v1/limits has it (gateway.limits.usage): the signed-in key's own, every key's
for the operator's key (and, without keys, the one caller's). Shown only where limits are
configured; read when the page is, like the rest of it."""

from __future__ import annotations

import math
from collections.abc import Sequence

from aiohttp import web

from gateway.http.keys import LOOP, SETTINGS
from gateway.limits.gate import Usage
from gateway.limits.usage import KeyUsage, amount, figure, usage_of
from gateway.state.base import StateUnavailable
from gateway.ui.layout import key_cell, notice, table, when_at
from gateway.ui.markup import EMPTY, Html, render, when

NEARLY_SPENT = 0.8  # of a bound: where the meter turns to its warning colour
SECONDS_SHOWN = 3600  # a reset sooner than this is said in seconds, a later one as a time


def _resets(usage: Usage) -> Html:
    if usage.resets_in is None or usage.resets_in <= 0 or usage.resets_at is None:
        return render('<span class="muted">-</span>')
    if usage.resets_in < SECONDS_SHOWN:
        return render("in {seconds} s", seconds=math.ceil(usage.resets_in))
    return when_at(usage.resets_at)


def _figure(usage: Usage, value: int) -> Html:
    shown = amount(usage, value)
    return render('<td class="num" data-value="{value}">{text}</td>', value=shown, text=figure(shown))


def _row(key: str | None, usage: Usage, keyed: bool) -> Html:
    return render(
        '<tr data-key="{key}" data-limit="{limit}">{key_cell}<td><code>{limit}</code></td>{used}{bound}{left}'
        '<td><meter min="0" max="{bound_value}" value="{used_value}" high="{high}" optimum="0"></meter> {percent}'
        '</td><td>{resets}</td></tr>',
        key=key or "", limit=usage.limit, key_cell=when(keyed, key_cell(key)), used=_figure(usage, usage.used),
        bound=_figure(usage, usage.bound), left=_figure(usage, usage.remaining), bound_value=usage.bound,
        used_value=min(usage.used, usage.bound), high=usage.bound * NEARLY_SPENT,
        percent=f"{100 * usage.used / usage.bound:.0f}%", resets=_resets(usage))


def limits_section(found: Sequence[KeyUsage], keyed: bool) -> Html:
    """The section: one row a limit of each key; a key without limits of its own says so."""
    rows = [_row(entry.key, usage, keyed) for entry in found for usage in entry.limits]
    bare = [entry.key or "-" for entry in found if not entry.limits]
    headers = [*([("key", False)] if keyed else []), ("limit", False), ("used", True), ("bound", True),
               ("left", True), ("of the bound", False), ("window frees", False)]
    return render(
        '<section class="card" id="limits"><h2>Limits</h2><p class="muted">What each key has used in the '
        'current window of each of its limits (a sliding minute; a day and a month in UTC; requests at once), '
        'as of this page.</p>{table}{bare}</section>',
        table=table(headers, rows, "limit-usage") if rows else EMPTY,
        bare=when(bare, notice(f"Without limits: {', '.join(str(name) for name in bare)}.")))


async def limits_view(request: web.Request, key: str | None) -> Html:
    """The section for a viewer who sees `key`'s trajectories (None: every key's); nothing without
    limits configured."""
    limiter = request.app[LOOP].limiter
    if limiter is None:
        return EMPTY
    keys = request.app[SETTINGS].keys
    names: list[str | None] = [None] if not keys else [*sorted(keys)] if key is None else [key]
    try:
        found = await usage_of(limiter, names)
    except StateUnavailable:
        return render('<section class="card" id="limits"><h2>Limits</h2>{said}</section>',
                      said=notice("The keys' counts cannot be read now: the shared state is unreachable."))
    return limits_section(found, bool(keys))

