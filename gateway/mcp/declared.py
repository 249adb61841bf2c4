"""A Responses request's `mcp` tools, read against the operator's allow list (responses_mcp_servers):
which servers it declared, which of their tools the model is offered, which calls wait for the
client's approval, and the `mcp_list_tools` items the answer shows. Nothing here connects or fetches:
the servers were connected at start-up, as the operator listed them; a request that names any other
is refused before anything else is done for it."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.errors import BadRequest
from gateway.settings.parts import SERVER_LABEL, ResponsesMcpServer
from gateway.tools import Tool, ToolRegistry
from gateway.wire.urls import comparable_url

NOT_ALLOWED = "mcp_server_not_allowed"
NO_CREDENTIALS = "mcp_credentials_not_taken"
REPEATED = "mcp_server_repeated"
MAX_NAMES = 1000  # tool names one filter may list
_NAME = 128  # the longest tool name a filter may list
_Names = Annotated[list[Annotated[str, Field(max_length=_NAME)]], Field(max_length=MAX_NAMES)]


class _Filter(BaseModel):
    """Tools by name and by their read-only annotation; a tool matches when every field given
    matches (a filter that gives neither matches no tool)."""

    model_config = ConfigDict(extra="allow", strict=True)

    tool_names: _Names | None = None
    read_only: bool | None = None

    def matches(self, tool: Tool) -> bool:
        if self.tool_names is None and self.read_only is None:
            return False
        origin = tool.origin
        name = origin.remote_name if origin is not None else tool.name
        read_only = origin.read_only if origin is not None else None
        return ((self.tool_names is None or name in self.tool_names)
                and (self.read_only is None or read_only is self.read_only))


class _Approval(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    always: _Filter | None = None
    never: _Filter | None = None


class _Spec(BaseModel):
    """One `mcp` entry of a request's tools, as far as the gateway reads it."""

    model_config = ConfigDict(extra="allow", strict=True)

    type: Literal["mcp"]
    server_label: str = Field(pattern=f"^{SERVER_LABEL.pattern}$")
    server_url: str | None = Field(None, max_length=2048)
    allowed_tools: _Names | _Filter | None = None
    require_approval: Literal["always", "never"] | _Approval | None = None
    server_description: str | None = None


@dataclass(frozen=True)
class McpOffer:
    """What a request's `mcp` tools come to."""

    names: frozenset[str] = frozenset()  # the registered names the model is offered
    by_name: Mapping[str, tuple[str, str]] = field(default_factory=dict)  # name -> (server_label, tool's own name)
    approval: frozenset[str] = frozenset()  # the names whose calls wait for the client's approval
    lists: tuple[dict[str, Any], ...] = ()  # the mcp_list_tools items the answer shows, in the request's order
    descriptions: Mapping[str, str] = field(default_factory=dict)  # server_label -> its server_description


def _refused(message: str, index: int, name: str, code: str) -> BadRequest:
    return BadRequest(message, param=f"tools[{index}].{name}", code=code)


def _shape(spec: Mapping[str, Any], index: int) -> _Spec:
    """The spec, read; a wrong shape is a 400 naming the field."""
    try:
        return _Spec.model_validate(spec)
    except ValidationError as exc:
        error = exc.errors(include_url=False, include_input=False)[0]
        where = next((str(part) for part in error["loc"] if isinstance(part, str)), "server_label")
        raise _refused(f"mcp tool: {where}: {error['msg']}", index, where, "invalid_value") from None


def _check_origin(spec: Mapping[str, Any], index: int) -> None:
    """A 400 for a server only OpenAI can reach, or for credentials the gateway does not take."""
    for name in ("connector_id", "tunnel_id"):
        if spec.get(name) is not None:
            raise _refused(f"{name}: only OpenAI runs its connectors and tunnels; give the server_url or "
                           "server_label of a server the gateway allows", index, name, NOT_ALLOWED)
    for name in ("headers", "authorization"):
        if spec.get(name):
            raise _refused(f"{name}: the gateway reaches its MCP servers with the operator's credentials "
                           "and takes none from a request; leave it out", index, name, NO_CREDENTIALS)


def _needs_approval(rule: Literal["always", "never"] | _Approval | None, tool: Tool) -> bool:
    """Omitted means always; `never` wins over `always`; a tool neither names needs approval."""
    if rule is None or rule == "always":
        return True
    if rule == "never":
        return False
    return not (rule.never is not None and rule.never.matches(tool))


def _allowed(rule: list[str] | _Filter | None, tool: Tool) -> bool:
    if rule is None:
        return True
    if isinstance(rule, _Filter):
        return rule.matches(tool)
    return tool.origin is not None and tool.origin.remote_name in rule


class DeclaredServers:
    """The operator's allow list (responses_mcp_servers) and the registry their tools are in.
    `down(name)`: why a server is not up, None when it is (for the list items' `error`)."""

    def __init__(self, entries: Mapping[str, ResponsesMcpServer], registry: ToolRegistry,
                 down: Callable[[str], str | None] | None = None) -> None:
        self.registry = registry
        self._down = down
        self._by_url = {comparable_url(entry.url): name for name, entry in entries.items()}
        self._by_label = {entry.server_label(name): name for name, entry in entries.items()}

    def resolve(self, tools: Any, allowed: Collection[str] | None = None, *, request_id: str = "",
                listed: Collection[str] = (), continued: bool = False) -> McpOffer | None:
        """The offer of the `mcp` entries of a request's `tools` (None: it declares none). `allowed`:
        the key's allowlist; `listed`: server labels whose mcp_list_tools item the input already
        carries; `continued`: the request continues a stored response (no list items then). Every
        refusal comes before anything is read of the registry."""
        if not isinstance(tools, list):
            return None
        declared = [(index, spec) for index, spec in enumerate(tools)
                    if isinstance(spec, Mapping) and spec.get("type") == "mcp"]
        if not declared:
            return None
        servers = self._servers(declared)
        return self._offer(servers, allowed, request_id, frozenset(listed), continued)

    def _servers(self, declared: Sequence[tuple[int, Mapping[str, Any]]]) -> list[tuple[int, _Spec, str]]:
        """(index, spec, entry name) of each declared server; a 400 for the first one refused."""
        for index, raw in declared:  # credentials and OpenAI's own servers: refused before the shape is read
            _check_origin(raw, index)
        found: list[tuple[int, _Spec, str]] = []
        labels: set[str] = set()
        entries: set[str] = set()
        for index, raw in declared:
            spec = _shape(raw, index)
            entry = self._entry(spec, index)
            if spec.server_label in labels or entry in entries:
                what = "server_label" if spec.server_label in labels else "server_url"
                raise _refused(f"mcp tool {spec.server_label!r}: that server is declared twice in tools", index,
                               what, REPEATED)
            labels.add(spec.server_label)
            entries.add(entry)
            found.append((index, spec, entry))
        return found

    def _entry(self, spec: _Spec, index: int) -> str:
        allowed = ", ".join(sorted(self._by_label)) or "(none)"
        if spec.server_url is not None:  # a URL given is matched as a URL, never by the label beside it
            url = comparable_url(spec.server_url)
            entry = self._by_url.get(url) if url is not None else None
            if entry is None:
                raise _refused(f"mcp tool {spec.server_label!r}: its server_url is not a server the gateway "
                               f"allows; the allowed servers' labels are: {allowed}", index, "server_url",
                               NOT_ALLOWED)
            return entry
        entry = self._by_label.get(spec.server_label)
        if entry is None:
            raise _refused(f"mcp tool {spec.server_label!r}: no server_url, and that label is not a server the "
                           f"gateway allows; the allowed labels are: {allowed}", index, "server_label", NOT_ALLOWED)
        return entry

    def _offer(self, servers: list[tuple[int, _Spec, str]], allowed: Collection[str] | None, request_id: str,
               listed: frozenset[str], continued: bool) -> McpOffer:
        by_name: dict[str, tuple[str, str]] = {}
        approval: set[str] = set()
        lists: list[dict[str, Any]] = []
        for index, spec, entry in servers:
            label = spec.server_label
            tools = [tool for tool in self.registry.tools_of(f"mcp:{entry}")
                     if _allowed(spec.allowed_tools, tool) and (allowed is None or tool.name in allowed)]
            for tool in tools:
                by_name[tool.name] = (label, tool.origin.remote_name if tool.origin is not None else tool.name)
                if _needs_approval(spec.require_approval, tool):
                    approval.add(tool.name)
            if not continued and label not in listed:
                lists.append(self._list_item(f"mcpl_{request_id}_{index}", label, entry, tools))
        descriptions = {spec.server_label: spec.server_description for _, spec, _ in servers
                        if spec.server_description}
        return McpOffer(frozenset(by_name), by_name, frozenset(approval), tuple(lists), descriptions)

    def _list_item(self, item_id: str, label: str, entry: str, tools: list[Tool]) -> dict[str, Any]:
        why = self._down(entry) if self._down is not None else None
        error = f"the MCP server is unavailable: {why}" if why is not None and not tools else None
        return {"type": "mcp_list_tools", "id": item_id, "server_label": label, "error": error,
                "tools": [{"name": tool.origin.remote_name if tool.origin is not None else tool.name,
                           "description": tool.description or None, "input_schema": tool.schema,
                           "annotations": dict(tool.origin.annotations)
                           if tool.origin is not None and tool.origin.annotations else None}
                          for tool in tools]}
