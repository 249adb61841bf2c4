"""Where a sign-in to /ui returns to (gateway.ui.auth): a page of its own, never another site's or a
path with control characters."""

from __future__ import annotations

import pytest

from gateway.ui.auth import page_after_sign_in


@pytest.mark.parametrize(("asked", "goes_to"), [
    ("/ui/trajectories?tool=a", "/ui/trajectories?tool=a"), ("//evil.example/ui", "/ui"),
    ("https://evil.example/ui", "/ui"), ("/v1/models", "/ui"), ("/ui\\..\\x", "/ui"), (None, "/ui")])
def test_sign_in_returns_only_to_a_page_of_its_own(asked: str | None, goes_to: str) -> None:
    assert page_after_sign_in(asked) == goes_to


@pytest.mark.parametrize("asked", ["/ui\r\nSet-Cookie: x=1", "/ui\n", "/ui\x00", "/ui\t", "/ui x", "/ui\x7f",
                                   "/ui\u2028", "/ui\u00a0"])
def test_sign_in_never_returns_to_a_path_with_control_characters_or_spaces(asked: str) -> None:
    assert page_after_sign_in(asked) == "/ui"
