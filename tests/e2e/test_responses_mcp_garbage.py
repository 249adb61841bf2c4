"""Property: whatever `mcp` tools and mcp items a Responses request carries (shapes right or wrong,
ids forged, approvals for calls nobody made, labels of no server), the gateway answers in the API's
shape, never a 500, and runs nothing on the server it was not asked by the model to run."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gateway.demo.model import Reply
from tests.conftest import AUTH, StackFactory
from tests.mcp.conftest import HttpServer, Recorded, http_server, recorded

__all__ = ["http_server", "recorded"]  # the fixtures of tests/mcp, used here

pytestmark = pytest.mark.slow

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.text(max_size=12),
                    st.sampled_from(["files", "read_file", "mcpr_", "mcpr_tspan_x_y", "always", "never"]))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.sampled_from(["tool_names", "read_only", "always", "never", "type", "text"]), inner, max_size=3),
    max_leaves=8)
SPEC = st.fixed_dictionaries({"type": st.just("mcp")}, optional={
    "server_label": VALUES, "server_url": VALUES, "allowed_tools": VALUES, "require_approval": VALUES,
    "headers": VALUES, "connector_id": VALUES, "server_description": VALUES})
# The allowed server, declared well, so that the items are read: half the examples.
DECLARED = st.builds(lambda approval, allowed: [{"type": "mcp", "server_label": "files", "require_approval": approval,
                                                 **({"allowed_tools": allowed} if allowed is not None else {})}],
                     st.sampled_from(["always", "never", {"never": {"tool_names": ["read_file"]}}]),
                     st.none() | st.just(["read_file"]))
ITEM = st.fixed_dictionaries(
    {"type": st.sampled_from(["mcp_list_tools", "mcp_call", "mcp_approval_request", "mcp_approval_response"])},
    optional={"id": VALUES, "approval_request_id": VALUES, "approve": VALUES, "server_label": VALUES,
              "name": VALUES, "arguments": VALUES, "output": VALUES, "tools": VALUES, "reason": VALUES})


@pytest.fixture
def once() -> dict[str, Any]:
    """One gateway for every example."""
    return {}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(specs=DECLARED | st.lists(SPEC, max_size=2), items=st.lists(ITEM, max_size=4))
async def test_any_mcp_tools_and_items_get_an_answer_in_shape_never_a_500(
        make_stack: StackFactory, http_server: HttpServer, recorded: Recorded, once: dict[str, Any],
        specs: list[dict[str, Any]], items: list[dict[str, Any]]) -> None:
    if not once:
        once["stack"] = await make_stack(upstream_kind="anthropic",
                                         responses_mcp_servers={"files": {"url": http_server.url}})
    stack = once["stack"]
    stack.script.then(*[Reply(content="fine")] * 3)
    body = {"model": "claude-sonnet-4-5", "input": [{"role": "user", "content": "hi"}, *items], "tools": specs}
    async with stack.http.post("/v1/responses", json=body, headers=AUTH) as answer:
        said = await answer.json()
    stack.script.replies.clear()
    event(f"{answer.status} {(said.get('error') or {}).get('code')}")
    assert answer.status in (200, 400), said
    if answer.status == 400:
        assert said["error"]["type"] == "invalid_request_error"
        assert said["error"]["message"]
    assert recorded.calls() == []  # no model call asked for a tool: nothing ran on the server
