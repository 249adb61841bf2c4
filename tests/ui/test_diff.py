"""What a corrected retry changed (gateway.ui.diff): key by key for JSON objects, line by line
otherwise."""

from __future__ import annotations

import html
import json

import pytest

from gateway.ui.diff import arguments_diff, key_changes


@pytest.mark.parametrize(("failed", "corrected", "changes"), [
    ('{"city": "Lisbon"}', '{"location": "Lisbon"}', [("-", 'city: "Lisbon"'), ("+", 'location: "Lisbon"')]),
    ('{"celsius": "9", "unit": "c"}', '{"celsius": 9, "unit": "c"}', [("~", 'celsius: "9" → 9')]),
])
def test_a_retry_diff_names_keys_removed_added_and_changed(failed: str, corrected: str,
                                                           changes: list[tuple[str, str]]) -> None:
    assert key_changes(json.loads(failed), json.loads(corrected)) == changes
    shown = arguments_diff(failed, corrected)
    assert shown.count("<li ") == len(changes)
    assert html.escape(changes[0][1], quote=True) in shown


def test_arguments_that_are_not_json_are_compared_line_by_line() -> None:
    shown = arguments_diff('{"city": "<b>Lisbon"', '{"city": "<b>Lisbon"}')
    assert '<li class="removed"><code>- {&quot;city&quot;: &quot;&lt;b&gt;Lisbon&quot;</code></li>' in shown
    assert '<li class="added"><code>+ {&quot;city&quot;: &quot;&lt;b&gt;Lisbon&quot;}</code></li>' in shown


def test_a_retry_that_changed_nothing_says_so() -> None:
    assert "the same arguments" in arguments_diff('{"a": 1}', '{ "a" : 1 }')
