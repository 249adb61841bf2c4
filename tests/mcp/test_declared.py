"""gateway.mcp.declared: a Responses request's `mcp` tools against the operator's allow list. No URL
outside the list ever resolves; every refusal is a 400 naming the field; the filters and the
approval rule as documented; the list items; bounded input."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.errors import BadRequest
from gateway.mcp.declared import DeclaredServers
from gateway.settings.parts import ResponsesMcpServer
from gateway.tools import Tool, ToolRegistry
from gateway.tools.results import ToolOrigin
from gateway.wire.urls import comparable_url

FILES_URL = "http://files.internal:8000/mcp"
ENTRIES = {"files": ResponsesMcpServer(url=FILES_URL),
           "docs": ResponsesMcpServer(url="https://docs.example.com/", label="handbook")}


def remote(server: str, name: str, read_only: bool | None = None) -> Tool:
    annotations = {"readOnlyHint": read_only} if read_only is not None else None
    origin = ToolOrigin("mcp", server, "tools/call", name, "tcp", None, read_only, annotations)
    return Tool(name=f"{server}__{name}", description=f"The {name} tool", function=lambda args: "",
                parameters_schema={"type": "object", "properties": {"path": {"type": "string"}}}, origin=origin)


def registry() -> ToolRegistry:
    found = ToolRegistry([Tool(name="echo", function=lambda args: "")])
    found.replace_source("mcp:files", [remote("files", "read_file", True), remote("files", "write_file", False),
                                       remote("files", "stat")], on_request=True)
    found.replace_source("mcp:docs", [remote("docs", "search", True)], on_request=True)
    return found


def servers(down: dict[str, str] | None = None, reg: ToolRegistry | None = None) -> DeclaredServers:
    return DeclaredServers(ENTRIES, reg if reg is not None else registry(), (down or {}).get)


def mcp(label: str = "files", **fields: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": label, **fields}


def refusal(tools: list[Any]) -> BadRequest:
    with pytest.raises(BadRequest) as refused:
        servers().resolve(tools)
    assert refused.value.status == 400
    return refused.value


# --- URLs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("url", [FILES_URL, FILES_URL + "/", "HTTP://Files.Internal:8000/mcp",
                                 "http://FILES.internal:8000/mcp/"])
def test_a_url_of_the_list_resolves_in_any_case_and_with_a_trailing_slash(url: str) -> None:
    offer = servers().resolve([mcp("mine", server_url=url, require_approval="never")])
    assert offer is not None
    assert offer.names == {"files__read_file", "files__write_file", "files__stat"}


@pytest.mark.parametrize("url", ["https://docs.example.com", "https://docs.example.com:443/",
                                 "HTTPS://DOCS.example.com/"])
def test_a_default_port_is_the_same_url(url: str) -> None:
    offer = servers().resolve([mcp("h", server_url=url)])
    assert offer is not None
    assert offer.names == {"docs__search"}


@pytest.mark.parametrize("url", [
    "http://user:pw@files.internal:8000/mcp",  # user info
    "http://files.internal:8000@evil.example/mcp",
    "http://files.internal:8000/mcp?x=1",  # a query
    "http://files.internal:8000/mcp?",
    "http://files.internal:8000/mcp#frag",  # a fragment
    "http://files.internal:8001/mcp",  # another port
    "https://files.internal:8000/mcp",  # another scheme
    "http://files.internal/mcp",  # the default port is not 8000
    "http://files.internal:8000/MCP",  # paths compare exactly
    "http://files.internal:8000/mcp/x",
    "http://files.internal.:8000/mcp",
    "http://files.internal:8000/mcp//",
    "http://fil es.internal:8000/mcp",
    "http://files.internal:8000/mc\np",
    "http://fïles.internal:8000/mcp",
    "http://files.internal:99999/mcp",
    "ws://files.internal:8000/mcp",
    "//files.internal:8000/mcp",
    "",
])
def test_urls_not_on_the_list_are_refused_naming_the_field(url: str) -> None:
    refused = refusal([{"type": "function", "name": "f"}, mcp("files", server_url=url)])
    assert (refused.param, refused.code) == ("tools[1].server_url", "mcp_server_not_allowed")
    assert "'files'" in refused.message
    assert "the allowed servers' labels are: files, handbook" in refused.message


_SCHEMES = st.sampled_from(["http", "https", "HTTP", "Https", "ftp", "file", "ws"])
_HOSTS = st.sampled_from(["files.internal", "FILES.INTERNAL", "docs.example.com", "files.internal.", "127.0.0.1",
                          "[::1]", "evil.example", "files-internal"]) | st.from_regex(r"[a-z0-9.-]{1,12}",
                                                                                     fullmatch=True)
_PORTS = st.sampled_from(["", ":80", ":443", ":8000", ":8001", ":08000"])
_PATHS = (st.sampled_from(["", "/", "/mcp", "/mcp/", "/MCP", "/mcp//", "/mcp/x"])
          | st.from_regex(r"(/[a-z%0-9]{0,4}){0,3}", fullmatch=True))
_TAILS = st.sampled_from(["", "", "?", "?a=1", "#", "#x"])
_USERS = st.sampled_from(["", "", "u@", "u:p@", "files.internal:8000@"])
_LISTED = {("http", "files.internal", 8000, "/mcp"), ("https", "docs.example.com", 443, "")}


@given(_SCHEMES, _USERS, _HOSTS, _PORTS, _PATHS, _TAILS)
def test_no_url_outside_the_list_ever_resolves(scheme: str, user: str, host: str, port: str, path: str,
                                               tail: str) -> None:
    url = f"{scheme}://{user}{host}{port}{path}{tail}"
    default = {"http": 80, "https": 443}.get(scheme.lower())
    number = int(port[1:]) if port else default
    path_key = path[:-1] if path.endswith("/") else path
    listed = not user and not tail and (scheme.lower(), host.lower(), number, path_key) in _LISTED
    if listed:
        assert servers().resolve([mcp("x", server_url=url)]) is not None
        return
    refused = refusal([mcp("x", server_url=url)])
    assert (refused.param, refused.code) == ("tools[0].server_url", "mcp_server_not_allowed")


@given(st.text(max_size=40))
def test_any_text_resolves_only_as_a_listed_url(url: str) -> None:
    if comparable_url(url) in {comparable_url(FILES_URL), comparable_url("https://docs.example.com/")}:
        assert servers().resolve([mcp("x", server_url=url)]) is not None
    else:
        assert refusal([mcp("x", server_url=url)]).param == "tools[0].server_url"


def test_a_url_is_matched_as_a_url_never_by_the_label_beside_it() -> None:
    refused = refusal([mcp("files", server_url="http://127.0.0.1:9/mcp")])
    assert refused.param == "tools[0].server_url"


def test_a_label_alone_names_a_server_by_its_label_not_its_name() -> None:
    offer = servers().resolve([mcp("handbook")])
    assert offer is not None
    assert offer.by_name == {"docs__search": ("handbook", "search")}
    refused = refusal([mcp("docs")])
    assert (refused.param, refused.code) == ("tools[0].server_label", "mcp_server_not_allowed")
    assert "the allowed labels are: files, handbook" in refused.message


# --- refusals -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("fields", "param", "code"), [
    ({"connector_id": "connector_gmail"}, "connector_id", "mcp_server_not_allowed"),
    ({"tunnel_id": "tun_1"}, "tunnel_id", "mcp_server_not_allowed"),
    ({"server_url": FILES_URL, "headers": {"Authorization": "Bearer x"}}, "headers", "mcp_credentials_not_taken"),
    ({"authorization": "tok"}, "authorization", "mcp_credentials_not_taken"),
    ({"server_label": "has space"}, "server_label", "invalid_value"),
    ({"server_label": "x" * 65}, "server_label", "invalid_value"),
    ({"allowed_tools": "read_file"}, "allowed_tools", "invalid_value"),
    ({"allowed_tools": ["t"] * 1001}, "allowed_tools", "invalid_value"),
    ({"allowed_tools": {"tool_names": ["t"] * 1001}}, "allowed_tools", "invalid_value"),
    ({"allowed_tools": ["x" * 129]}, "allowed_tools", "invalid_value"),
    ({"require_approval": "sometimes"}, "require_approval", "invalid_value"),
    ({"require_approval": {"never": {"read_only": "yes"}}}, "require_approval", "invalid_value"),
    ({"server_url": 7}, "server_url", "invalid_value"),
])
def test_each_refusal_names_its_field_and_code(fields: dict[str, Any], param: str, code: str) -> None:
    refused = refusal([{"type": "function", "name": "f"}, mcp(**fields)])
    assert (refused.param, refused.code) == (f"tools[1].{param}", code)


def test_credentials_are_refused_before_the_server_is_matched() -> None:
    refused = refusal([mcp("nobody", server_url="http://127.0.0.1:1/x", authorization="t")])
    assert refused.code == "mcp_credentials_not_taken"


@pytest.mark.parametrize("fields", [{"headers": None, "authorization": None, "connector_id": None},
                                    {"headers": {}, "server_description": "Files", "defer_loading": True}])
def test_fields_left_null_or_empty_and_unknown_fields_are_taken(fields: dict[str, Any]) -> None:
    offer = servers().resolve([mcp("files", **fields)])
    assert offer is not None


@pytest.mark.parametrize("second", [mcp("files"), mcp("other", server_url=FILES_URL + "/")])
def test_a_server_declared_twice_is_refused(second: dict[str, Any]) -> None:
    refused = refusal([mcp("files"), second])
    assert refused.code == "mcp_server_repeated"
    assert refused.param in ("tools[1].server_label", "tools[1].server_url")


def test_a_request_without_mcp_tools_reads_nothing() -> None:
    reg = registry()
    assert servers(reg=reg).resolve([{"type": "function", "name": "f"}]) is None
    assert servers(reg=reg).resolve(None) is None
    assert servers(reg=reg).resolve([]) is None


# --- filters and approvals ----------------------------------------------------------------------


@pytest.mark.parametrize(("allowed_tools", "names"), [
    (None, {"read_file", "write_file", "stat"}),
    (["read_file", "stat", "not_there"], {"read_file", "stat"}),
    ([], set()),
    ({"tool_names": ["read_file", "write_file"]}, {"read_file", "write_file"}),
    ({"read_only": True}, {"read_file"}),
    ({"read_only": False}, {"write_file"}),  # a tool without the hint is not read-only, nor known to be otherwise
    ({"tool_names": ["read_file", "write_file"], "read_only": False}, {"write_file"}),
    ({}, set()),
])
def test_allowed_tools(allowed_tools: Any, names: set[str]) -> None:
    offer = servers().resolve([mcp("files", allowed_tools=allowed_tools)])
    assert offer is not None
    assert {remote_name for _, remote_name in offer.by_name.values()} == names
    assert offer.names == {f"files__{name}" for name in names}


def test_the_keys_allowlist_applies_too() -> None:
    offer = servers().resolve([mcp("files")], allowed={"echo", "files__stat"})
    assert offer is not None
    assert offer.names == {"files__stat"}


@pytest.mark.parametrize(("rule", "asked"), [
    ("absent", {"read_file", "write_file", "stat"}),  # omitted: always
    (None, {"read_file", "write_file", "stat"}),
    ("always", {"read_file", "write_file", "stat"}),
    ("never", set()),
    ({"never": {"tool_names": ["read_file"]}}, {"write_file", "stat"}),
    ({"always": {"tool_names": ["write_file"]}}, {"read_file", "write_file", "stat"}),  # unnamed: still asked
    ({"never": {"read_only": True}}, {"write_file", "stat"}),
    ({"always": {"tool_names": ["read_file"]}, "never": {"tool_names": ["read_file", "stat"]}}, {"write_file"}),
    ({"never": {}}, {"read_file", "write_file", "stat"}),  # a filter naming nothing matches nothing
])
def test_require_approval(rule: Any, asked: set[str]) -> None:
    spec = mcp("files") if rule == "absent" else mcp("files", require_approval=rule)
    offer = servers().resolve([spec])
    assert offer is not None
    assert offer.approval == {f"files__{name}" for name in asked}


# --- list items ---------------------------------------------------------------------------------


def test_list_items_one_per_declared_server_in_the_requests_order() -> None:
    offer = servers().resolve([{"type": "function", "name": "f"}, mcp("mine", server_url=FILES_URL,
                                                                       allowed_tools=["read_file"]),
                               mcp("handbook", server_description="The handbook")], request_id="req1")
    assert offer is not None
    assert offer.lists == (
        {"type": "mcp_list_tools", "id": "mcpl_req1_1", "server_label": "mine", "error": None,
         "tools": [{"name": "read_file", "description": "The read_file tool", "annotations": {"readOnlyHint": True},
                    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]},
        {"type": "mcp_list_tools", "id": "mcpl_req1_2", "server_label": "handbook", "error": None,
         "tools": [{"name": "search", "description": "The search tool", "annotations": {"readOnlyHint": True},
                    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]})
    assert offer.descriptions == {"handbook": "The handbook"}


def test_no_list_item_for_a_server_listed_already_or_a_continued_response() -> None:
    tools = [mcp("files"), mcp("handbook")]
    offer = servers().resolve(tools, listed={"files"})
    assert offer is not None
    assert [item["server_label"] for item in offer.lists] == ["handbook"]
    continued = servers().resolve(tools, continued=True)
    assert continued is not None
    assert continued.lists == ()
    assert continued.names == offer.names


def test_a_server_down_with_no_tools_lists_its_error() -> None:
    reg = registry()
    reg.replace_source("mcp:docs", [], on_request=True)
    offer = servers({"docs": "connection refused"}, reg).resolve([mcp("handbook"), mcp("files")])
    assert offer is not None
    assert [(item["server_label"], item["error"], item["tools"]) for item in offer.lists] == [
        ("handbook", "the MCP server is unavailable: connection refused", []), ("files", None, offer.lists[1]["tools"])]
    assert len(offer.lists[1]["tools"]) == 3
