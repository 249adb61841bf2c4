"""The report page's comparison (`/ui?by=...`, gateway.ui.compare) on the two-model session: the
hand-counted figures with their counts, one key's only for that key, escaped; and the renames per
model with the alias line to add."""

from __future__ import annotations

from pathlib import Path

from gateway.ui.compare import compared_section, renames_section
from telemetry.store import compare
from telemetry.store.schema import connect
from tests.conftest import StackFactory
from tests.improve import session as scripted
from tests.improve.conftest import Session
from tests.ui.conftest import table_rows

OPERATOR = {"Authorization": f"Bearer {scripted.OPERATOR_KEY}"}
ALPHA = {"Authorization": f"Bearer {scripted.ALPHA_KEY}"}
# The figures of tests.improve.session's hand count, as the page shows them.
ROWS = {scripted.MODEL_A: ["6", "3", "33% (2 of 6, small sample)", "missing_arguments 1; schema_violation 1",
                           "0% (0 of 2, small sample)", "100% (2 of 2, small sample)", "3.00 (9 in 3, small sample)"],
        scripted.MODEL_B: ["6", "3", "50% (3 of 6, small sample)", "missing_arguments 2; schema_violation 1",
                           "33% (1 of 3, small sample)", "50% (1 of 2, small sample)", "2.67 (8 in 3, small sample)"]}


async def _page(session: Session, query: str, headers: dict[str, str], status: int = 200) -> str:
    response = await session.gateway.http.get(f"/ui{query}", headers=headers)
    assert response.status == status
    return await response.text()


async def test_the_page_compares_the_models_as_counted_by_hand(improve_session: Session) -> None:
    page = await _page(improve_session, "?by=model", OPERATOR)
    assert "<h2>Compared by model</h2>" in page
    assert table_rows(page, "compared") == [[model, *cells] for model, cells in ROWS.items()]
    by_upstream = table_rows(await _page(improve_session, "?by=upstream", OPERATOR), "compared")
    assert by_upstream == [["primary", *ROWS[scripted.MODEL_A]], ["secondary", *ROWS[scripted.MODEL_B]]]


async def test_a_keys_page_compares_only_its_own_trajectories(improve_session: Session) -> None:
    page = await _page(improve_session, "?by=key", ALPHA)
    assert table_rows(page, "compared") == [["alpha", *ROWS[scripted.MODEL_A]]]
    assert "beta" not in page
    assert scripted.MODEL_B not in page


async def test_the_page_lists_the_renames_per_model_and_the_alias_to_add(improve_session: Session) -> None:
    page = await _page(improve_session, "", OPERATOR)
    assert 'id="compared"' not in page  # the comparison only when asked for, from the links to it
    assert '<a href="/ui?by=model#compared">model</a>' in page
    assert table_rows(page, "renamed") == [["read_file", scripted.MODEL_B, "filepath", "no close name", "2", "0"],
                                           ["read_file", scripted.MODEL_A, "file_path", "path", "1", "1"]]
    assert '<pre class="aliases"><code>[tool_aliases.read_file]\npath = [&quot;file_path&quot;]</code></pre>' in page


async def test_an_unknown_grouping_is_refused_in_words(improve_session: Session) -> None:
    page = await _page(improve_session, "?by=%3Cb%3Ecolour", OPERATOR, status=400)
    assert "?by compares by one of model, upstream, key, tool, not &#x27;&lt;b&gt;colour&#x27;." in page


async def test_an_empty_store_has_nothing_to_compare(make_stack: StackFactory, tmp_path: Path) -> None:
    connect(str(tmp_path / "empty.sqlite3")).close()  # the tables, and no row in them
    stack = await make_stack(trajectory_store_path=tmp_path / "empty.sqlite3")
    response = await stack.http.get("/ui?by=model")
    assert response.status == 200
    assert "No trajectory recorded yet" in await response.text()


def test_what_a_model_chose_is_escaped(improve_session: Session) -> None:
    figures = compare.compared(improve_session.db, "model")
    hostile = "<script>alert(1)</script>"
    figures["groups"][0]["model"] = hostile
    renamed = [{**figures["renames"][0], "model": hostile, "from": hostile}]
    aliases = [{"tool": "read_file", "aliases": {"path": [hostile]}, "toml": f'path = ["{hostile}"]'}]
    shown = str(compared_section(figures)) + str(renames_section(renamed, aliases))
    assert hostile not in shown
    assert table_rows(shown, "compared")[0][0] == hostile  # as text, once unescaped
    assert table_rows(shown, "renamed")[0][1:3] == [hostile, hostile]
