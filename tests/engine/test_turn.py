"""A turn (gateway.engine.turn): the usage of a request, summed over its rounds. Reading each API's
answers as turns is its adapter's: tests/apis/*/test_answer.py."""

from __future__ import annotations

from gateway.apis.responses.answer import read_response
from gateway.engine.turn import summed_usage


def test_usage_sums_over_rounds_nested_details_included() -> None:
    turns = [read_response({"output": [], "usage": {"input_tokens": 3, "input_tokens_details": {"cached_tokens": 1}}}),
             read_response({"output": []}),
             read_response({"output": [], "usage": {"input_tokens": 4, "input_tokens_details": {"cached_tokens": 2},
                                                    "flag": True}})]
    assert summed_usage(turns) == {"input_tokens": 7, "input_tokens_details": {"cached_tokens": 3}}
    assert summed_usage(turns[1:2]) is None


def test_one_rounds_usage_is_the_providers_own() -> None:
    usage = {"input_tokens": 3, "output_tokens_details": {"reasoning_tokens": None}, "service_tier": "default",
             "cache_creation": None}
    [turn] = [read_response({"output": [], "usage": usage})]
    assert summed_usage([turn]) == usage
