"""Settings: one pydantic-settings model, its fields, defaults and checks. Nothing outside
gateway.settings reads the environment.

Precedence: command-line flags, then TOOLSPAN_* variables, then the config file (TOML or JSON),
then the defaults below; gateway.settings.load reads them in that order.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from gateway.settings.parts import (
    HOST_ENTRY,
    KEY_NAME,
    MCP_MAX_MESSAGE_BYTES,
    MCP_SERVER_NAME,
    ORIGIN_ENTRY,
    ClientCheckMode,
    GatewayKey,
    Limits,
    McpServer,
    Price,
    RepairMode,
    ResponsesMcpServer,
    each_matches,
)
from gateway.settings.text import Refused
from gateway.settings.upstreams import ProviderSettings
from gateway.wire.urls import comparable_url

InterruptMode = Literal["wait", "hand_back"]
# Argument keys whose values are masked on spans (the one list; `-` and `_` match each other).
REDACT_KEYS = ("password", "passwd", "passphrase", "secret", "token", "api_key", "apikey", "authorization",
               "credential", "private_key", "cookie")


class Settings(ProviderSettings, BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TOOLSPAN_", extra="forbid")

    host: str = Field("127.0.0.1", description="Address to listen on")
    port: int = Field(8080, ge=0, le=65535, description="Port to listen on (0: any free port)")
    workers: int = Field(1, ge=1, description="Processes serving the port, each with its event loop (more than "
                                              "one needs state_url: the held turns must be shared)")
    allowed_hosts: list[str] | None = Field(
        None, description="Host names the gateway answers (a request with another Host gets a 421): "
                          "'gateway.internal', '.example.com' for it and its subdomains, '*' for any; unset: on a "
                          "loopback host, its address and the localhost names, on any other, every name")
    allowed_origins: list[str] = Field(
        default_factory=list, description="Web pages, besides the gateway's own, whose browser requests are "
                                          "taken, as origins ('https://app.example.com'); a request with any "
                                          "other Origin header gets a 403")
    tools: list[str] = Field(default_factory=list, description="module:attr of tools to load; unset: the example "
                                                               "tools (get_weather, to_fahrenheit, echo) with the "
                                                               "built-in model, none with an upstream")
    app_dir: Path | None = Field(
        None, description="Folder the modules of `tools` are imported from first (before the installed "
                          "packages); unset: the current directory")
    mcp_servers: dict[str, McpServer] = Field(
        default_factory=dict, description="MCP servers whose tools join the registry, by name (the prefix of "
                                          "their tools' names); JSON in TOOLSPAN_MCP_SERVERS")
    responses_mcp_servers: dict[str, ResponsesMcpServer] = Field(
        default_factory=dict, description="MCP servers a Responses request may declare as `mcp` tools, by name (the "
                                          "prefix of their tools' names): the only servers such a request can name, "
                                          "by url or label; the gateway connects to them at start-up, and offers "
                                          "their tools only to the requests that declare them; JSON in "
                                          "TOOLSPAN_RESPONSES_MCP_SERVERS")
    responses_mcp_runner: Literal["gateway", "provider"] = Field(
        "gateway", description="Who runs a Responses request's `mcp` tools: the gateway (for every upstream), or the "
                               "provider, for a model whose every upstream is of kind openai (the request passes "
                               "through unchanged)")
    mcp_endpoint: bool = Field(True, description="Serve the tool registry to MCP clients at /mcp (streamable "
                                                  "HTTP), authenticated and allowlisted by the gateway keys")
    mcp_max_sessions: int = Field(1000, ge=1, description="/mcp sessions open at once, all keys together; "
                                                          "past it a new one is refused (503)")
    mcp_max_sessions_per_key: int = Field(
        100, ge=1, description="/mcp sessions any one gateway key may have open at once; past it a new one is "
                               "refused (429 too_many_sessions, with Retry-After)")
    mcp_session_idle_seconds: float = Field(
        900.0, gt=0, allow_inf_nan=False,
        description="An /mcp session that has had no request in flight for this long is ended (its id then "
                    "answers 404) and no longer counts against either bound")
    mcp_max_message_bytes: int = Field(
        MCP_MAX_MESSAGE_BYTES, ge=1024,
        description="Longest message taken from an MCP server of mcp_servers: over stdio, a longer one drops the "
                    "connection (the gateway reconnects) rather than being buffered; over streamable HTTP, a longer "
                    "answer fails its call, unread")
    keys: dict[str, GatewayKey] = Field(
        default_factory=dict, description="Gateway keys by caller name (JSON in TOOLSPAN_KEYS); when set, "
                                          "every /v1 request needs one, and it never reaches the provider")
    max_rounds: int = Field(10, ge=1, description="Model turns with gateway tools before a tool-less final call")
    default_limits: Limits = Field(default_factory=Limits, description="The limits of every key that sets none "
                                                                       "of its own (and of the one caller, "
                                                                       "without keys)")
    prices: dict[str, Price] = Field(default_factory=dict, description="Price per million tokens by model (a name "
                                                                      "or a glob pattern), for budget_per_day "
                                                                      "and budget_per_month")
    limits_when_state_down: Literal["open", "closed"] = Field(
        "open", description="With limits shared in Redis (state_url) and Redis unreachable: open lets requests "
                            "through, with a warning and toolspan_limit_state_unavailable_total; closed refuses them")
    offer_tools_on_empty_tools: bool = Field(
        False, description="Offer the gateway's tools to a request that sends `tools: []` (by default such a "
                           "request, which asks for an answer without tools, as the Codex CLI's compaction does, "
                           "gets none)")
    client_tool_check: ClientCheckMode = Field(
        "observe", description="The model's calls of the client's own tools, checked against the schemas the request "
                               "declares: observe (spans and metrics say what did not fit; the client gets the call "
                               "as sent), reject (the gateway answers the model with the diagnostic and goes on, and "
                               "the client never sees the call), or off")
    client_tool_error_prefix: str | None = Field(
        None, min_length=1, description="A result of the client's own tool that starts with this text counts as "
                                        "a failed call (Chat and Responses flag none; Messages' is_error counts "
                                        "there); unset: every result counts as returned")
    guardrails: list[str] = Field(
        default_factory=list, description="Guardrails on every tool call, in order: built-in names (secrets, "
                                          "result_size, denied_values, url_hosts, injection) and module:attr "
                                          "paths of your own; a tool, a gateway key and an MCP server add their own")
    tool_guardrails: dict[str, list[str]] = Field(
        default_factory=dict, description="More guardrails for the gateway's tools by name or glob pattern "
                                          "(fs__*), after the gateway's")
    guardrail_timeout_seconds: float = Field(2.0, gt=0, description="Longest one guardrail may take on one call")
    guardrail_failure: Literal["deny", "allow"] = Field(
        "deny", description="A guardrail that raises or times out: deny (the call does not run, or its result is "
                            "withheld, and the model is told) or allow (the call goes on); either way it is recorded")
    client_result_guardrails: Literal["off", "observe", "mask", "block"] = Field(
        "mask", description="The results of the client's own tools, as the next request brings them, pass the "
                            "guardrails before the provider reads them: off, observe (decisions recorded, nothing "
                            "changed), mask (masks applied; blocks recorded only) or block (masks and blocks applied)")
    guardrail_max_result_bytes: int = Field(
        1024 * 1024, ge=1, description="result_size: a tool result longer than this is cut to it")
    guardrail_denied_values: dict[str, list[str]] = Field(
        default_factory=dict, description="denied_values: glob patterns of argument values a tool's call may not "
                                          "carry, by tool name or glob ('*' for every tool), e.g. "
                                          "{\"fs__*\": [\"/etc/*\", \"*/.ssh/*\"]}")
    guardrail_allowed_url_hosts: list[str] = Field(
        default_factory=list, description="url_hosts: the hosts that URLs in arguments (values of arguments named "
                                          "like url, uri, endpoint, href) may name: names, '.example.com' for it "
                                          "and its subdomains")
    guardrail_injection: Literal["flag", "block"] = Field(
        "flag", description="injection: what a result with prompt-injection markers gets: flag (recorded, the "
                            "model reads it) or block")
    tool_aliases: dict[str, dict[str, list[str]]] = Field(
        default_factory=dict, description="Other names the gateway's tools accept for a parameter, quietly, by tool "
                                          "then parameter, e.g. {\"read_file\": {\"path\": [\"file_path\"]}}; "
                                          "each use is counted (toolspan_tool_aliases_used_total)")
    argument_repair: RepairMode = Field(
        "off", description="Arguments of a gateway tool's call that fail its parse step in a way with one sure fix "
                           "(a rename to the one accepted name that fits, a number or boolean sent as a string, a "
                           "bare value where an array is wanted): off, observe (the fix is recorded; the call stays "
                           "rejected) or apply (the tool runs on the fixed arguments; outcome repaired)")
    tool_argument_repair: dict[str, RepairMode] = Field(
        default_factory=dict, description="argument_repair by tool name or glob pattern (fs__*), over the "
                                          "gateway's; a tool's own argument_repair, then a key's, come over this")
    interrupt_mode: InterruptMode = Field(
        "wait", description="A tool call that needs a reviewer (approval=True, or its body raised Interrupt): wait "
                            "(the request waits for a decision at /v1/approvals or /ui/approvals), or hand_back "
                            "(the call comes back to the client as one of its own, to answer in the reviewer's place)")
    approval_timeout_seconds: float = Field(
        300.0, gt=0, description="Longest wait for a reviewer's decision (a tool's approval_timeout overrides it); "
                                 "then the model is told nobody decided")
    approvals_max_pending: int = Field(
        1000, ge=1, description="Tool calls waiting for a reviewer at once, all keys together (each holds its "
                                "request); past it the waiting call nearest its time limit of the key holding the "
                                "most (the new call counted) is pushed out, or, when that key is the caller's own "
                                "or there are no keys, the new call is refused: such a call does not run, and the "
                                "model is told no approval could be asked")
    approvals_max_pending_per_key: int = Field(
        250, ge=1, description="Tool calls waiting for a reviewer at once for any one gateway key; past it the "
                               "key's next such call is refused in the same way")
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="Largest request body accepted (decoded)")
    max_upload_bytes: int = Field(512 * 1024 * 1024, ge=1024, description="Largest body accepted on upload routes "
                                                                         "(/v1/files, /v1/uploads), decoded")
    max_json_depth: int = Field(64, ge=2, le=200, description="Deepest nesting of arrays and objects in a JSON body")
    header_read_timeout_seconds: float = Field(
        75.0, gt=0, description="A connection must send a whole request head within this long of opening or of "
                                "its last answer (idle keep-alive connections close after it too)")
    body_read_timeout_seconds: float = Field(30.0, gt=0, description="Longest wait for the next part of a body")
    max_concurrent_requests: int = Field(1000, ge=1, description="Requests handled at once; more are refused at once "
                                                                 "(503 with retry-after), never queued")
    shutdown_grace_seconds: float = Field(20.0, ge=0, description="On SIGTERM, how long requests under way may "
                                                                  "run on before they are ended")
    pending_turn_capacity: int = Field(1000, ge=1, description="Mixed turns held for the client's follow-up")
    pending_turn_ttl_seconds: float = Field(900.0, gt=0, description="How long a mixed turn is held")
    answer_record_max_bytes: int = Field(
        256 * 1024, ge=0, description="Largest record kept of what a client was given under a gateway-made response "
                                      "id (its input and its response, for GET and input_items); past it the input, "
                                      "then the response, are left out and read from the provider instead. Also the "
                                      "largest Messages thread kept (a larger one's next turn is sent whole)")
    pending_turn_capacity_per_key: int = Field(
        250, ge=1, description="Mixed turns held for any one gateway key, at most (its least recently used go "
                               "first), so that one key cannot push the others' out")
    owned_response_capacity: int = Field(
        100_000, ge=1, description="Provider response ids remembered with the gateway key that made them (with "
                                   "keys set, a key reaches only its own responses)")
    owned_response_capacity_per_key: int = Field(
        25_000, ge=1, description="Provider response ids remembered for any one gateway key, at most")
    owned_response_ttl_seconds: float = Field(
        30 * 86400.0, gt=0, description="How long a response id's owner is remembered after its last use "
                                        "(OpenAI keeps a stored response 30 days)")
    state_url: str | None = Field(None, description="Where held turns live: unset, this process's memory; "
                                  "redis://host:6379/0, a Redis that replicas share")
    state_timeout_seconds: float = Field(1.0, gt=0, description="Longest wait for one command to the Redis state "
                                         "store; past it, a request that needs the state gets a 503")
    keepalive_seconds: float = Field(5.0, gt=0, description="SSE comment interval while tools run")
    tool_timeout_seconds: float = Field(30.0, gt=0, description="Default time limit of one tool call")
    tool_threads: int = Field(16, ge=1, description="Threads for sync tool bodies; a call waits for a free one "
                                                   "within its time limit, but when every thread is held by a "
                                                   "body that timed out, its outcome is an error of type "
                                                   "tool_busy, at once")
    record_tool_arguments: bool = Field(False, description="Put raw arguments on every tool.call span")
    argument_max_chars: int = Field(2048, ge=64, description="Raw arguments on spans are cut to this")
    redact_keys: tuple[str, ...] = Field(
        REDACT_KEYS, description="Argument values under keys containing any of these (any case; '-' and '_' "
                                 "alike) are masked on spans, and so are their values in status descriptions; "
                                 "so are query parameters so named in the access log, and caller headers so "
                                 "named stay behind when the caller's credentials do")
    metrics_max_models: int = Field(50, ge=1, description="Distinct model label values before '__other__'")
    metrics_max_label_chars: int = Field(
        128, ge=8, description="Longest model name kept as a metric label; longer ones count as '__other__'")
    metrics_key: SecretStr | None = Field(
        None, min_length=8,
        description="When set, GET /metrics needs Authorization: Bearer <metrics_key> (401 otherwise)")
    ui: bool = Field(True, description="Serve the trajectory page at /ui (the gateway keys open it, when set)")
    trace_ui_url: str | None = Field(
        None, description="Where the page links trace ids: an http(s) URL template with {trace_id}, e.g. "
                          "Grafana Explore on Tempo or Jaeger's http://jaeger:16686/trace/{trace_id}; unset: no links")
    trace_sampling: Literal["follow", "own"] = Field(
        "follow", description="follow: a caller's traceparent decides whether a request is sampled; own: each "
                              "request is a root span sampled by the configured sampler, linked to the caller's")
    telemetry: bool = Field(True, description="Spans and metrics on")
    telemetry_count_probes: bool = Field(
        False, description="Give /healthz, /readyz and /metrics a request span and count them in the request "
                           "metrics, as any other request; off: a scrape every 15 s puts no trace in the tracing "
                           "backend and the request panels count only traffic")
    trajectory_store: bool = Field(True, description="Record every trajectory into the embedded store "
                                                     "(SQLite) that `toolspan trajectories` and /ui read")
    trajectory_store_path: Path | None = Field(
        None, description="The store's file; unset: $XDG_DATA_HOME/toolspan/trajectories.sqlite3, "
                          "else ~/.local/share/toolspan/trajectories.sqlite3")
    trajectory_store_max_bytes: int = Field(256 * 2**20, ge=64 * 1024, description="Size limit of the store; "
                                                                                  "the oldest trajectories go first")
    trajectory_store_max_age_days: float = Field(30.0, gt=0, description="Trajectories older than this are deleted")
    capture_message_content: bool = Field(
        False, description="Put the messages sent to the model, the tools offered and its answers on the chat "
                           "spans (and so in the store), as the OpenTelemetry GenAI conventions' opt-in content "
                           "capture")
    message_content_max_chars: int = Field(
        16384, ge=256, description="Captured message content per span attribute, at most: longer texts are cut "
                                   "and the oldest messages left out")
    access_log: bool = Field(True, description="One line per request on the toolspan.access logger")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Least severe level logged")
    log_format: Literal["text", "json"] = Field("text", description="Log lines as text, or one JSON object each")
    # Tracing follows the standard OpenTelemetry variables (read here, like every other setting).
    otel_traces_exporter: str | None = Field(
        None, validation_alias=AliasChoices("OTEL_TRACES_EXPORTER", "otel_traces_exporter"),
        description="otlp, console or none (comma-separated); unset: otlp when an endpoint is set, else none")
    otel_exporter_otlp_endpoint: str | None = Field(
        None, validation_alias=AliasChoices("OTEL_EXPORTER_OTLP_ENDPOINT", "otel_exporter_otlp_endpoint"),
        description="OTLP over HTTP base URL (traces go to its /v1/traces, logs to its /v1/logs), e.g. "
                    "http://collector:4318; a URL ending in /v1/traces is taken as the traces URL")
    otel_exporter_otlp_traces_endpoint: str | None = Field(
        None, validation_alias=AliasChoices("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "otel_exporter_otlp_traces_endpoint"),
        description="The full OTLP traces URL, used as it is; wins over otel_exporter_otlp_endpoint")
    otel_logs_exporter: str | None = Field(
        None, validation_alias=AliasChoices("OTEL_LOGS_EXPORTER", "otel_logs_exporter"),
        description="Where the decision log records go (tool calls allowed or denied, approvals): otlp, "
                    "console or none (comma-separated); unset: none, since trace backends take no logs")
    otel_exporter_otlp_logs_endpoint: str | None = Field(
        None, validation_alias=AliasChoices("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", "otel_exporter_otlp_logs_endpoint"),
        description="The full OTLP logs URL, used as it is; wins over otel_exporter_otlp_endpoint (whose "
                    "/v1/logs the records go to otherwise)")
    otel_exporter_otlp_protocol: str = Field(
        "http/protobuf", validation_alias=AliasChoices("OTEL_EXPORTER_OTLP_PROTOCOL", "otel_exporter_otlp_protocol"),
        description="OTLP protocol; only http/protobuf is supported")
    otel_service_name: str | None = Field(
        None, validation_alias=AliasChoices("OTEL_SERVICE_NAME", "otel_service_name"),
        description="service.name of the spans; unset: the one in OTEL_RESOURCE_ATTRIBUTES, else toolspan")
    otel_resource_attributes: str | None = Field(
        None, validation_alias=AliasChoices("OTEL_RESOURCE_ATTRIBUTES", "otel_resource_attributes"),
        description="Resource attributes as key=value pairs, comma-separated, values percent-encoded")
    otel_propagators: str = Field(
        "tracecontext,baggage", validation_alias=AliasChoices("OTEL_PROPAGATORS", "otel_propagators"),
        description="Trace context formats read from callers and sent to the provider: tracecontext, "
                    "baggage or none (comma-separated)")
    otel_sdk_disabled: bool = Field(
        False, validation_alias=AliasChoices("OTEL_SDK_DISABLED", "otel_sdk_disabled"),
        description="true: no spans (metrics stay); a caller's trace context is still handed on")

    def store_path(self) -> Path:
        """Where the trajectory store lives: the setting, else the user's data directory (XDG)."""
        if self.trajectory_store_path is not None:
            return self.trajectory_store_path
        data = os.environ.get("XDG_DATA_HOME", "").strip()
        base = Path(data) if data and Path(data).is_absolute() else Path.home() / ".local" / "share"
        return base / "toolspan" / "trajectories.sqlite3"

    @field_validator("keys")
    @classmethod
    def _key_names(cls, keys: dict[str, GatewayKey]) -> dict[str, GatewayKey]:
        # A key's name is shown on the page, in the CLI and in trajectory ids: nothing to escape there.
        each_matches(keys, KEY_NAME, "gateway key name {!r}: use up to 64 letters, digits, '.', '_', '-', ':', "
                                      "'@' or '+'")
        return keys

    @field_validator("allowed_hosts")
    @classmethod
    def _host_names(cls, hosts: list[str] | None) -> list[str] | None:
        # The Host check compares names only: a port here would never match and refuse everyone.
        if hosts is not None and not hosts:
            raise ValueError("allowed_hosts lists no name: leave it unset for the default, or give '*' for any")
        each_matches(hosts or (), HOST_ENTRY, "allowed_hosts entry {!r}: give a host name or address without a "
                                               "port (gateway.internal, .example.com, ::1) or '*'")
        return hosts

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, origins: list[str]) -> list[str]:
        # As browsers write the Origin header; "null" is every sandboxed page's, so never one to trust.
        each_matches(origins, ORIGIN_ENTRY, "allowed_origins entry {!r}: give a scheme, a host and any port, "
                                             "with no path, such as https://app.example.com or http://localhost:3000")
        return origins

    @field_validator("mcp_servers", "responses_mcp_servers")
    @classmethod
    def _mcp_server_names(cls, servers: dict[str, McpServer]) -> dict[str, McpServer]:
        for name in servers:
            if len(name) > 32 or not MCP_SERVER_NAME.fullmatch(name):
                raise ValueError(f"MCP server name {name!r}: use up to 32 letters, digits, '-' or single '_'")
        return servers

    @model_validator(mode="after")
    def _responses_mcp_servers(self) -> Settings:
        labels: dict[str, str] = {}
        urls: dict[str, str] = {}
        for name, server in self.responses_mcp_servers.items():
            at = ("responses_mcp_servers", name)
            if name in self.mcp_servers:
                raise Refused(at, "mcp_servers has a server of that name too: both prefix their tools' names with "
                                  "it, so give one of them another name")
            label, url = server.server_label(name), comparable_url(server.url)
            if label in labels:
                raise Refused(at, f"its label {label!r} is {labels[label]}'s too: a request could not tell them apart")
            if url in urls:
                raise Refused(at, f"its url is {urls[url]}'s too: a request could not tell them apart")
            labels[label] = urls[str(url)] = name
        return self

    @field_validator("trace_ui_url", mode="before")
    @classmethod
    def _trace_link(cls, value: object) -> object:
        if isinstance(value, str) and not value.strip():
            return None
        # A link the page renders: only a web address, and one that names the trace.
        if isinstance(value, str) and (not value.startswith(("http://", "https://")) or "{trace_id}" not in value):
            raise ValueError("trace_ui_url must be an http(s) URL containing {trace_id}")
        return value

    @field_validator("otel_service_name", "otel_resource_attributes", mode="before")
    @classmethod
    def _otel_empty_is_unset(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("otel_sdk_disabled", mode="before")
    @classmethod
    def _otel_boolean(cls, value: object) -> object:
        # The OpenTelemetry rule: only "true", in any case, is true; anything else (empty too) is false.
        return value.strip().lower() == "true" if isinstance(value, str) else value

    @field_validator("metrics_key", "otel_traces_exporter", "otel_logs_exporter",
                     "otel_exporter_otlp_endpoint", "otel_exporter_otlp_logs_endpoint",
                     "otel_exporter_otlp_traces_endpoint", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        # `TOOLSPAN_UPSTREAM=` (as compose writes an unset ${VAR:-}) means "not configured".
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("log_level", "log_format", mode="before")
    @classmethod
    def _any_case(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value  # TOOLSPAN_LOG_LEVEL=INFO

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings
