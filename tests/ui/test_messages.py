"""A model turn's messages on the page (gateway.ui.messages): what the turn added, and the capture
setting the page names."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.settings.model import Settings
from gateway.ui.messages import CAPTURE_SETTING, CAPTURE_VARIABLE, added_messages


def test_the_capture_setting_the_page_names_turns_capture_on(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings(**{CAPTURE_SETTING: True}).capture_message_content
    monkeypatch.setenv(CAPTURE_VARIABLE, "true")
    assert Settings().capture_message_content


@pytest.mark.parametrize(("sent", "before", "added"), [
    ([{"role": "user", "content": "q"}], None, None),  # the first turn: nothing before it
    ([1, 2, {"role": "assistant"}, 3], [1, 2], [3]),  # the previous answer comes back first
    ([1, {"role": "assistant", "n": 9}, 4], [1, 2, 3], [4]),  # the client's own history, without the tool rounds
    ([2, 3, {"role": "assistant"}, 4], [1, 2, 3], [4]),  # capture left out the oldest message
    ([7, 8], [1, 2], None),  # another conversation
])
def test_a_turn_shows_the_messages_it_added(sent: list[Any], before: list[Any] | None,
                                            added: list[Any] | None) -> None:
    assert added_messages(sent, before) == added
