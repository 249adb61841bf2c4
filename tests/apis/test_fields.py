"""The request models' `tools`: the quick check in plain Python never passes what pydantic's models
refuse, and passes every list of objects they take (so the models are not the common path)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from gateway.apis.chat import request as chat
from gateway.apis.fields import validate
from gateway.apis.messages import request as messages
from gateway.apis.responses import request as responses

NAMES = st.one_of(st.none(), st.just(""), st.text(max_size=3), st.integers(), st.booleans(), st.lists(st.none()))
FIELD = st.one_of(NAMES, st.dictionaries(st.sampled_from(["name", "x"]), NAMES, max_size=2))
SPEC = st.one_of(st.integers(), st.text(max_size=2), st.none(), st.dictionaries(
    st.sampled_from(["type", "function", "name", "parameters", "input_schema"]), FIELD, max_size=4))
SPECS = st.one_of(st.lists(SPEC, max_size=3), SPEC)


@pytest.mark.parametrize("api", [chat, responses, messages], ids=["chat", "responses", "messages"])
@given(value=SPECS)
def test_what_the_quick_check_passes_the_models_take(api: ModuleType, value: Any) -> None:
    detailed = TypeAdapter(list[api._ToolSpec])
    try:
        detailed.validate_python(value)
        accepted = True
    except ValidationError:
        accepted = False
    assert not api.tool_specs_pass(value) or accepted
    if isinstance(value, list) and all(type(spec) is dict for spec in value):
        assert api.tool_specs_pass(value) == accepted


def test_a_refused_tool_is_named_by_the_models_words() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": ""}}]}
    with pytest.raises(Exception, match=r"tools\.0\.function\.name: String should have at least 1 character"):
        validate(chat.ChatRequest, body, "a chat completion request")
