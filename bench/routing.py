"""What the routing decision costs (issue 55): `Upstreams.targets`, the one step a provider call
takes to learn where it goes, for each way a model is found, as CPU per decision and as a ratio
to a baseline every request pays in the same run (decoding a small Chat request body with orjson).

The table is the one docs/upstreams.md shows (OpenAI, two Azure regions sharing gpt-4o with
fallbacks, Anthropic, a local vLLM) with 40 more upstreams of patterns in front of the default,
so that a model found by pattern or by the default walks a long table. Cooldowns are kept in
memory (with Redis, a route of several upstreams adds one MGET round trip, which the proxy bench
measures on the wire, not this one).

    python bench/routing.py [--decisions 20000] [--repeats 9]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

import orjson

from gateway.provider.cooldowns import CooldownRule, MemoryCooldowns
from gateway.provider.routing import Balancer, RoutingTable, UpstreamRoute
from gateway.provider.upstreams import Upstreams

BODY = orjson.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
                     "tools": [{"type": "function", "function": {"name": "weather", "parameters": {
                         "type": "object", "properties": {"city": {"type": "string"}}}}}]})


def table(extra_patterns: int) -> RoutingTable:
    routes = {
        "openai": UpstreamRoute("openai", "https://api.openai.com/v1", ("gpt-4.1", "o4-mini", "gpt-4.1-*")),
        "azure-east": UpstreamRoute("azure", "https://east.example", ("gpt-4o", "gpt-4o-mini"), {"fast": "gpt-4o-mini"},
                                    ("azure-west", "openai")),
        "azure-west": UpstreamRoute("azure", "https://west.example", ("gpt-4o",), {}, ("azure-east", "openai")),
        "anthropic": UpstreamRoute("anthropic", "https://api.anthropic.com/v1", ("claude-*",), apis=("messages",)),
        "local": UpstreamRoute("vllm", "http://vllm:8000/v1", ("qwen*", "llama*")),
    }
    for index in range(extra_patterns):
        routes[f"extra-{index}"] = UpstreamRoute("compatible", f"http://extra-{index}/v1", (f"family-{index}-*",))
    return RoutingTable(routes, "openai")


def upstreams(routing: RoutingTable) -> Upstreams:
    return Upstreams(routing, dict.fromkeys(routing.upstreams), dict.fromkeys(routing.upstreams, "openai"),  # type: ignore[arg-type]
                     MemoryCooldowns(CooldownRule()), Balancer())


def single() -> Upstreams:
    """The configuration of before issue 55: one upstream, the default."""
    routing = RoutingTable({"default": UpstreamRoute("openai", "https://api.openai.com/v1")}, "default")
    return Upstreams(routing, {"default": None}, {"default": "openai"}, MemoryCooldowns(CooldownRule()),  # type: ignore[dict-item]
                     Balancer())


async def per_call(step: Callable[[], Awaitable[object]], count: int) -> float:
    started = time.process_time()
    for _ in range(count):
        await step()
    return (time.process_time() - started) / count


async def main(decisions: int, repeats: int) -> None:
    many, one = upstreams(table(40)), single()

    async def baseline() -> object:
        return orjson.loads(BODY)

    cases: dict[str, Callable[[], Awaitable[object]]] = {
        "one upstream (the fast path)": lambda: one.targets("gpt-4o", "chat"),
        "by name, two deployments": lambda: many.targets("gpt-4o", "chat"),
        "by alias": lambda: many.targets("fast", "chat"),
        "by pattern (first upstream)": lambda: many.targets("gpt-4.1-mini", "chat"),
        "by pattern (45th upstream)": lambda: many.targets("family-39-x", "chat"),
        "by the default, kept route": lambda: many.targets("unknown-model", "chat"),
    }
    results: dict[str, list[float]] = {name: [] for name in ("baseline", *cases)}
    for _ in range(repeats):
        results["baseline"].append(await per_call(baseline, decisions))
        for name, step in cases.items():
            results[name].append(await per_call(step, decisions))
    base = statistics.median(results["baseline"])
    print(f"baseline (orjson.loads of a {len(BODY)}-byte Chat body): {base * 1e6:.2f} µs")
    for name in cases:
        cost = statistics.median(results[name])
        print(f"{name:32} {cost * 1e6:6.2f} µs  {cost / base:5.2f}x the baseline")
    # A route's first decision for a model walks the table; later ones read the kept route.
    fresh = upstreams(table(40))
    started = time.process_time()
    for index in range(decisions):
        fresh.route(f"family-39-{index}")
    print(f"{'first decision, 45th pattern':32} {(time.process_time() - started) / decisions * 1e6:6.2f} µs")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=9)
    options = parser.parse_args()
    asyncio.run(main(options.decisions, options.repeats))
