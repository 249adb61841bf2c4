"""The settings' parts that are models of their own: a gateway key, an MCP server, and the
values a few settings take, with the patterns their entries must match. `gateway.settings.model`
reads them as fields of `Settings`."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from gateway.wire.urls import comparable_url

# What the gateway does with a model's call of the client's own tool that does not fit the schema the
# request declared (gateway.client_tools.check): observe (spans and metrics say so; the client gets the call
# as the model sent it), reject (the gateway answers the model with the diagnostic and goes on; the
# client never sees the call), or off (no check at all).
ClientCheckMode = Literal["observe", "reject", "off"]
RepairMode = Literal["off", "observe", "apply"]  # argument_repair (gateway.tools.repair)

class Limits(BaseModel):
    """How much one gateway key may take (gateway.limits): per minute (a sliding window of 60 s),
    at once, per request, per day and per month (calendar days and months, UTC). Unset: no bound."""

    requests_per_minute: int | None = Field(None, ge=1, description="Tool-loop and pass-through requests")
    tokens_per_minute: int | None = Field(None, ge=1, description="Provider tokens, input and output, as the "
                                                                  "provider's usage counts them")
    tool_calls_per_minute: int | None = Field(None, ge=1, description="Tool calls, the gateway's and the "
                                                                      "client's own")
    max_concurrent_requests: int | None = Field(None, ge=1, description="Requests under way at once")
    max_rounds: int | None = Field(None, ge=1, description="Model turns with gateway tools in one request "
                                                           "(the lower of this and max_rounds)")
    tokens_per_day: int | None = Field(None, ge=1, description="Provider tokens per UTC day")
    tokens_per_month: int | None = Field(None, ge=1, description="Provider tokens per UTC month")
    budget_per_day: float | None = Field(None, gt=0, description="Money per UTC day, in the currency of "
                                                                 "`prices` (models without a price cost nothing)")
    budget_per_month: float | None = Field(None, gt=0, description="Money per UTC month, as budget_per_day")

    def over(self, default: Limits) -> Limits:
        """These limits, each unset one taken from `default`."""
        own = self.model_dump(include=set(Limits.model_fields), exclude_none=True)
        return Limits(**{**default.model_dump(exclude_none=True), **own})


class Price(BaseModel):
    """What one model's tokens cost, per million, in the operator's currency."""

    model_config = ConfigDict(extra="forbid")

    input: float = Field(ge=0, description="Per million input tokens")
    output: float = Field(ge=0, description="Per million output tokens")


class GatewayKey(Limits):
    """A key callers present as `Authorization: Bearer <key>`, the tools it may use, and its limits
    (each unset one is default_limits')."""

    key: SecretStr = Field(min_length=8, description="The secret the caller sends (at least 8 characters)")
    operator: bool = Field(False, description="The page (/ui) shows this key every key's trajectories (and "
                                              "approvals); any other key sees only its own")
    approver: bool = Field(False, description="This key may decide its own requests' pending approvals of tool "
                                              "calls (/v1/approvals); an operator key decides every key's")
    tools: list[str] | None = Field(None, description="Tool names this key may use; unset: all")
    routes: list[str] | None = Field(
        None, description="Pass-through path prefixes this key may use (e.g. /v1/models, /v1/embeddings); unset: all")
    client_tool_check: ClientCheckMode | None = Field(
        None, description="client_tool_check for this key's requests; unset: the gateway's")
    models: list[str] | None = Field(
        None, description="Models this key may ask for: names and glob patterns (gpt-4o*); unset: every one")
    argument_repair: RepairMode | None = Field(
        None, description="argument_repair for this key's calls, over the gateway's and the tool's; unset: theirs")
    guardrails: list[str] = Field(
        default_factory=list, description="Guardrails on this key's tool calls, after the gateway's and the "
                                          "tool's: built-in names and module:attr paths, in order")

    @field_validator("routes")
    @classmethod
    def _paths(cls, routes: list[str] | None) -> list[str] | None:
        # A prefix without its leading slash would match no path and silently refuse every route.
        for route in routes or ():
            if not route.startswith("/"):
                raise ValueError(f"route {route!r} must be a path starting with '/', such as /v1/models")
        return routes


KEY_NAME = re.compile(r"[A-Za-z0-9._:@+-]{1,64}")
MCP_SERVER_NAME = re.compile(r"^[A-Za-z0-9-]+(?:_[A-Za-z0-9-]+)*$")  # no "__": that separates server and tool
SERVER_LABEL = re.compile(r"[A-Za-z0-9_-]{1,64}")  # a Responses `mcp` tool's server_label
MCP_MAX_MESSAGE_BYTES = 8 * 1024 * 1024  # the default of mcp_max_message_bytes
# An allowed_hosts entry: "*", a name or IPv4 address (a leading "." for its subdomains), or an IPv6 address.
HOST_ENTRY = re.compile(r"\*|\.?[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*\.?|\[?[0-9A-Fa-f.]*(?::[0-9A-Fa-f.]*){2,}\]?")
ORIGIN_ENTRY = re.compile(r"https?://(?:[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?/?", re.IGNORECASE)


def each_matches(values: Iterable[str], pattern: re.Pattern[str], refusal: str) -> None:
    """A ValueError, `refusal` formatted with the value, for the first of `values` that `pattern`
    does not match whole."""
    for value in values:
        if not pattern.fullmatch(value):
            raise ValueError(refusal.format(value))


class McpServer(BaseModel):
    """An MCP server whose tools join the registry: a command run over stdio, or a URL
    (streamable HTTP, or the legacy SSE transport)."""

    model_config = ConfigDict(extra="forbid")

    command: str | None = Field(None, description="Executable to run as an MCP server over stdio")
    args: list[str] = Field(default_factory=list, description="Arguments of `command`")
    env: dict[str, SecretStr] = Field(default_factory=dict, description="Environment of `command`, over the "
                                                                        "MCP SDK's safe default environment")
    cwd: str | None = Field(None, description="Working directory of `command`")
    url: str | None = Field(None, description="Endpoint of an MCP server over HTTP, e.g. http://host:8000/mcp")
    transport: Literal["streamable_http", "sse"] = Field("streamable_http", description="How `url` speaks MCP")
    headers: dict[str, SecretStr] = Field(default_factory=dict, description="HTTP headers sent to `url` "
                                                                            "(Authorization, say)")
    timeout_seconds: float | None = Field(None, gt=0, description="Time limit of one call of its tools; "
                                                                  "unset: tool_timeout_seconds")
    concurrent: bool = Field(False, description="Its tools' calls of one model turn may run at the same time")
    connect_timeout_seconds: float = Field(10.0, gt=0, description="Limit on connecting and listing its tools")
    reconnect_min_seconds: float = Field(0.5, gt=0, description="First wait before reconnecting; doubles per "
                                                                "failed attempt")
    reconnect_max_seconds: float = Field(30.0, gt=0, description="Longest wait between reconnection attempts")
    ping_interval_seconds: float = Field(15.0, ge=0, description="How often an idle connection is checked with "
                                                                 "a ping (0: never)")
    required: bool = Field(False, description="GET /readyz answers 503 while this server is unavailable")
    max_tools: int = Field(256, ge=1, description="Most tools taken from it; past them, the rest of its list is "
                                                   "left out with a warning")
    guardrails: list[str] = Field(
        default_factory=list, description="Guardrails on calls of its tools, after the gateway's: built-in "
                                          "names and module:attr paths, in order")
    relist_min_seconds: float = Field(
        1.0, ge=0, description="Shortest time between two listings of its tools: announcements of changed tools "
                               "(tools/list_changed) that come faster are answered by one listing")

    @model_validator(mode="after")
    def _one_transport(self) -> McpServer:
        if (self.command is None) == (self.url is None):
            raise ValueError("an MCP server needs exactly one of `command` (stdio) or `url` (HTTP)")
        return self


class ResponsesMcpServer(McpServer):
    """An MCP server a Responses request may declare as an `mcp` tool (by its URL or its label): the
    gateway connects to it at start-up, and offers its tools only to the requests that declare it."""

    # McpServer's stdio fields, refused here (and left out of the example config)
    command: str | None = Field(None, exclude=True)
    args: list[str] = Field(default_factory=list, exclude=True)
    env: dict[str, SecretStr] = Field(default_factory=dict, exclude=True)
    cwd: str | None = Field(None, exclude=True)
    url: str = Field(description="Endpoint of the MCP server over HTTP; a request's server_url must equal it "
                                 "(scheme and host in any case, a default port and a trailing '/' aside)")
    label: str | None = Field(None, description="The server_label a request may name it by instead of its URL; "
                                                "unset: its name in the table")
    headers_env: dict[str, str] = Field(
        default_factory=dict, description="HTTP headers sent to `url` whose values are read from environment "
                                          "variables at start-up, header name to variable name")

    @field_validator("label")
    @classmethod
    def _label(cls, label: str | None) -> str | None:
        if label is not None and not SERVER_LABEL.fullmatch(label):
            raise ValueError(f"label {label!r}: use up to 64 letters, digits, '_' or '-'")
        return label

    @model_validator(mode="after")
    def _one_transport(self) -> ResponsesMcpServer:  # in place of McpServer's: only a url here
        given = [name for name in ("command", "args", "env", "cwd") if getattr(self, name)]
        if given:
            raise ValueError(f"{given[0]} is for mcp_servers: a server of responses_mcp_servers is reached at its url")
        if comparable_url(self.url) is None:
            raise ValueError(f"url {self.url!r}: give an http(s) URL with a host and no user info, query or "
                             "fragment (credentials go in headers_env)")
        return self

    @model_validator(mode="after")
    def _read_headers_env(self) -> ResponsesMcpServer:
        # Read once, at start-up: a variable that is not set stops the gateway with its name.
        for header, variable in self.headers_env.items():
            if header in self.headers:
                raise ValueError(f"header {header!r} is given in both headers and headers_env")
            value = os.environ.get(variable, "")
            if not value:
                raise ValueError(f"headers_env names {variable} for header {header!r}, and it is not set")
            self.headers[header] = SecretStr(value)
        return self

    def server_label(self, name: str) -> str:
        """The label requests name it by (`name`: its key in the table)."""
        return self.label if self.label is not None else name
