"""The report page and the trajectory list, rendered from `telemetry.store.report`'s shapes (the report,
the rejections over time, the trajectory summaries)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gateway.ui.charts import Bucket, count_chart, rejection_rate_chart
from gateway.ui.compare import compare_links, compared_section, renames_section
from gateway.ui.layout import (
    breakable,
    breakable_all,
    key_cell,
    ms,
    notice,
    number,
    rate,
    table,
    tag,
    trace_link,
    trajectory_link,
    when_at,
)
from gateway.ui.markup import EMPTY, Html, join, render, when
from telemetry.store.rows import guardrail_words

CHART_BUCKETS = 24
TRACES_SHOWN = 5  # trace links in a trajectory's row of the list
SINCE_CHOICES = (("", "any time"), ("3600", "last hour"), ("86400", "last day"), ("604800", "last week"))
OUTCOME_CHOICES = ("", "ok", "repaired", "rejected", "error", "timeout", "interrupted", "cancelled")


@dataclass(frozen=True)
class ListFilters:
    """The trajectory list's filters, as the page's form sends them."""

    tool: str | None = None
    outcome: str | None = None
    model: str | None = None
    within_seconds: int | None = None  # active this recently


def chart_buckets(rows: Sequence[Mapping[str, Any]], buckets: int = CHART_BUCKETS) -> dict[str, list[Bucket]]:
    """Each tool's calls over the whole period the rows cover, in `buckets` equal steps (empty
    steps included, so that every tool's chart has the same time axis)."""
    if not rows:
        return {}
    first = min(float(row["bucket_start"]) for row in rows)
    last = max(float(row["bucket_start"]) for row in rows)
    step = max((last - first) / buckets, 1.0) if last > first else 1.0
    count = min(buckets, int((last - first) / step) + 1)
    totals: dict[str, list[list[int]]] = defaultdict(lambda: [[0, 0] for _ in range(count)])
    for row in rows:
        index = min(int((float(row["bucket_start"]) - first) / step), count - 1)
        cell = totals[str(row["tool"])][index]
        cell[0] += int(row["calls"])
        cell[1] += int(row["rejections"])
    labels = [datetime.fromtimestamp(first + i * step, UTC).strftime("%Y-%m-%d %H:%M UTC") for i in range(count)]
    return {tool: [Bucket(labels[i], calls, rejected) for i, (calls, rejected) in enumerate(cells)]
            for tool, cells in totals.items()}


def _reasons(by_reason: Mapping[str, Mapping[str, Any]]) -> Html:
    return join((render("{reason} {count}", reason=reason, count=figure["count"]) for reason, figure in
                 by_reason.items()), "; ") or render('<span class="muted">-</span>')


def _recovery(figures: Mapping[str, Any]) -> str:
    rounds = figures.get("rounds_to_recover")
    return f"{rounds['mean']:.1f} (max {rounds['max']})" if rounds else "-"


def _figure_cells(figures: Mapping[str, Any]) -> Html:
    retries = figures["retries"]
    return join([
        number(figures["calls"]), number(figures["rejections"]),
        render('<td class="num">{rate}</td>', rate=rate(figures["rejection_rate"])),
        render("<td>{reasons}</td>", reasons=_reasons(figures["rejections_by_reason"])),
        number(retries["verbatim"]), number(retries["corrected"]),
        render('<td class="num">{recovered} of {failures} ({rate})</td>', recovered=figures["recoveries"],
               failures=figures["failures"], rate=rate(figures["recovery_rate"])),
        render('<td class="num">{rounds}</td>', rounds=_recovery(figures))])


_FIGURE_HEADERS = [("calls", True), ("rejected", True), ("rejection rate", True), ("by reason", False),
                   ("verbatim retries", True), ("corrected retries", True), ("recovered", True),
                   ("rounds to recover", True)]


def _tools_table(tools: Sequence[Mapping[str, Any]], charts: Mapping[str, list[Bucket]]) -> Html:
    rows = [render('<tr data-tool="{tool}" data-side="{side}"><td><code>{name}</code>{client}</td>{cells}'
                   '<td>{chart}</td></tr>', tool=row["tool"], name=breakable(row["tool"]),
                   side=row.get("side", "gateway"),
                   client=when(row.get("side") == "client", render(' <span class="muted">client tool</span>')),
                   cells=_figure_cells(row),
                   chart=rejection_rate_chart(charts.get(row["tool"], [])))
            for row in tools]
    return table([("tool", False), *_FIGURE_HEADERS, ("rejection rate over time", False)], rows, "tools")


def _models_table(models: Sequence[Mapping[str, Any]]) -> Html:
    rows = [render("<tr><td><code>{model}</code></td>{cells}</tr>", model=breakable(row["model"]),
                   cells=_figure_cells(row))
            for row in models]
    return table([("model", False), *_FIGURE_HEADERS], rows, "models")


def top_renames(tools: Sequence[Mapping[str, Any]], top: int = 10) -> list[tuple[str, str, str | None, int]]:
    """(tool, name sent, name accepted or None, count), most frequent first."""
    found = [(str(row["tool"]), str(rename["from"]), rename["to"], int(rename["count"]))
             for row in tools for rename in row["renames"]]
    return sorted(found, key=lambda item: -item[3])[:top]


def _renames(tools: Sequence[Mapping[str, Any]]) -> Html:
    renames = top_renames(tools)
    chart = count_chart([(f"{tool}: {sent} → {accepted or '?'}", count) for tool, sent, accepted, count in renames])
    no_name = render('<span class="muted">no close name</span>')
    rows = [render('<tr class="rename"><td><code>{tool}</code></td><td><code>{sent}</code></td>'
                   '<td>{accepted}</td>{count}</tr>', tool=breakable(tool), sent=breakable(sent), count=number(count),
                   accepted=render("<code>{a}</code>", a=breakable(accepted)) if accepted else no_name)
            for tool, sent, accepted, count in renames]
    listed = table([("tool", False), ("name sent", False), ("accepted name", False), ("times", True)], rows,
                   "renames") if rows else EMPTY
    return render("{chart}{listed}", chart=chart, listed=listed)


def _stuck(stuck: Sequence[Mapping[str, Any]]) -> Html:
    if not stuck:
        return notice("No trajectory re-sent a failed call verbatim again and again.")
    keyed = any(item.get("key") for item in stuck)
    rows = [render("<tr><td>{link}</td>{key}<td><code>{tool}</code></td><td>{model}</td>{count}</tr>",
                   link=trajectory_link(str(item["trajectory_id"]), item.get("local_id")),
                   key=when(keyed, key_cell(item.get("key"))), tool=breakable(item["tool"]), model=item["model"] or "-",
                   count=number(item["verbatim_retries"])) for item in stuck]
    return table([("trajectory", False), *(_KEY_HEADER if keyed else []), ("tool", False), ("model", False),
                  ("verbatim retries in a row", True)], rows, "stuck")


def _guardrails(guardrails: Mapping[str, Any] | None) -> Html:
    """What guardrails decided (none: nothing), by guardrail and decision, and the calls they stopped."""
    if not guardrails or not guardrails.get("decisions"):
        return EMPTY
    failures = guardrails.get("failures") or {}
    counts = [render('<tr data-guardrail="{name}"><td><code>{shown}</code></td><td>{decision}</td>{count}{failed}</tr>',
                     name=item["guardrail"], shown=breakable(item["guardrail"]), decision=tag(item["decision"]),
                     count=number(item["count"]), failed=number(failures.get(item["guardrail"], 0)))
              for item in guardrails["decisions"]]
    stopped = [render('<tr><td>{link}</td><td>{when}</td><td><code>{tool}</code></td><td>{words}</td></tr>',
                      link=trajectory_link(str(call["id"]), call.get("local_id")), when=when_at(call["started"]),
                      tool=breakable(call["tool"]), words=guardrail_words(dict(call)))
               for call in guardrails.get("stopped") or ()]
    listed = when(stopped, render(
        '<h3>Calls a guardrail stopped ({n})</h3>{table}', n=f"{guardrails['stopped_calls']:,}",
        table=table([("trajectory", False), ("when", False), ("tool", False), ("what the guardrail did", False)],
                    stopped, "guardrail-stopped")))
    return render('<section class="card"><h2>Guardrails</h2>{counts}{listed}</section>', listed=listed,
                  counts=table([("guardrail", False), ("decision", False), ("decisions", True),
                                ("guardrail failures", True)], counts, "guardrails"))


def _totals(report: Mapping[str, Any]) -> Html:
    overall = report["overall"]
    items = [("trajectories", f"{report['trajectories']:,}"), ("tool calls", f"{report['tool_calls']:,}"),
             ("model turns", f"{report['model_turns']:,}"), ("rejection rate", rate(overall["rejection_rate"])),
             ("recovery rate", rate(overall["recovery_rate"])),
             ("tokens in / out", f"{report['input_tokens']:,} / {report['output_tokens']:,}")]
    return render('<dl class="totals">{items}</dl>', items=join(
        render("<div><dt>{name}</dt><dd>{value}</dd></div>", name=name, value=value) for name, value in items))


def report_page(report: Mapping[str, Any], over_time: Sequence[Mapping[str, Any]],
                recent: Sequence[Mapping[str, Any]], trace_ui: str | None,
                compared: Mapping[str, Any] | None = None) -> Html:
    """The report: per tool and per model, the renames, the stuck trajectories, the latest ones;
    and the comparison asked for (`compared`), first."""
    if not report["tool_calls"] and not report["model_turns"]:
        return notice("No trajectory recorded yet: send a request through the gateway (or run toolspan demo).")
    return render(
        '{totals}{compared}<section class="card"><h2>Tools</h2>{tools}<p><a href="/ui/replay">Replay the '
        'recorded calls against the tools served now</a>: which rejections would pass, which passes would '
        'break.</p></section>'
        '<div class="grid"><section class="card"><h2>Top renames</h2>'
        '<p class="muted">Argument names the models sent that the tool does not accept, and the name '
        'the diagnostic suggested.</p>{renames}</section>'
        '<section class="card"><h2>Stuck in verbatim retries</h2>{stuck}</section></div>'
        '<section class="card"><h2>Models</h2>{links}{models}</section>{renamed}{guardrails}'
        '<section class="card"><h2>Latest trajectories</h2>{recent}<p><a href="/ui/trajectories">All '
        'trajectories</a></p></section>',
        guardrails=_guardrails(report.get("guardrails")),
        compared=compared_section(compared) if compared is not None else EMPTY,
        links=compare_links(None), renamed=renames_section(report.get("renames") or [], report.get("aliases") or []),
        totals=_totals(report), tools=_tools_table(report["tools"], chart_buckets(over_time)),
        renames=_renames(report["tools"]), stuck=_stuck(report["stuck"]), models=_models_table(report["models"]),
        recent=trajectory_table(recent, trace_ui))


_KEY_HEADER = [("key", False)]  # the gateway key's column, where any row has a key


def _traces(trace_ids: Sequence[str], trace_ui: str | None) -> Html:
    """A trajectory's first traces (one a request; a caller can make thousands), and how many more
    its own page lists."""
    shown = join((trace_link(trace_id, trace_ui) for trace_id in trace_ids[:TRACES_SHOWN]), " ")
    more = len(trace_ids) - TRACES_SHOWN
    return shown if more <= 0 else render('{shown} <span class="muted">and {more} more</span>', shown=shown,
                                          more=f"{more:,}")


def trajectory_table(rows: Sequence[Mapping[str, Any]], trace_ui: str | None) -> Html:
    if not rows:
        return notice("No trajectory matches.")
    keyed = any(row.get("key") for row in rows)
    body = [render(
        "<tr><td>{link}{stuck}</td>{key}<td>{ended}</td>{requests}{turns}{calls}{failed}{rejections}{retries}"
        '<td class="names">{models}</td><td class="names">{tools}</td><td>{traces}</td></tr>',
        link=trajectory_link(str(row["id"]), row.get("local_id")), key=when(keyed, key_cell(row.get("key"))),
        stuck=when(row["stuck"], render(" {tag}", tag=tag("stuck", "verbatim"))),
        ended=when_at(row["ended"]), requests=number(row["requests"]), turns=number(row["model_turns"]),
        calls=number(row["tool_calls"]), failed=number(row["failed_calls"]), rejections=number(row["rejections"]),
        retries=number(row["retries"]), models=breakable_all(row["models"]), tools=breakable_all(row["tools"]),
        traces=_traces(row["trace_ids"], trace_ui))
        for row in rows]
    return table([("trajectory", False), *(_KEY_HEADER if keyed else []), ("last active", False), ("requests", True),
                  ("model turns", True),
                  ("tool calls", True), ("failed", True), ("rejected", True), ("retries", True), ("models", False),
                  ("tools", False), ("traces", False)], body, "trajectories")


def _option(value: str, label: str, chosen: str) -> Html:
    return render('<option value="{value}"{selected}>{label}</option>', value=value, label=label,
                  selected=Html(" selected") if value == chosen else EMPTY)


def list_page(rows: Sequence[Mapping[str, Any]], filters: ListFilters, trace_ui: str | None) -> Html:
    since = str(filters.within_seconds or "")
    form = render(
        '<form class="filters" method="get" action="/ui/trajectories">'
        '<label>tool<input name="tool" value="{tool}"></label>'
        '<label>outcome<select name="outcome">{outcomes}</select></label>'
        '<label>model<input name="model" value="{model}"></label>'
        '<label>active<select name="since">{since}</select></label><button type="submit">Filter</button>'
        '<label>find on this page<input id="row-filter" type="search" placeholder="id, tool, model"></label></form>',
        tool=filters.tool or "", model=filters.model or "",
        outcomes=join(_option(o, o or "any", filters.outcome or "") for o in OUTCOME_CHOICES),
        since=join(_option(value, label, since) for value, label in SINCE_CHOICES))
    return render("{form}{table}", form=form, table=trajectory_table(rows, trace_ui))


def duration_of(row: Mapping[str, Any]) -> str:
    return ms((float(row["ended"]) - float(row["started"])) * 1000)
