"""The replay view of the page (GET /ui/replay, gateway.ui.replay): the two-model session's calls
replayed against the tools a gateway serves now, after a restart with the changed tool file over
the same store; each key sees its own calls only, against the tools it may use; what a model sent
is escaped; no body runs; the report links to it."""

from __future__ import annotations

import re
from typing import Any

from openai import AsyncOpenAI

from gateway.cli.loading import load_tools
from gateway.demo.model import Reply
from gateway.settings.model import Settings
from tests.conftest import USER, GatewayFactory, free_port
from tests.improve import session as scripted
from tests.improve.conftest import Session, ToolFile

HOSTILE = {"file_path": "<script>alert(1)</script>"}  # rejected then, as a rename; passes now


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def figures(markup: str) -> dict[str, int]:
    """The totals the view shows, by their names."""
    return {name: int(value.replace(",", "")) for name, value in re.findall(
        r'<div data-figure="([^"]+)"><dt>[^<]*</dt><dd>([0-9,]+)</dd></div>', markup)}


def tool_row(markup: str, tool: str) -> list[int]:
    """A tool's row: calls, replayed, now pass, now rejected, still pass, still rejected, uncertain."""
    row = re.search(rf'<tr data-tool="{tool}">(.*?)</tr>', markup)
    assert row is not None, f"no row for {tool}"
    return [int(value) for value in re.findall(r'data-value="(-?[0-9]+)"', row.group(1))]


async def restarted_with_the_changed_tools(session: Session, tool_file: ToolFile, make_gateway: GatewayFactory) -> str:
    """One more rename of alpha's recorded, then a gateway over the same store serving the changed
    tools, beta allowed read_file and add only: its URL."""
    session.upstreams[scripted.MODEL_A].policy.then(  # type: ignore[attr-defined]
        Reply(tool_calls=[("read_file", HOSTILE)]), Reply(content="done"))
    async with AsyncOpenAI(base_url=f"{session.gateway.url}/v1", api_key=scripted.ALPHA_KEY, max_retries=0) as client:
        await client.chat.completions.create(model=scripted.MODEL_A, messages=USER)  # type: ignore[arg-type]
    assert session.gateway.observability.store is not None
    await session.gateway.observability.store.flushed()
    keys: dict[str, Any] = {**scripted.KEYS, "beta": {"key": scripted.BETA_KEY, "tools": ["read_file", "add"]}}
    settings = Settings(port=0, keys=keys, trajectory_store_path=session.path, record_tool_arguments=True,
                        upstream=f"http://127.0.0.1:{free_port()}/v1")  # never asked: the page reads the store
    restarted = await make_gateway(settings, registry=load_tools([f"{tool_file.module}:tools"]))
    return restarted.url


async def test_each_key_sees_its_calls_replayed_against_the_tools_served_now(
        improve_session: Session, tool_file: ToolFile, make_gateway: GatewayFactory) -> None:
    url = await restarted_with_the_changed_tools(improve_session, tool_file, make_gateway)
    http = improve_session.gateway.http.session

    async def view(key: str | None) -> tuple[int, str]:
        async with http.get(f"{url}/ui/replay", headers=bearer(key) if key else {}) as response:
            return response.status, await response.text()

    status, alpha = await view(scripted.ALPHA_KEY)
    assert status == 200
    # alpha: file_path /a and the hostile rename now pass; /a, /c still pass; add 1+2 breaks, "1"+2 is still
    # refused; login's masked password is too short now, which the mask may be the cause of.
    assert figures(alpha) == {"calls": 7, "replayed": 7, "rejections that would now pass": 2,
                              "passes that would now be rejected": 1, "still pass": 2, "still rejected": 1,
                              "uncertain (a masked value)": 1}
    assert tool_row(alpha, "read_file") == [4, 4, 2, 0, 2, 0, 0]
    assert tool_row(alpha, "add") == [2, 2, 0, 1, 0, 1, 0]
    assert "beta~" not in alpha
    assert "<script>alert" not in alpha
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in alpha
    assert "the newest" not in alpha
    assert "all 7" in alpha
    # beta may not use search now: its two search calls are of a tool it is not served.
    _, beta = await view(scripted.BETA_KEY)
    assert figures(beta)["calls"] == 6
    assert "alpha~" not in beta
    assert tool_row(beta, "read_file") == [3, 3, 2, 0, 1, 0, 0]
    assert tool_row(beta, "add") == [1, 1, 0, 1, 0, 0, 0]
    assert tool_row(beta, "search") == [2, 0, 0, 0, 0, 0, 0]
    assert "tool not served 2" in beta
    _, everyone = await view(scripted.OPERATOR_KEY)
    assert figures(everyone)["calls"] == scripted.CALLS + 1
    assert figures(everyone)["passes that would now be rejected"] == 2
    status, _ = await view(None)
    assert status == 401  # the sign-in page
    assert not tool_file.ran.exists()


async def test_the_report_links_to_the_replay(improve_session: Session) -> None:
    response = await improve_session.gateway.http.get("/ui", headers=bearer(scripted.ALPHA_KEY))
    assert '<a href="/ui/replay">' in await response.text()
    response = await improve_session.gateway.http.get("/ui/replay", headers=bearer(scripted.ALPHA_KEY))
    unchanged = figures(await response.text())  # the session's own tools: every call as it was recorded
    assert unchanged == {"calls": 6, "replayed": 6, "rejections that would now pass": 0,
                         "passes that would now be rejected": 0, "still pass": 4, "still rejected": 2,
                         "uncertain (a masked value)": 0}
