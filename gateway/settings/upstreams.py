"""The upstreams table (issue 55): each provider the gateway forwards to, by name, with the models
it serves, its key, its transport, the APIs it speaks and where its requests fall back to. The
`upstream` / `upstream_*` settings stay the one default upstream (named `default`) when no table
says otherwise. `gateway.provider.routing` makes the routing table of these."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from gateway.provider.cooldowns import CooldownRule
from gateway.provider.proxies import DIRECT, parse_proxy
from gateway.provider.route import tls_context
from gateway.provider.routing import (
    EVERY_API,
    SERVED_BY_KIND,
    ApiName,
    Balance,
    RoutingTable,
    UpstreamRoute,
    is_pattern,
)
from gateway.settings.text import Refused

UpstreamKind = Literal["openai", "azure", "anthropic", "vllm", "ollama", "deepseek", "compatible"]
UPSTREAM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
DEFAULT_NAME = "default"  # the upstream the `upstream` setting describes


class UpstreamEntry(BaseModel):
    """One upstream of the `upstreams` table."""

    model_config = ConfigDict(extra="forbid")
    url: str = Field(description="Base URL, ending in /v1 (an Azure resource: its endpoint)")
    kind: UpstreamKind = Field("openai", description="What the provider is, as upstream_kind")
    api_key: SecretStr | None = Field(None, description="Its key (better: api_key_env); unset, with no "
                                                        "api_key_env: called with no key of the gateway's (the "
                                                        "caller's credentials go on only where no upstream has a "
                                                        "key and there are no gateway keys)")
    api_key_env: str | None = Field(None, description="The environment variable holding its key, read at start-up")
    models: list[str] = Field(default_factory=list, description="The models it serves: names and glob patterns "
                                                                "(gpt-4o*), matched in this order")
    aliases: dict[str, str] = Field(default_factory=dict, description="Names clients use for its models: client "
                                                                       "name -> the provider's (fast = gpt-4o-mini)")
    fallbacks: list[str] = Field(default_factory=list, description="Upstreams a request goes to, in order, when "
                                                                   "this one fails before answering")
    apis: list[ApiName] | None = Field(None, description="The wire APIs it speaks (chat, responses, messages); "
                                                             "unset: those its kind speaks")
    timeout_seconds: float | None = Field(None, gt=0, description="Limit on one call; unset: upstream_timeout_seconds")
    proxy: str | None = Field(None, description="Its HTTP proxy, or direct; unset: upstream_proxy's rule")
    ca_bundle: Path | None = Field(None, description="PEM CA bundle its TLS is checked against")
    client_cert: Path | None = Field(None, description="PEM client certificate for mutual TLS")
    client_key: Path | None = Field(None, description="PEM private key of client_cert")
    azure_api_version: str | None = Field(None, description="api-version for an azure upstream; unset: "
                                                            "azure_api_version")
    provider_name: str | None = Field(None, description="gen_ai.provider.name on its spans; unset: its kind's")

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError("it must be an http:// or https:// URL")
        return url.rstrip("/")

    @field_validator("models")
    @classmethod
    def _models(cls, models: list[str]) -> list[str]:
        for model in models:
            if not model or model != model.strip():
                raise ValueError(f"{model!r} is not a model name or pattern")
        return models

    @model_validator(mode="after")
    def _one_key(self) -> UpstreamEntry:
        if self.api_key is not None and self.api_key_env is not None:
            raise Refused(("api_key_env",), "give api_key or api_key_env, not both")
        if self.client_key is not None and self.client_cert is None:
            raise Refused(("client_key",), "client_key is set without client_cert")
        return self

    def key(self) -> SecretStr | None:
        """Its key: the configured one, or the environment's (a variable named but unset or empty is an
        operator's error, said at start-up)."""
        if self.api_key_env is None:
            return self.api_key
        value = os.environ.get(self.api_key_env, "")
        if not value:
            raise ValueError(f"api_key_env names {self.api_key_env}, which is not set")
        return SecretStr(value)

    def served_apis(self) -> tuple[str, ...]:
        return tuple(self.apis) if self.apis is not None else SERVED_BY_KIND.get(self.kind, EVERY_API)


def check_table(upstreams: dict[str, UpstreamEntry], default: str | None, names: set[str]) -> None:
    """The table's names and references (`names`: every upstream, the default one included): a
    ValueError (`Refused`) naming the entry and the field."""
    for name, entry in upstreams.items():
        if not UPSTREAM_NAME.fullmatch(name):
            raise Refused(("upstreams", name), "a name is letters, digits, '.', '_' and '-' (64 at most)")
        for fallback in entry.fallbacks:
            if fallback not in names:
                raise Refused(("upstreams", name, "fallbacks"), f"{fallback!r} is not an upstream")
            if fallback == name:
                raise Refused(("upstreams", name, "fallbacks"), "an upstream cannot fall back to itself")
        for alias in entry.aliases:
            if is_pattern(alias):
                raise Refused(("upstreams", name, "aliases"), f"{alias!r} is a pattern; an alias is a name")
    if default is not None and default not in names:
        raise Refused(("default_upstream",), f"{default!r} is not an upstream")


class ProviderSettings(BaseModel):
    """The settings of where requests go: the one default upstream (`upstream`, `upstream_*`), the
    `upstreams` table, and how calls are shared, retried and cooled down. `Settings` has them."""

    upstream: str | None = Field(None, description="Provider base URL, e.g. https://api.openai.com/v1: the one "
                                                   "upstream named default (beside any of `upstreams`); unset, "
                                                   "with no `upstreams`: the built-in scripted model")
    upstream_api_key: SecretStr | None = Field(None, description="Provider key; unset: the caller's "
                                                                 "Authorization header is passed through")
    upstream_kind: UpstreamKind = Field(
        "openai", description="What the provider is: openai, or any OpenAI-compatible server (vllm, ollama, "
                              "deepseek, compatible), azure (deployment paths, api-version, api-key header), or "
                              "anthropic (the Messages API; its key as x-api-key, an anthropic-version default). "
                              "openai and azure serve Chat Completions and Responses, anthropic Messages: a request "
                              "for another API is refused at once (400), saying so; the compatible kinds are asked "
                              "for all three")
    upstream_provider_name: str | None = Field(
        None, description="gen_ai.provider.name on spans; unset: the one the upstream kind implies")
    azure_api_version: str = Field("2024-10-21", description="api-version for an azure upstream, unless the "
                                                             "caller sends one")
    upstream_timeout_seconds: float = Field(120.0, gt=0, description="Limit on one upstream call")
    upstream_connect_timeout_seconds: float = Field(10.0, gt=0, description="Limit on opening one connection to "
                                                                          "the provider")
    upstream_retry_attempts: int = Field(
        2, ge=0, description="After a round in which gateway tools ran, how many more times the gateway itself "
                             "tries a provider call that failed with a 429, 500, 502, 503, 504, 529 or a "
                             "broken connection (the client is told not to resend: that would run the tools again)")
    upstream_retry_max_seconds: float = Field(
        20.0, ge=0, allow_inf_nan=False,
        description="Longest wait, in all, between those attempts of one provider call; a retry-after asking "
                    "for more ends the retries at once")
    upstream_retry_backoff_seconds: float = Field(
        0.5, gt=0, allow_inf_nan=False,
        description="First wait between those attempts when the provider sends no retry-after; it doubles "
                    "(up to 8 s), with jitter")
    upstream_idle_seconds: float = Field(
        15.0, gt=0, allow_inf_nan=False,
        description="A pooled connection to the provider (the tool loop's and the pass-through's) that has carried "
                    "no request for this long is closed, so a burst's descriptors are given back")
    upstream_max_connections: int = Field(1000, ge=1, description="Open connections to the provider, at most, for "
                                                                  "the tool loop's calls; the pass-through routes "
                                                                  "have as many again of their own")
    upstream_proxy: str | None = Field(
        None, description="HTTP proxy to reach the provider through, http://[user:password@]host:port (CONNECT "
                          "for an https provider); 'direct': none; unset: https_proxy / http_proxy / all_proxy / "
                          "no_proxy, each in either case (the lowercase name first; HTTP_PROXY too, which "
                          "curl leaves out)")
    upstream_ca_bundle: Path | None = Field(
        None, description="PEM file of the CAs the provider's certificate is checked against, in place of the "
                          "system's (as curl's --cacert); unset: the system's")
    upstream_client_cert: Path | None = Field(
        None, description="PEM client certificate presented to an https provider (mutual TLS); its key in it "
                          "or in upstream_client_key")
    upstream_client_key: Path | None = Field(None, description="PEM private key of upstream_client_cert")
    upstreams: dict[str, UpstreamEntry] = Field(
        default_factory=dict, description="Upstreams by name (JSON in TOOLSPAN_UPSTREAMS): each a url, kind, "
                                          "api_key or api_key_env, the models it serves (names and glob patterns), "
                                          "aliases (client name -> provider name), fallbacks (upstream names), "
                                          "apis, timeout_seconds, proxy, ca_bundle, client_cert, client_key; a "
                                          "request's model picks one (docs/upstreams.md)")
    model_fallbacks: dict[str, list[str]] = Field(
        default_factory=dict, description="Fallbacks of particular models, by the name clients use: upstream names, "
                                          "in order, tried before the fallbacks of the model's upstreams "
                                          "(gpt-4o = [\"azure-west\", \"openai\"])")
    default_upstream: str | None = Field(
        None, description="The upstream for models no entry of `upstreams` claims; unset: `default` (the "
                          "`upstream` setting) when set, else none (such a model is a 404 model_not_found)")
    load_balancing: Balance = Field(
        "round_robin", description="How upstreams that serve one model alike share its calls: round_robin, or "
                                   "least_in_flight (fewest calls under way first)")
    cooldown_failures: int = Field(3, ge=1, description="Failures (connection, timeout, 429, 5xx) of an upstream "
                                                         "within cooldown_window_seconds that take it out of its "
                                                         "routes, while another can answer")
    cooldown_window_seconds: float = Field(30.0, gt=0, description="The window cooldown_failures counts in")
    cooldown_seconds: float = Field(30.0, gt=0, description="How long an upstream stays out; its next call then "
                                                             "is its probe (a failure puts it back out at once)")

    @field_validator("upstream", "upstream_api_key", "upstream_proxy", "upstream_ca_bundle", "upstream_client_cert",
                     "upstream_client_key", "default_upstream", mode="before")
    @classmethod
    def _unset_when_empty(cls, value: object) -> object:
        # `TOOLSPAN_UPSTREAM=` (as compose writes an unset ${VAR:-}) means "not configured".
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("upstream_proxy")
    @classmethod
    def _proxy_url(cls, value: str | None) -> str | None:
        if value is not None and value.strip().lower() != DIRECT:
            parse_proxy(value, "upstream_proxy")  # a ValueError naming the setting
        return value

    @model_validator(mode="after")
    def _provider_tls(self) -> ProviderSettings:
        # Read now, so that a missing file or a bad PEM fails at start-up, not on the first call.
        if self.upstream_client_key is not None and self.upstream_client_cert is None:
            raise ValueError("upstream_client_key is set without upstream_client_cert")
        if self.upstream_ca_bundle is not None or self.upstream_client_cert is not None:
            tls_context(self.upstream_ca_bundle, self.upstream_client_cert, self.upstream_client_key)
        return self

    @model_validator(mode="after")
    def _table(self) -> ProviderSettings:
        if self.upstream is not None and DEFAULT_NAME in self.upstreams:
            raise Refused(("upstreams", DEFAULT_NAME), "that name is the `upstream` setting's; give the entry "
                                                       "another name")
        names = {*self.upstreams, *((DEFAULT_NAME,) if self.upstream is not None else ())}
        check_table(self.upstreams, self.default_upstream, names)
        for model, fallbacks in self.model_fallbacks.items():
            for fallback in fallbacks:
                if fallback not in names:
                    raise Refused(("model_fallbacks", model), f"{fallback!r} is not an upstream")
        for name, entry in self.upstreams.items():  # read now: a variable named but unset fails at start-up
            try:
                entry.key()
            except ValueError as exc:
                raise Refused(("upstreams", name, "api_key_env"), str(exc)) from None
            if entry.proxy is not None and entry.proxy.strip().lower() != DIRECT:
                parse_proxy(entry.proxy, f"upstreams.{name}.proxy")
            if entry.ca_bundle is not None or entry.client_cert is not None:
                tls_context(entry.ca_bundle, entry.client_cert, entry.client_key)
        return self

    @property
    def has_upstream(self) -> bool:
        """A provider is configured (else the built-in scripted model answers)."""
        return self.upstream is not None or bool(self.upstreams)

    def upstream_entries(self) -> dict[str, UpstreamEntry]:
        """Every upstream by name: the `upstream` setting's first, as `default` (its key and its
        transport the upstream_* settings), then the table's. An entry's unset timeout, transport
        and api-version are the upstream_* settings'."""
        entries: dict[str, UpstreamEntry] = {}
        if self.upstream is not None:
            # Not validated again: the provider's route says what is wrong with the URL, in its words.
            entries[DEFAULT_NAME] = UpstreamEntry.model_construct(
                url=self.upstream.rstrip("/"), kind=self.upstream_kind, api_key=self.upstream_api_key,
                provider_name=self.upstream_provider_name)
        entries.update(self.upstreams)
        return {name: entry.model_copy(update={
            "timeout_seconds": entry.timeout_seconds or self.upstream_timeout_seconds,
            "proxy": entry.proxy or self.upstream_proxy,
            "ca_bundle": entry.ca_bundle or self.upstream_ca_bundle,
            "client_cert": entry.client_cert if entry.client_cert is not None else self.upstream_client_cert,
            "client_key": entry.client_key if entry.client_cert is not None else self.upstream_client_key,
            "azure_api_version": entry.azure_api_version or self.azure_api_version}) for name, entry in entries.items()}

    def routing_table(self) -> RoutingTable:
        """The routing table of every upstream; the default one is `default_upstream`, else the
        `upstream` setting's when it is set."""
        routes = {name: UpstreamRoute(entry.kind, entry.url, tuple(entry.models), dict(entry.aliases),
                                      tuple(entry.fallbacks), entry.served_apis())
                  for name, entry in self.upstream_entries().items()}
        default = self.default_upstream or (DEFAULT_NAME if self.upstream is not None else None)
        return RoutingTable(routes, default, {model: tuple(names) for model, names in self.model_fallbacks.items()})

    def cooldown_rule(self) -> CooldownRule:
        return CooldownRule(self.cooldown_failures, self.cooldown_window_seconds, self.cooldown_seconds)
