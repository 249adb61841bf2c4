"""The `url_hosts` built-in: arguments named like URLs may name only the allowed hosts (exact
names, '.example.com' for it and its subdomains, IP literals exactly); a URL read as a browser
reads it, so that backslashes, userinfo and odd slashes do not slip another host past; an
unreadable URL is denied, and so is every host when none is allowed."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.guardrails import GuardedCall
from gateway.guardrails.builtin_values import UrlHosts, url_host, url_named

ALLOWED = ["api.example.com", ".docs.example.org", "10.0.0.7", "::1"]


def check(arguments: dict[str, Any], allowed: list[str] | None = None) -> str | None:
    verdict = UrlHosts(ALLOWED if allowed is None else allowed).before_execute(GuardedCall("fetch", "c", arguments))
    if verdict is None:
        return None
    assert verdict.decision == "deny"
    assert verdict.reason is not None
    return verdict.reason


@pytest.mark.parametrize("name", ["url", "URL", "uri", "href", "link", "endpoint", "src", "urls", "links",
                                  "base_url", "webhook-url", "image_uri", "api_endpoints", "imageUri", "callbackURL",
                                  "baseUrl", "homepage", "website"])
def test_names_like_urls(name: str) -> None:
    assert url_named(name)


@pytest.mark.parametrize("name", ["curl", "query", "path", "hyperlinks", "urlencode", "description", "blink", None])
def test_names_not_like_urls(name: str | None) -> None:
    assert not url_named(name)


@pytest.mark.parametrize("arguments", [
    {"url": "https://api.example.com/v1/items?q=1"},
    {"url": "HTTPS://API.EXAMPLE.COM./v1"},
    {"url": "https://docs.example.org/guide"},
    {"url": "https://a.b.docs.example.org/guide"},
    {"url": "http://10.0.0.7:8080/health"},
    {"url": "http://[::1]:8080/"},
    {"url": "api.example.com/v1"},
    {"links": ["https://api.example.com/a", "https://docs.example.org/b"]},
    {"request": {"baseUrl": "https://api.example.com"}},
    {"url": "/relative/path"},
    {"url": "./here"},
    {"url": "?page=2"},
    {"link": "mailto:ada@example.net"},
    {"link": "click here"},
    {"query": "https://evil.example.net/ is not in a URL argument"},
    {"url": ""},
])
def test_allowed_hosts_and_values_without_a_host_pass(arguments: dict[str, Any]) -> None:
    assert check(arguments) is None


@pytest.mark.parametrize(("arguments", "where", "host"), [
    ({"url": "https://evil.example.net/x"}, "url", "evil.example.net"),
    ({"url": "https://api.example.com.evil.net/"}, "url", "api.example.com.evil.net"),
    ({"url": "https://api.example.com@evil.net/"}, "url", "evil.net"),
    ({"url": "https://evil.net\\@api.example.com/"}, "url", "evil.net"),
    ({"url": "https:\\\\evil.net\\x"}, "url", "evil.net"),
    ({"url": "https:/evil.net/x"}, "url", "evil.net"),
    ({"url": "https:evil.net/x"}, "url", "evil.net"),
    ({"url": "https:///evil.net/x"}, "url", "evil.net"),
    ({"url": "  \thttps://ev\nil.net/"}, "url", "evil.net"),
    ({"url": "//evil.net/x"}, "url", "evil.net"),
    ({"url": "evil.net/x"}, "url", "evil.net"),
    ({"url": "localhost:8080"}, "url", "localhost"),
    ({"url": "http://2130706433/"}, "url", "2130706433"),
    ({"url": "http://127.0.0.1/"}, "url", "127.0.0.1"),
    ({"url": "http://[::2]/"}, "url", "::2"),
    ({"url": "https://example.org/"}, "url", "example.org"),  # .docs.example.org is not example.org's parent
    ({"url": "https://xn--80ak6aa92e.com/"}, "url", "xn--80ak6aa92e.com"),
    ({"url": "https://\u0430\u0440\u0440\u04cf\u0435.com/"}, "url", "xn--80ak6aa92e.com"),
    ({"pages": [{"href": "https://api.example.com"}, {"href": "ftp://files.evil.net"}]}, "pages[1].href",
     "files.evil.net"),
])
def test_other_hosts_are_denied_naming_the_argument_the_host_and_the_allowed(arguments: dict[str, Any], where: str,
                                                                             host: str) -> None:
    reason = check(arguments)
    assert reason is not None
    assert f"argument '{where}' names the host '{host}'" in reason
    assert "api.example.com, .docs.example.org" in reason


@pytest.mark.parametrize("value", ["https://", "http://:80/", "http://[::1/", "http://[zz]/"])
def test_a_url_that_cannot_be_read_is_denied(value: str) -> None:
    reason = check({"url": value})
    assert reason is not None
    assert "is not a URL that can be read" in reason


def test_with_no_host_allowed_every_url_host_is_denied() -> None:
    reason = check({"url": "https://api.example.com/"}, allowed=[])
    assert reason is not None
    assert "none (no host is allowed)" in reason
    assert check({"url": "/relative"}, allowed=[]) is None


@pytest.mark.parametrize("entry", ["https://example.com", "example.com:443", "example.com/path", "ex ample.com", ""])
def test_an_allowed_entry_that_is_no_host_fails_at_start_up(entry: str) -> None:
    with pytest.raises(ValueError, match="guardrail_allowed_url_hosts"):
        UrlHosts([entry])


def test_url_host_reads_as_a_browser_would() -> None:
    assert url_host("HTTP://User:pw@Example.COM.:8443/p") == "example.com"
    assert url_host("wss:\\\\chat.example.com") == "chat.example.com"
    assert url_host("data:text/plain,hi") is None
