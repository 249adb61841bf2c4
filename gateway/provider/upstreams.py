"""Every upstream of a gateway (issue 55): each one's client, the routing table that picks among
them by model, how deployments of one model share its calls, and which are cooling down. The
engine asks it where a provider call goes (`targets`) and tells it how each call went; the
pass-through, the response routes and the readiness probe ask it for a client."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gateway.errors import BadRequest, GatewayError, UpstreamRefused, UpstreamTimeout, UpstreamUnavailable
from gateway.provider.client import Upstream
from gateway.provider.cooldowns import CooldownRule, Cooldowns, MemoryCooldowns
from gateway.provider.routing import (
    EVERY_API,
    SERVED_BY_KIND,
    Balancer,
    Route,
    RoutingTable,
    Target,
    UpstreamRoute,
    candidates,
    matches,
    model_not_found,
)

ROUTES_KEPT = 4096  # models whose route is kept made; past it the kept ones are dropped (a caller picks names)
NAME_KEPT = 256  # characters of a model name whose route is kept: a longer one (a caller's) is routed each time
API_TITLES = {"chat": "Chat Completions", "responses": "Responses", "messages": "Messages"}


def falls_back(error: GatewayError) -> bool:
    """Whether a failed call may go to another upstream: the provider's 429, 5xx or 529, a broken
    or refused connection, a timeout. Not a 4xx of the request itself, which every upstream would
    refuse alike."""
    if isinstance(error, UpstreamTimeout):
        return True
    if isinstance(error, UpstreamRefused):
        return error.status == 429
    return isinstance(error, UpstreamUnavailable) and error.retryable


def fallback_reason(error: GatewayError) -> str:
    """A bounded word for why a call moved on: the provider's status (429, 500, 503, 529 ...), a
    timeout, or a connection that failed."""
    if isinstance(error, UpstreamTimeout):
        return "timeout"
    if isinstance(error, UpstreamRefused):
        return str(error.status)
    code = error.code or ""
    if code == "upstream_overloaded":  # Anthropic's overloaded_error, said in its stream: its 529
        return "529"
    status = code.removeprefix("upstream_")
    return status if code.startswith("upstream_") and status.isdigit() else "connection"


class Upstreams:
    """The upstreams by name, each with its client, and the routing over them. `providers`: each
    one's gen_ai.provider.name; `on_state` hears an upstream go out (cooling down) or come back."""

    def __init__(self, table: RoutingTable, clients: Mapping[str, Upstream], providers: Mapping[str, str],
                 cooldowns: Cooldowns, balancer: Balancer,
                 on_state: Callable[[str, bool], None] = lambda name, up: None,
                 translated: Mapping[str, tuple[str, ...]] | None = None) -> None:
        self.table = table
        self.clients = clients
        self.providers = providers
        self.cooldowns = cooldowns
        self.balancer = balancer
        self._on_state = on_state
        # The APIs a request of each API may be translated to, in the order to prefer them
        # (gateway.translate); none: every upstream is called in its client's API.
        self.translated = translated or {}
        self._routes: dict[str, Route | None] = {}
        spoken = {api for entry in table.upstreams.values() for api in entry.apis}
        self._spoken_natively = frozenset(spoken)
        self._spoken = frozenset(api for api in EVERY_API if api in spoken or not spoken.isdisjoint(
            self.translated.get(api, ())))
        for name in clients:
            on_state(name, True)
        # One upstream, the default, with no aliases: every model goes there as it is named, with
        # nothing to choose, count or cool down (the configuration of before issue 55, at its cost).
        default = table.default
        alone = (default is not None and len(clients) == 1 and default in clients
                 and not table.upstreams[default].aliases)
        self.only = default if alone and default is not None else None
        # The APIs that one upstream speaks itself: a request of another is translated.
        self.only_speaks = frozenset(table.upstreams[self.only].apis) if self.only is not None else frozenset()

    @classmethod
    def one(cls, client: Upstream, provider: str = "openai", name: str = "default") -> Upstreams:
        """The upstreams of a gateway with one provider, `client`: every model goes there."""
        route = UpstreamRoute(client.kind, client.base_url, apis=SERVED_BY_KIND.get(client.kind, EVERY_API))
        return cls(RoutingTable({name: route}, name), {name: client}, {name: provider}, MemoryCooldowns(CooldownRule()),
                   Balancer())

    @property
    def default(self) -> Upstream | None:
        """The client of the default upstream, if there is one."""
        return self.clients.get(self.table.default) if self.table.default is not None else None

    @property
    def only_kind(self) -> str | None:
        """The kind of the one upstream, when there is only one."""
        return self.table.upstreams[self.only].kind if self.only is not None else None

    def spoken(self, api: str, translated: bool = True) -> bool:
        """Whether any upstream speaks `api`, or (`translated`) one it is translated to."""
        return api in (self._spoken if translated else self._spoken_natively)

    def route(self, model: str, allowed: tuple[str, ...] | None = None) -> Route:
        """Where `model` goes; a 404 model_not_found naming the models the caller may use when no
        upstream serves it, or its key may not use it (`allowed`: the key's names and patterns)."""
        if allowed is not None and not any(matches(model, pattern) for pattern in allowed):
            raise model_not_found(model, self.offered(allowed))
        if model in self._routes:
            found = self._routes[model]
        elif len(model) > NAME_KEPT:
            found = self.table.route(model)
        else:
            if len(self._routes) >= ROUTES_KEPT:
                self._routes.clear()
            found = self._routes[model] = self.table.route(model)
        if found is None:
            raise model_not_found(model, self.offered(allowed))
        return found

    @property
    def kept_models(self) -> tuple[str, ...]:
        """The model names whose routes are kept made."""
        return tuple(self._routes)

    def offered(self, allowed: tuple[str, ...] | None = None) -> list[str]:
        """The model names a caller may ask for by name (`allowed`: its key's names and patterns)."""
        names = self.table.offered()
        return names if allowed is None else [m for m in names if any(matches(m, p) for p in allowed)]

    async def targets(self, model: str, api: str, allowed: tuple[str, ...] | None = None) -> list[Target]:
        """The upstreams a provider call of `api` for `model` may go to, in the order to try them:
        the route's primary ones balanced, then its fallbacks; those cooling down last (a call to
        one is its probe), those that do not speak `api` not at all (none left: a 400)."""
        if self.only is not None and allowed is None and api in self.only_speaks:
            return [Target(self.only, model)]
        route = self.route(model, allowed)
        names = {t.upstream for t in (*route.primary, *route.fallbacks)}
        cooling: dict[str, float] = {}
        if len(names) > 1:  # one upstream alone is never passed over: its state is not read
            cooling = await self.cooldowns.cooling(names)
            for name in names:
                self._on_state(name, cooling.get(name, 0.0) <= 0)
        found = candidates(route, self.balancer, lambda name: self._speaks(name, api), cooling)
        if not found:
            served = ", ".join(sorted({t.upstream for t in route.primary}))
            raise BadRequest(f"the model '{model[:200]}' is served here by {served}, which does not speak the "
                             f"{API_TITLES.get(api, api)} API, nor one it is translated to: ask for it in an API "
                             "that upstream speaks",
                             param="model", code="api_not_served")
        return found

    def _speaks(self, name: str, api: str) -> str | bool:
        """True when upstream `name` speaks `api`; else the API it speaks that `api` is translated
        to; else False."""
        apis = self.table.upstreams[name].apis
        if api in apis:
            return True
        return next((other for other in self.translated.get(api, ()) if other in apis), False)

    async def failed(self, target: Target) -> None:
        """A call to `target` failed in a way another upstream may not: counted toward its cooldown
        when there are others to go to."""
        if self.only is None and await self.cooldowns.failed(target.upstream):
            self._on_state(target.upstream, False)

    async def answered(self, target: Target) -> None:
        """`target` answered: when it was a probe, its cooldown is over."""
        if target.probe:
            await self.cooldowns.succeeded(target.upstream)
            self._on_state(target.upstream, True)

    def for_route(self, api: str | None) -> Upstream | None:
        """Where a request passed on as it is goes when its body names no model: the default
        upstream (if it speaks the route's API), else the one upstream there is."""
        default = self.default
        if default is not None and (api is None or api in self.table.upstreams[self.table.default or ""].apis):
            return default
        return next(iter(self.clients.values())) if len(self.clients) == 1 else None

    def ready_with(self) -> list[str]:
        """The upstreams of which one reachable makes the gateway ready: the default route's (the
        default and its fallbacks), else every upstream."""
        route = self.table.route_of_default()
        return [t.upstream for t in (*route.primary, *route.fallbacks)] if route is not None else list(self.clients)

    def end(self) -> None:
        """The gateway is shutting down: every upstream's waits end."""
        for client in self.clients.values():
            client.end()

    async def aclose(self) -> None:
        for client in self.clients.values():
            await client.aclose()
