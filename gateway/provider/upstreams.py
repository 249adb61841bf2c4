"""Every upstream of a gateway (issue 55): each one's client, the routing table that picks among
them by model, how deployments of one model share its calls, and which are cooling down. The
engine asks it where a provider call goes (`targets`) and tells it how each call went; the
pass-through, the response routes and the readiness probe ask it for a client."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase

from gateway.errors import GatewayError, UpstreamRefused, UpstreamTimeout
from gateway.provider.client import Upstream
from gateway.provider.cooldowns import Cooldowns
from gateway.provider.routing import Balancer, Route, RoutingTable, Target, candidates, model_not_found

ROUTES_KEPT = 4096  # models whose route is kept made; past it the kept ones are dropped (a caller picks names)


@dataclass(frozen=True)
class Fallback:
    """A provider call moved on from `source` to the next target because of `reason`."""

    source: str
    reason: str


def fallback_reason(error: GatewayError) -> str:
    """A bounded word for why a call moved on: the provider's status (429, 500, 503, 529 ...), a
    timeout, or a connection that failed."""
    if isinstance(error, UpstreamTimeout):
        return "timeout"
    if isinstance(error, UpstreamRefused):
        return str(error.status)
    code = error.code or ""
    return code.removeprefix("upstream_") if code.startswith("upstream_") and code[9:].isdigit() else "connection"


class Upstreams:
    """The upstreams by name, each with its client, and the routing over them."""

    def __init__(self, table: RoutingTable, clients: Mapping[str, Upstream], providers: Mapping[str, str],
                 cooldowns: Cooldowns, balancer: Balancer) -> None:
        self.table = table
        self.clients = clients
        self.providers = providers  # gen_ai.provider.name of each
        self.cooldowns = cooldowns
        self.balancer = balancer
        self._routes: dict[str, Route | None] = {}
        # One upstream, the default, no fallbacks: every model goes there, with nothing to choose.
        default = table.default
        alone = default is not None and len(clients) == 1 and default in clients
        self._only = default if alone and default is not None and not table.upstreams[default].fallbacks else None

    @property
    def default(self) -> Upstream | None:
        """The client of the default upstream, if there is one."""
        return self.clients.get(self.table.default) if self.table.default is not None else None

    def route(self, model: str, allowed: tuple[str, ...] | None = None) -> Route:
        """Where `model` goes; a 404 model_not_found naming the models the caller may use when no
        upstream serves it, or its key may not use it (`allowed`: the key's names and patterns)."""
        if allowed is not None and not any(fnmatchcase(model, pattern) for pattern in allowed):
            raise model_not_found(model, [m for m in self.table.offered() if any(fnmatchcase(m, p) for p in allowed)])
        if model in self._routes:
            found = self._routes[model]
        else:
            if len(self._routes) >= ROUTES_KEPT:
                self._routes.clear()
            found = self._routes[model] = self.table.route(model)
        if found is None:
            raise model_not_found(model, self.table.offered())
        return found

    async def targets(self, model: str, api: str, allowed: tuple[str, ...] | None = None) -> list[Target]:
        """The upstreams a provider call of `api` for `model` may go to, in the order to try them:
        the route's primary ones balanced, then its fallbacks; those cooling down last (a call to
        one is its probe), those that do not speak `api` not at all."""
        if self._only is not None and allowed is None:
            return [Target(self._only, model)]
        route = self.route(model, allowed)
        names = {t.upstream for t in (*route.primary, *route.fallbacks)}
        cooling = await self.cooldowns.cooling(names) if len(names) > 1 else {}
        return candidates(route, self.balancer, lambda name: api in self._apis(name), cooling)

    def _apis(self, name: str) -> tuple[str, ...]:
        return self.table.upstreams[name].served_apis()

    async def failed(self, target: Target) -> bool:
        """A retryable failure of `target`'s upstream, counted toward its cooldown when it has
        somewhere to fall back to; whether it now cools down."""
        return self._only is None and await self.cooldowns.failed(target.upstream)

    async def answered(self, target: Target) -> None:
        """`target` answered: when it was a probe, its cooldown is over."""
        if target.probe:
            await self.cooldowns.succeeded(target.upstream)

    def end(self) -> None:
        """The gateway is shutting down: every upstream's waits end."""
        for client in self.clients.values():
            client.end()

    async def aclose(self) -> None:
        for client in self.clients.values():
            await client.aclose()
