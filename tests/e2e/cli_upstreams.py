"""A gateway in front of three scripted providers, each on a server of its own, for the runs of the
real CLIs (issue 55: Codex CLI and Claude Code through a gateway with several upstreams): an OpenAI
one for the `gpt-*` models and the alias `team-default`, an Anthropic one for `claude-*`, and a
decoy that speaks every API and is listed first, whose models neither CLI asks for. There is no
default upstream: a model no entry claims is a 404, not a request to whichever upstream is first."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_aiohttp import AiohttpServer

from gateway.demo.model import ScriptedModel
from gateway.settings.model import Settings
from telemetry import names
from tests.conftest import Gateway, GatewayFactory, Script

OPENAI, ANTHROPIC, DECOY = "openai-a", "anthropic", "decoy"
TEAM_DEFAULT = "team-default"  # the name a client asks for ...
TEAM_MODEL = "gpt-5-codex"  # ... and the one the OpenAI upstream is sent
APIS = {OPENAI: ("chat", "responses"), ANTHROPIC: ("messages",), DECOY: ("chat", "responses", "messages")}


def table(urls: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The upstreams, the decoy first: were routing to take the first entry, or a pattern it does not
    match, the decoy would get the call."""
    return {
        DECOY: {"url": urls[DECOY], "kind": "compatible", "models": ["decoy-model", "gpt-4*", "claude-2*"]},
        OPENAI: {"url": urls[OPENAI], "kind": "openai", "models": ["gpt-*"], "aliases": {TEAM_DEFAULT: TEAM_MODEL}},
        ANTHROPIC: {"url": urls[ANTHROPIC], "kind": "anthropic", "models": ["claude-*"]},
    }


@dataclass
class Routed:
    """The gateway, and each scripted provider and its script by upstream name."""

    gateway: Gateway
    providers: dict[str, ScriptedModel]
    scripts: dict[str, Script]

    def models_sent(self) -> dict[str, list[str]]:
        """The `model` of each request each provider received, in order, by upstream."""
        return {name: [body.get("model", "") for body in model.requests] for name, model in self.providers.items()}

    def chat_upstreams(self) -> list[tuple[Any, Any]]:
        """(upstream, provider name) of each provider call's `chat {model}` span."""
        return [((s.attributes or {}).get(names.ATTR_UPSTREAM), (s.attributes or {}).get(names.ATTR_PROVIDER_NAME))
                for s in self.gateway.spans() if s.name.startswith(names.SPAN_CHAT_PREFIX + " ")]

    def calls_counted(self, upstream: str) -> float:
        """toolspan_upstream_requests_total for `upstream`, every model and status."""
        return self.gateway.metric(names.METRIC_UPSTREAM_REQUESTS, **{names.LABEL_UPSTREAM: upstream})


async def routed_gateway(aiohttp_server: AiohttpServer, make_gateway: GatewayFactory, tmp_path: Path) -> Routed:
    """The three scripted providers served, and the gateway routing among them (its store under `tmp_path`)."""
    providers: dict[str, ScriptedModel] = {}
    scripts: dict[str, Script] = {}
    urls: dict[str, str] = {}
    for name, apis in APIS.items():
        scripts[name] = Script()
        providers[name] = ScriptedModel(scripts[name], apis=apis)
        server = await aiohttp_server(providers[name].app())
        urls[name] = str(server.make_url("/v1"))
    settings = Settings(port=0, upstreams=table(urls), trajectory_store_path=tmp_path / "store.sqlite3")
    return Routed(await make_gateway(settings), providers, scripts)
