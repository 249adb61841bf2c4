"""Where a request's model goes (gateway.provider.routing, issue 55): by name or alias, then by the
first pattern in the table's order, then the default; an unknown model with no default is a 404
model_not_found naming the models one may use; fallbacks in order, each once; deployments of one
model sharing its calls; upstreams cooling down tried last, as probes, and upstreams that do not
speak the request's API not at all."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from gateway.errors import NotFound
from gateway.provider.routing import (
    Balancer,
    Route,
    RoutingTable,
    Target,
    UpstreamRoute,
    candidates,
    is_pattern,
    matches,
    model_not_found,
)


def upstream(*models: str, aliases: Mapping[str, str] | None = None, fallbacks: tuple[str, ...] = (),
             apis: tuple[str, ...] = ("chat", "responses")) -> UpstreamRoute:
    return UpstreamRoute("openai", "https://provider.example/v1", models, aliases or {}, fallbacks, apis)


TABLE = RoutingTable({
    "openai": upstream("gpt-4o", "gpt-4.1*", "o*", aliases={"smart": "gpt-4o"}),
    "azure-east": upstream("gpt-4o-mini", "gpt-4*", aliases={"fast": "gpt-4o-mini"}, fallbacks=("azure-west",)),
    "azure-west": upstream("gpt-4o-mini", "gpt-4*", aliases={"fast": "gpt-4o-mini-2024-07-18"}),
    "anthropic": upstream("claude-*", apis=("messages",)),
    "local": upstream("llama3.1:8b", "o3-local"),  # a name here beats openai's earlier pattern o*
}, default=None)


def test_a_model_goes_where_its_name_is_listed() -> None:
    assert TABLE.route("gpt-4o") == Route((Target("openai", "gpt-4o"),), (), "name")
    assert TABLE.route("llama3.1:8b") == Route((Target("local", "llama3.1:8b"),), (), "name")


def test_a_name_anywhere_beats_a_pattern_earlier_in_the_table() -> None:
    route = TABLE.route("o3-local")
    assert route is not None
    assert (route.primary, route.matched_by) == ((Target("local", "o3-local"),), "name")


def test_an_alias_names_the_providers_model() -> None:
    route = TABLE.route("smart")
    assert route == Route((Target("openai", "gpt-4o"),), (), "alias")


def test_the_first_pattern_in_the_tables_order_picks_the_upstream() -> None:
    # gpt-4.1-mini matches openai's gpt-4.1* and the Azure ones' gpt-4*: openai's comes first.
    assert TABLE.route("gpt-4.1-mini") == Route((Target("openai", "gpt-4.1-mini"),), (), "pattern")
    reordered = RoutingTable({name: TABLE.upstreams[name] for name in ("azure-east", "openai", "azure-west")}, None)
    route = reordered.route("gpt-4.1-mini")
    assert route is not None  # the azure ones' pattern first: both serve it, and openai does not
    assert route.primary == (Target("azure-east", "gpt-4.1-mini"), Target("azure-west", "gpt-4.1-mini"))


def test_upstreams_listing_the_same_pattern_serve_it_alike() -> None:
    route = TABLE.route("gpt-4-turbo")
    assert route is not None
    assert route.matched_by == "pattern"
    assert route.primary == (Target("azure-east", "gpt-4-turbo"), Target("azure-west", "gpt-4-turbo"))
    assert route.fallbacks == ()  # east's fallback is west, already a primary one


def test_a_model_no_entry_claims_goes_to_the_default() -> None:
    table = RoutingTable({**TABLE.upstreams, "default": upstream(fallbacks=("local",))}, default="default")
    assert table.route("mistral-large") == Route((Target("default", "mistral-large"),),
                                                 (Target("local", "mistral-large"),), "default")
    assert table.route("gpt-4o") == Route((Target("openai", "gpt-4o"),), (), "name")  # the table first


def test_with_no_default_an_unknown_model_is_a_404_naming_the_models_one_may_use() -> None:
    assert TABLE.route("mistral-large") is None
    error = model_not_found("mistral-large", TABLE.offered())
    assert isinstance(error, NotFound)
    assert (error.status, error.code, error.param) == (404, "model_not_found", "model")
    assert error.message == ("the model 'mistral-large' is not served here; the models you may use: fast, gpt-4o, "
                             "gpt-4o-mini, llama3.1:8b, o3-local, smart")  # names and aliases, no patterns


def test_the_404_lists_a_bounded_number_of_models_and_cuts_a_long_name() -> None:
    error = model_not_found("x" * 10_000, [f"model-{n:03}" for n in range(50)])
    assert error.message.startswith("the model '" + "x" * 200 + "' is not served here")
    assert error.message.endswith("model-019 and 30 more")
    assert model_not_found("gpt-5", []).message.endswith("the models you may use: none")


def test_fallbacks_follow_in_order_each_once_none_of_the_primary_ones() -> None:
    table = RoutingTable({
        "a": upstream("m", fallbacks=("c", "b", "d")),
        "b": upstream("m", fallbacks=("e", "c")),
        "c": upstream(fallbacks=("a",)),
        "d": upstream(),
        "e": upstream(),
    }, default=None)
    route = table.route("m")
    assert route is not None
    assert [t.upstream for t in route.primary] == ["a", "b"]
    # a's fallbacks, then b's, each once, never a or b again (b is a fallback of a, and primary)
    assert [t.upstream for t in route.fallbacks] == ["c", "d", "e"]


def test_each_upstream_with_an_alias_of_the_model_serves_it_under_its_own_name() -> None:
    route = TABLE.route("fast")
    assert route is not None
    assert route.matched_by == "alias"
    assert route.primary == (Target("azure-east", "gpt-4o-mini"), Target("azure-west", "gpt-4o-mini-2024-07-18"))


def test_a_fallback_is_asked_for_the_model_by_the_name_its_primary_gives_it() -> None:
    table = RoutingTable({"east": upstream(aliases={"fast": "gpt-4o-mini"}, fallbacks=("west", "plain")),
                          "west": upstream("gpt-4o-mini"),
                          "plain": upstream()}, None)
    route = table.route("fast")
    assert route is not None
    assert route.primary == (Target("east", "gpt-4o-mini"),)
    assert route.fallbacks == (Target("west", "gpt-4o-mini"), Target("plain", "gpt-4o-mini"))


def test_patterns_are_globs_matched_with_case() -> None:
    assert is_pattern("gpt-4o*")
    assert is_pattern("claude-?-opus")
    assert is_pattern("o[13]")
    assert not is_pattern("llama3.1:8b")
    assert matches("gpt-4o-mini", "gpt-4o*")
    assert not matches("GPT-4o-mini", "gpt-4o*")
    assert matches("o3", "o[13]")
    assert not matches("o2", "o[13]")
    assert not matches("gpt-4o-mini", "gpt-4o")  # a name is matched whole


def test_the_routing_table_is_described_line_by_line() -> None:
    table = RoutingTable({"east": upstream("gpt-4o", aliases={"fast": "gpt-4o-mini"}, fallbacks=("west",)),
                          "west": upstream()}, default="west")
    assert table.describe() == [
        "  east: openai https://provider.example/v1: gpt-4o, fast -> gpt-4o-mini; falls back to west",
        "  west (default): openai https://provider.example/v1: (no models)"]


# --- sharing the load -------------------------------------------------------------------------------

A, B, C = Target("a", "m"), Target("b", "m"), Target("c", "m")


def names(targets: list[Target]) -> str:
    return "".join(t.upstream for t in targets)


def test_round_robin_takes_each_deployment_first_in_turn() -> None:
    balancer = Balancer("round_robin")
    assert [names(balancer.ordered([A, B, C])) for _ in range(4)] == ["abc", "bca", "cab", "abc"]


def test_each_group_of_deployments_has_its_own_turn() -> None:
    balancer = Balancer("round_robin")
    assert names(balancer.ordered([A, B])) == "ab"
    assert names(balancer.ordered([A, C])) == "ac"  # another route's first turn
    assert names(balancer.ordered([A, B])) == "ba"
    assert names(balancer.ordered([A])) == "a"  # one deployment: nothing to share


def test_least_in_flight_puts_the_least_busy_first_ties_in_turn() -> None:
    balancer = Balancer("least_in_flight")
    balancer.started("a")
    balancer.started("a")
    balancer.started("b")
    assert names(balancer.ordered([A, B, C])) == "cba"
    balancer.ended("a")
    balancer.ended("a")
    balancer.ended("b")
    # all idle again: the turn decides, and it has moved on by one
    assert names(balancer.ordered([A, B, C])) == "bca"


# --- the targets of one call ------------------------------------------------------------------------

ROUTE = Route((A, B), (C, Target("d", "m-d")), "name")


def test_candidates_are_the_balanced_primary_ones_then_the_fallbacks() -> None:
    balancer = Balancer()
    assert candidates(ROUTE, balancer, lambda name: True, ()) == [A, B, C, Target("d", "m-d")]
    assert candidates(ROUTE, balancer, lambda name: True, ()) == [B, A, C, Target("d", "m-d")]


def test_upstreams_cooling_down_go_last_as_probes() -> None:
    found = candidates(ROUTE, Balancer(), lambda name: True, {"a": 12.0, "c": 3.0})
    assert found == [B, Target("d", "m-d"), Target("a", "m", probe=True), Target("c", "m", probe=True)]


@pytest.mark.parametrize("speaking", [{"b", "d"}, set()])
def test_upstreams_that_do_not_speak_the_api_are_left_out(speaking: set[str]) -> None:
    found = candidates(ROUTE, Balancer(), lambda name: name in speaking, {"d": 5.0})
    assert found == ([B, Target("d", "m-d", probe=True)] if speaking else [])


def test_a_models_own_fallbacks_come_before_its_upstreams() -> None:
    table = RoutingTable({"east": upstream("gpt-4o", aliases={"fast": "gpt-4o-mini"}, fallbacks=("west",)),
                          "west": upstream(), "openai": upstream(), "spare": upstream()}, None,
                         {"fast": ("openai", "east", "west"), "gpt-4o": ("spare",)})
    fast = table.route("fast")
    assert fast is not None  # the primary one and duplicates are left out; the provider's name goes on
    assert fast.fallbacks == (Target("openai", "gpt-4o-mini"), Target("west", "gpt-4o-mini"))
    gpt = table.route("gpt-4o")
    assert gpt is not None
    assert gpt.fallbacks == (Target("spare", "gpt-4o"), Target("west", "gpt-4o"))
