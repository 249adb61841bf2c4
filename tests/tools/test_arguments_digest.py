"""arguments_digest: one digest per tool and exact arguments, whatever the key order."""

from __future__ import annotations

import hashlib
import json
from datetime import date
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from gateway.tools.approvals import arguments_digest

_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                 max_size=3),
                     max_leaves=8)


def test_the_digest_is_the_sha256_of_the_canonical_text() -> None:
    text = '{"arguments":{"a":1,"b":"é"},"tool":"files__read"}'
    assert arguments_digest("files__read", {"b": "é", "a": 1}) == hashlib.sha256(text.encode()).hexdigest()


@given(st.dictionaries(st.text(max_size=6), _JSON, max_size=5))
def test_key_order_does_not_change_the_digest(arguments: dict[str, Any]) -> None:
    reordered = dict(reversed(list(arguments.items())))
    assert arguments_digest("t", reordered) == arguments_digest("t", arguments)


@given(st.dictionaries(st.text(max_size=6), _JSON, min_size=1, max_size=5), st.text(max_size=6))
def test_changed_arguments_or_tool_change_the_digest(arguments: dict[str, Any], extra: str) -> None:
    changed = {**arguments, "\x00" + extra: json.dumps(arguments, default=str)}
    assert arguments_digest("t", changed) != arguments_digest("t", arguments)
    assert arguments_digest("u", arguments) != arguments_digest("t", arguments)


class _Parsed(BaseModel):
    day: date
    count: int


def test_parsed_values_digest_as_their_json() -> None:
    parsed = {"when": _Parsed(day=date(2026, 1, 2), count=3)}
    plain = {"when": {"day": "2026-01-02", "count": 3}}
    assert arguments_digest("t", parsed) == arguments_digest("t", plain)
