"""The built-ins that check argument values against the operator's lists: `denied_values` (glob
patterns of values a tool's call may not carry) and `url_hosts` (the hosts URLs in arguments
may name).

url_hosts: which arguments are URLs, and which host a URL names.
- An argument is named like a URL when its name (the nearest key: a list's items go by the
  list's name) is `url`, `uri`, `href`, `link`, `endpoint`, `src`, `website` or `homepage` or
  one of them in the plural, or ends in one of them after `_`, `-` or a lower-case letter followed
  by its capital (`base_url`, `webhook-url`, `imageUri`, `callbackURL`, `api_endpoints`).
- Its value names a host when it is absolute (`scheme://host...`), scheme-relative
  (`//host...`), or starts with a host (a name with a dot, `localhost` or an IP literal, then a
  port, a path or the end: `example.com/path`, `localhost:8080`). A path (`/a`, `./a`), a query
  or fragment, a URL whose scheme has no `//` (`mailto:`, `data:`) and plain words name none,
  and pass. The value is read as a browser-grade URL parser reads it: spaces and control
  characters trimmed, tabs and line breaks dropped, backslashes taken for slashes, and any run
  of slashes after the colon of http(s), ws(s) or ftp taken for `//`. A value that names no host
  where one is due (`https://`, `http://:80`) or that does not parse is denied.
- The host (lower-cased, without a trailing dot, IDNA-encoded, an IPv6 literal without its
  brackets) must be listed: an exact name, `.example.com` for example.com and every subdomain,
  or an IP address (exact: 2130706433 is not 127.0.0.1, and neither is listed unless named so).
  The port is not checked. With url_hosts in a chain and no host listed, every URL that names a
  host is denied.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import posixpath
import re
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

from gateway.guardrails.builtin_text import argument_strings, last_name, shown, shown_path
from gateway.guardrails.verdicts import GuardedCall, Guardrail, Verdict, deny

SHOWN_VALUE = 80  # a reason quotes at most this much of a denied value
SHOWN_HOSTS = 10  # and names at most this many of the allowed hosts


def normalised_path(value: str) -> str | None:
    """`value` as the path it names once `.`, `..` and repeated slashes are resolved
    ('/etc/../etc/passwd' is '/etc/passwd'), when that differs from it; None otherwise."""
    if "/." not in value and "//" not in value and "./" not in value:  # nothing to resolve
        return None
    resolved = posixpath.normpath(value)
    if resolved.startswith("//"):  # normpath keeps two leading slashes (POSIX leaves them open); a file system does not
        resolved = "/" + resolved.lstrip("/")
    if value.endswith("/") and resolved != "/":
        resolved += "/"
    return resolved if resolved != value else None


class DeniedValues(Guardrail):
    """Denies a call that carries, anywhere in its arguments, a string value matching one of the
    glob patterns listed for its tool (fnmatch, case-sensitive: `*`, `?`, `[...]`). Values are
    matched as they are and, when they hold `.` or `//` segments, as the path they resolve to."""

    name = "denied_values"
    inline = True

    def __init__(self, denied: Mapping[str, Sequence[str]]) -> None:
        # for each entry: its tools, its patterns, and one regex matching what any of them matches
        self._denied = tuple((_glob(tools), tuple(patterns), _glob(*patterns))
                             for tools, patterns in denied.items() if patterns)

    def before_execute(self, call: GuardedCall) -> Verdict | None:
        entries = [(patterns, any_of) for tools, patterns, any_of in self._denied if tools.match(call.tool)]
        if not entries:
            return None
        for place in argument_strings(call.arguments):
            text = place.text
            resolved = normalised_path(text)
            for patterns, any_of in entries:
                if any_of.match(text) or (resolved is not None and any_of.match(resolved)):
                    pattern = next(pattern for pattern in patterns for candidate in (text, resolved or text)
                                   if fnmatch.fnmatchcase(candidate, pattern))
                    return deny(f"argument '{shown_path(place.path)}' is '{shown(text, SHOWN_VALUE)}', which the "
                                f"denied pattern '{pattern}' of tool '{call.tool}' forbids. Use another value.")
        return None


def _glob(*patterns: str) -> re.Pattern[str]:
    """One regex matching what any of the glob `patterns` matches (fnmatch's translation, which
    does not backtrack without bound)."""
    return re.compile("|".join(f"(?:{fnmatch.translate(pattern)})" for pattern in patterns))


_URL_WORDS = ("url", "uri", "href", "link", "endpoint", "src", "website", "homepage")
_URL_NAME = re.compile(r"(?:^|[_\-])(?:" + "|".join(_URL_WORDS) + r")s?$", re.IGNORECASE)
_URL_NAME_CAMEL = re.compile(r"[a-z0-9](?:" + "|".join(word.capitalize() + "|" + word.upper() for word in _URL_WORDS)
                             + r")s?$")
_ABSOLUTE = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
_OPAQUE = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:(?![0-9])")  # mailto:, data:; not host:port
_SPECIAL_SLASHES = re.compile(r"^(https?|wss?|ftp):/*", re.IGNORECASE)
# a value without a scheme that starts with a name with a dot, localhost or an IP literal
_HOST_FIRST = re.compile(r"^(?:[^\s/?#:@]+@)?(?:[A-Za-z0-9\-_~%]+\.[A-Za-z0-9\-_~%.]*|localhost|\[[0-9A-Fa-f:.]+\])"
                         r"(?::[0-9]*)?(?:[/?#]|$)", re.IGNORECASE)
_HOST_NAME = re.compile(r"^[a-z0-9_\-]+(?:\.[a-z0-9_\-]+)*$")
_CONTROL = "".join(chr(code) for code in range(0x21))
_TABS_AND_BREAKS = str.maketrans("", "", "\t\n\r")


def url_named(name: str | None) -> bool:
    """Whether an argument called `name` holds URLs (the rule in this module's docstring)."""
    return name is not None and bool(_URL_NAME.search(name) or _URL_NAME_CAMEL.search(name))


class BadUrl(ValueError):
    """A URL that names no host where one is due, or that does not parse."""


def url_host(value: str) -> str | None:
    """The host `value` names (normalised as the module's docstring says); None when it names
    none. BadUrl when it cannot be read."""
    text = value.strip(_CONTROL)
    if "\t" in text or "\n" in text or "\r" in text:
        text = text.translate(_TABS_AND_BREAKS)
    if "\\" in text:
        text = text.replace("\\", "/")
    if not text or (text[0] in "/?#." and not text.startswith("//")):
        return None
    special = _SPECIAL_SLASHES.match(text)
    if special is not None and special.end() != len(special.group(1)) + 3:  # not already scheme://
        text = special.group(1) + "://" + text[special.end():]
    if not _ABSOLUTE.match(text) and not text.startswith("//"):
        if _OPAQUE.match(text) or not _HOST_FIRST.match(text):
            return None
        text = "//" + text
    try:
        host = urlsplit(text).hostname
    except ValueError as exc:
        raise BadUrl(str(exc)) from exc
    if not host:
        raise BadUrl("it names no host")
    return normalised_host(host)


def normalised_host(host: str) -> str:
    """`host` lower-cased, without brackets or a trailing dot, IDNA-encoded, an IP address in its
    canonical form. BadUrl when it is none of these."""
    host = host.strip("[]").lower().rstrip(".")
    if ":" in host or host[-1:].isdigit():  # only these can be IP addresses: skip the exception otherwise
        try:
            return str(ipaddress.ip_address(host))
        except ValueError:
            pass
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError as exc:
            raise BadUrl(f"its host is not a valid name ({exc})") from exc
    return host


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _listed_host(entry: str) -> str:
    """An entry of guardrail_allowed_url_hosts, normalised; a ValueError (at start-up) when it is
    not a host name or an IP address."""
    try:
        host = normalised_host(entry.removeprefix("."))
    except BadUrl as exc:
        raise ValueError(f"guardrail_allowed_url_hosts: {entry!r}: {exc}") from exc
    if not _HOST_NAME.match(host) and not _is_ip(host):
        raise ValueError(f"guardrail_allowed_url_hosts: {entry!r} is not a host name or an IP address "
                         "(no scheme, port or path: example.com, .example.com, 10.0.0.1)")
    return host


class UrlHosts(Guardrail):
    """Denies a call whose URL-named arguments name a host that is not allowed."""

    name = "url_hosts"
    inline = True

    def __init__(self, allowed: Sequence[str]) -> None:
        exact: set[str] = set()
        suffixes: list[str] = []
        for entry in allowed:
            host = _listed_host(entry)
            if entry.startswith("."):
                suffixes.append("." + host)
            else:
                exact.add(host)
        self._exact = frozenset(exact)
        self._suffixes = tuple(suffixes)
        self._listed = ", ".join(list(allowed)[:SHOWN_HOSTS]) + (" ..." if len(allowed) > SHOWN_HOSTS else "")

    def allows(self, host: str) -> bool:
        return host in self._exact or host.endswith(self._suffixes) or ("." + host) in self._suffixes

    def before_execute(self, call: GuardedCall) -> Verdict | None:
        for place in argument_strings(call.arguments):
            if not url_named(last_name(place.path)):
                continue
            where = shown_path(place.path)
            try:
                host = url_host(place.text)
            except BadUrl as exc:
                return deny(f"argument '{where}' is not a URL that can be read ({shown(str(exc), SHOWN_VALUE)}). "
                            "Give a full URL such as https://host/path.")
            if host is not None and not self.allows(host):
                allowed = f"only {self._listed}" if self._listed else "none (no host is allowed)"
                return deny(f"argument '{where}' names the host '{shown(host, SHOWN_VALUE)}', which is not allowed; "
                            f"the hosts allowed are {allowed}.")
        return None
