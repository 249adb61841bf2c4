"""The depth check of decoded JSON: the shortcut through the text's brackets answers as the walk does."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from gateway.wire.json_depth import decoded_nests_deeper, nests_deeper

JSON = st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text("[{}]a\"\\", max_size=6),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text("[{x", max_size=3), inner,
                                                                                 max_size=4),
                    max_leaves=30)


@given(JSON, st.integers(2, 8))
def test_the_text_settles_only_what_the_walk_would_say(value: Any, limit: int) -> None:
    raw = orjson.dumps(value)
    assert decoded_nests_deeper(raw, value, limit) == nests_deeper(value, limit)


def test_brackets_in_strings_only_send_it_to_the_walk() -> None:
    shallow = {"text": "[" * 100}
    assert decoded_nests_deeper(orjson.dumps(shallow), shallow, 2) is False
    deep: Any = "x"
    for _ in range(5):
        deep = [deep]
    assert decoded_nests_deeper(orjson.dumps(deep), deep, 4) is True
    assert decoded_nests_deeper(orjson.dumps(deep), deep, 5) is False
