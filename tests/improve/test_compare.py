"""Models compared (telemetry.store.compare): on the two-model session, `report --by model`,
`--by upstream` and `--by key` give the figures counted by hand in tests.improve.session, each rate
with its counts and marked a small sample; the renames per model with how many recovered, and the
alias line they suggest, in the report, the terminal and on the page."""

from __future__ import annotations

import json
import sqlite3
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.cli.main import main
from gateway.settings.model import Settings
from gateway.tools import Param, Tool, ToolRegistry
from telemetry.store import compare, report, report_text
from telemetry.store.calls import failure_runs
from telemetry.store.renames import alias_suggestions, alias_toml
from telemetry.store.schema import connect
from tests.improve import session as scripted
from tests.improve.conftest import Session

A, B = scripted.MODEL_A, scripted.MODEL_B
# What each model's trajectories are also grouped as: the upstream its turns went to, the key that asked.
NAMES = {"model": {A: A, B: B}, "upstream": {A: "primary", B: "secondary"}, "key": {A: "alpha", B: "beta"}}
V4_SCHEMA = Path(__file__).parents[1] / "telemetry" / "store" / "schema_v4.sql"


def _by(figures: dict[str, Any]) -> dict[str | None, dict[str, Any]]:
    return {group[figures["by"]]: group for group in figures["groups"]}


def _assert_hand_counted(group: dict[str, Any], model: str) -> None:
    calls, rejected = scripted.CALLS_BY_MODEL[model], scripted.REJECTED_BY_MODEL[model]
    assert (group["calls"], group["requests"]) == (calls, scripted.REQUESTS_BY_MODEL[model])
    assert group["rejections"] == compare.share(sum(rejected.values()), calls)
    assert {reason: (r["count"], r["of"]) for reason, r in group["rejections_by_reason"].items()} == {
        reason: (n, calls) for reason, n in rejected.items()}
    failed = sum(rejected.values())  # every failed call of the session was a rejection
    assert group["verbatim_retries"] == compare.share(scripted.VERBATIM_BY_MODEL[model], failed)
    assert group["recoveries"] == compare.share(scripted.RECOVERIES_BY_MODEL[model], scripted.FAILURES_BY_MODEL[model])
    rounds, requests = scripted.ROUNDS_BY_MODEL[model], scripted.REQUESTS_BY_MODEL[model]
    assert group["rounds_per_request"] == {"rounds": rounds, "requests": requests, "mean": rounds / requests,
                                           "small_sample": True}


@pytest.mark.parametrize("by", ["model", "upstream", "key"])
def test_the_figures_by_model_upstream_and_key_equal_the_hand_count(improve_session: Session, by: str) -> None:
    figures = compare.compared(improve_session.db, by)
    assert (figures["trajectories"], figures["tool_calls"]) == (len(scripted.TRAJECTORIES), scripted.CALLS)
    groups = _by(figures)
    assert set(groups) == set(NAMES[by].values())
    for model, name in NAMES[by].items():
        _assert_hand_counted(groups[name], model)


def test_one_keys_comparison_holds_only_its_trajectories(improve_session: Session) -> None:
    figures = compare.compared(improve_session.db, "model", key="beta")
    assert list(_by(figures)) == [B]
    _assert_hand_counted(_by(figures)[B], B)
    assert [r["model"] for r in figures["renames"]] == [B]


def test_by_tool_a_request_counts_for_each_tool_it_called(improve_session: Session) -> None:
    groups = _by(compare.compared(improve_session.db, "tool"))
    # read_file: 3 of A's calls in 2 requests, 3 of B's in 2 (one of them beside an add).
    assert {tool: (g["calls"], g["requests"]) for tool, g in groups.items()} == {
        "read_file": (6, 4), "add": (3, 2), "search": (2, 1), "login": (1, 1)}
    assert groups["login"]["recoveries"] == {"count": 0, "of": 0, "rate": None, "small_sample": True}


def test_a_rate_is_a_small_sample_under_thirty_counted() -> None:
    assert compare.share(2, 6) == {"count": 2, "of": 6, "rate": 2 / 6, "small_sample": True}
    assert compare.share(29, 29)["small_sample"]
    assert not compare.share(3, 30)["small_sample"]
    assert compare.share(0, 0)["rate"] is None
    assert report_text.share(compare.share(2, 6), "calls") == "33% (2 of 6 calls, small sample)"
    assert report_text.share(compare.share(10, 40)) == "25% (10 of 40)"


def _hand_counted_renames() -> list[tuple[str, str | None, str, str | None, int, int]]:
    return sorted((tool, model, sent, accepted, count, recovered)
                  for model, renames in scripted.RENAMES_BY_MODEL.items()
                  for (tool, sent, accepted), (count, recovered) in renames.items())


def test_the_renames_per_model_say_how_many_recovered_and_suggest_an_alias(improve_session: Session) -> None:
    for figures in (report.report(improve_session.db), compare.compared(improve_session.db, "model")):
        assert sorted((r["tool"], r["model"], r["from"], r["to"], r["count"], r["recovered"])
                      for r in figures["renames"]) == _hand_counted_renames()
        [alias] = figures["aliases"]  # filepath has no suggestion: no alias for it
        assert alias == {"tool": "read_file", "aliases": {"path": ["file_path"]}, "left_out": [],
                         "toml": '[tool_aliases.read_file]\npath = ["file_path"]'}
    lines = report_text.report(report.report(improve_session.db))
    assert "  read_file  model-a: 'file_path' -> path x1, recovered 1 of 1" in lines
    assert "  read_file  model-b: 'filepath' -> (no close name) x2, recovered 0 of 2" in lines
    assert lines[lines.index("  [tool_aliases.read_file]") + 1] == '  path = ["file_path"]'


def test_an_alias_line_merges_a_tools_renames_one_table_a_tool() -> None:
    renames = [{"tool": "read_file", "side": "gateway", "model": m, "from": sent, "to": "path", "count": n,
                "recovered": 0} for m, sent, n in ((A, "file_path", 1), (B, "filepath", 3), (B, "file_path", 1))]
    renames.append({**renames[0], "tool": "theirs", "side": "client"})  # a client's tool: the client's to alias
    [alias] = alias_suggestions(renames)
    assert alias["toml"] == '[tool_aliases.read_file]\npath = ["filepath", "file_path"]'


names = st.text(min_size=1, max_size=20)


@given(tool=names, aliases=st.dictionaries(names, st.lists(names, min_size=1, max_size=3), min_size=1, max_size=3))
def test_an_alias_line_reads_back_as_the_names_it_was_made_of(tool: str, aliases: dict[str, list[str]]) -> None:
    assert tomllib.loads(alias_toml(tool, aliases)) == {"tool_aliases": {tool: aliases}}


PARAMETERS = ("path", "start_date", "end_date", "date")
sent_names = st.one_of(st.sampled_from((*PARAMETERS, "file_path", "Date", "x" * 64, "y" * 65)), st.text(max_size=80))
renames_made = st.lists(st.fixed_dictionaries({
    "tool": st.sampled_from(("read_file", "plan")), "side": st.sampled_from(("gateway", "client")), "model": st.just(A),
    "from": sent_names, "to": st.one_of(st.none(), st.sampled_from(PARAMETERS)), "count": st.integers(1, 5),
    "recovered": st.just(0)}), max_size=12)


def _noop(args: dict[str, Any]) -> str:
    return "ok"


@given(renames=renames_made)
def test_the_alias_lines_suggested_are_ones_the_gateway_starts_with(renames: list[dict[str, Any]]) -> None:
    """Every alias line, loaded as the settings load it and applied to tools whose parameters are the
    names the renames suggest, is taken; every name suggested is aliased, or left out with why."""
    suggested = alias_suggestions(renames)
    table = tomllib.loads("\n\n".join(alias["toml"] for alias in suggested)).get("tool_aliases", {})
    settings = Settings(tool_aliases=table)
    gateway_renames = [r for r in renames if r["side"] == "gateway" and r["to"] is not None]
    registry = ToolRegistry([Tool(name=name, function=_noop, parameters=[
        Param(p, "string") for p in sorted({r["to"] for r in gateway_renames if r["tool"] == name})])
        for name in ("read_file", "plan")])
    registry.use_aliases(settings.tool_aliases)  # raises ToolDeclarationError on a line it refuses
    aliased = {(tool, sent) for tool, params in table.items() for names in params.values() for sent in names}
    left_out = {(alias["tool"], left["name"]) for alias in suggested for left in alias["left_out"]}
    assert not aliased & left_out
    assert {(r["tool"], r["from"]) for r in gateway_renames} == aliased | left_out


def test_a_name_sent_for_two_parameters_gets_no_alias_line() -> None:
    made = [{"tool": "plan", "side": "gateway", "model": A, "from": sent, "to": meant, "count": 1, "recovered": 0}
            for sent, meant in (("date", "start_date"), ("date", "end_date"), ("when", "start_date"),
                                ("x" * 65, "end_date"), ("end_date", "start_date"))]
    [alias] = alias_suggestions(made)
    assert alias["aliases"] == {"start_date": ["when"]}
    assert [(left["name"], left["parameters"]) for left in alias["left_out"]] == [
        ("date", ["end_date", "start_date"]), ("end_date", ["start_date"]), ("x" * 65, ["end_date"])]
    assert alias["toml"].splitlines() == [
        "[tool_aliases.plan]", 'start_date = ["when"]',
        '# no alias for "date" (suggested for "end_date", "start_date"): an alias stands for one parameter',
        '# no alias for "end_date" (suggested for "start_date"): a parameter\'s own name',
        f'# no alias for "{"x" * 65}" (suggested for "end_date"): longer than 64 characters, which no name the '
        "gateway takes is"]


def test_a_comment_on_a_name_left_out_stays_one_line() -> None:
    left_out = [{"name": "a\nb = 1", "parameters": ["c\n[x]", "d\ud800"], "why": "an alias stands for one parameter"}]
    text = alias_toml("t", {}, left_out)
    assert tomllib.loads(text) == {"tool_aliases": {"t": {}}}
    assert len(text.splitlines()) == 2


def test_report_by_in_the_terminal_and_as_json(improve_session: Session, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(improve_session.path)
    assert main(["trajectories", "report", "--db", store, "--by", "model", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == compare.compared(improve_session.db, "model")
    assert main(["trajectories", "report", "--db", store, "--by", "model"]) == 0
    text = capsys.readouterr().out.splitlines()
    b = text.index("model-b: 6 calls, 3 requests")
    assert text[b + 1:b + 5] == [
        "    rejected: 50% (3 of 6 calls, small sample): missing_arguments 33% (2), schema_violation 17% (1)",
        "    recovered: 50% (1 of 2 failures, small sample), in 1.0 rounds on average (at most 1)",
        "    verbatim retries: 33% (1 of 3 failed calls, small sample); corrected: 33% (1 of 3, small sample)",
        "    rounds per request: 2.67 (8 rounds in 3 requests, small sample)"]
    assert main(["trajectories", "report", "--db", store, "--by", "key", "--key", "alpha"]) == 0
    text = capsys.readouterr().out
    assert "alpha: 6 calls, 3 requests" in text
    assert "beta" not in text
    with pytest.raises(SystemExit) as exited:
        main(["trajectories", "report", "--db", store, "--by", "colour"])
    assert exited.value.code == 2
    assert "invalid choice: 'colour'" in capsys.readouterr().err


def test_an_empty_store_compares_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    connect(str(tmp_path / "empty.sqlite3")).close()
    assert main(["trajectories", "report", "--db", str(tmp_path / "empty.sqlite3"), "--by", "upstream"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "nothing recorded to compare by upstream"
    db = sqlite3.connect(tmp_path / "empty.sqlite3")
    assert compare.compared(db, "model")["groups"] == [] == report.report(db)["renames"]


def test_a_store_written_before_upstreams_were_recorded(improve_session: Session, tmp_path: Path) -> None:
    """The session's rows in version 4's tables (before model turns named their upstream), migrated
    as the gateway migrates a store it opens: every turn's upstream is unknown, the rest holds."""
    old = sqlite3.connect(tmp_path / "v4.sqlite3", isolation_level=None)
    old.executescript(f"{V4_SCHEMA.read_text()}\nPRAGMA user_version = 4;")
    old.execute("ATTACH DATABASE ? AS session", (str(improve_session.path),))
    for table in ("trajectories", "requests", "model_turns", "tool_calls"):
        columns = ", ".join(row[1] for row in old.execute(f"PRAGMA main.table_info({table})"))
        old.execute(f"INSERT INTO main.{table} SELECT {columns} FROM session.{table}")
    old.close()
    migrated = connect(str(tmp_path / "v4.sqlite3"))
    [unknown] = compare.compared(migrated, "upstream")["groups"]
    assert unknown["upstream"] is None
    assert (unknown["calls"], unknown["rounds_per_request"]["rounds"]) == (
        scripted.CALLS, sum(scripted.ROUNDS_BY_MODEL.values()))
    for model, group in _by(compare.compared(migrated, "model")).items():
        assert model is not None
        _assert_hand_counted(group, model)
    assert "(no upstream): 12 calls, 6 requests" in report_text.compared(compare.compared(migrated, "upstream"))


def test_a_repaired_call_after_a_failure_is_a_recovery() -> None:
    """As the metrics count it (toolspan_tool_recoveries_total): the call ran and returned."""
    calls = [{"trajectory_id": "t", "tool": "add", "outcome": outcome, "turn": turn}
             for turn, outcome in enumerate(["rejected", "rejected", "repaired"])]
    [failure] = failure_runs(calls)
    assert (len(failure.calls), failure.rounds_to_recover) == (2, 2)
