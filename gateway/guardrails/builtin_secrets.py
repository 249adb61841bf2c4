"""The `secrets` built-in: credentials in a call's arguments deny the call; credentials in a
result are masked before the model reads it.

Why patterns of our own rather than `detect-secrets` (Yelp), the library for the job: measured
against this use (docs/benchmarks.md, "Guardrails"), it did not fit.
- Its scanning API reads and changes a process-wide settings object on every call (`scan_line`
  disables a filter and clears cached plugins), which is neither safe beside the guardrails'
  threads nor free of module-level state.
- The value it reports is often not the credential, so it cannot mask: the prefix alone of a
  GitHub or GitLab token, the header line of a private key, a JWT without its signature.
- It knows none of GitHub's fine-grained tokens, Google API keys, OpenAI's project keys,
  Anthropic's keys or bearer tokens.
- Its entropy plugins flag ordinary words, git SHAs and base64 images; without them, its scan of a
  text is still far too slow for the event loop (some hundred times these patterns').
- Its last release is two years old, and it brings `requests` and a plugin that may verify a
  secret over the network.

What is detected (each pattern starts with a literal prefix or keyword, so a scan is a fast
search for it, then reads one bounded, possessive run of characters: a scan is linear in the text):
- AWS access key ids (AKIA..., ASIA...), and AWS secret access keys: a 40-character key of
  mixed case within a few hundred characters of an access key id (one assigned to
  `aws_secret_access_key` is an assignment, below);
- GitHub tokens (ghp_, gho_, ghu_, ghs_, ghr_, github_pat_), GitLab personal tokens (glpat-),
  Slack tokens (xoxb-, xoxp-, ...), Stripe secret and restricted keys (sk_live_, rk_live_, and
  their _test_ kin), Google API keys (AIza...), Anthropic keys (sk-ant-), OpenAI keys (sk-,
  sk-proj-, ...: mixed case and digits, so `sk-learn-...` is none);
- private keys in PEM blocks (BEGIN ... PRIVATE KEY through its END, or to the end of the text
  when it is cut);
- JSON web tokens (eyJ... . eyJ... . signature);
- values of 4 characters or more assigned to a secret-named key: `password=...`,
  `"api_key": "..."`, `DB_PASSWORD=...`, `client_secret: ...`, `x-auth-token: ...` (with `:` and
  no quotes the value needs a digit or a symbol, so prose such as "your password: click the link"
  is none; unquoted, it ends at a space, quote, `,;&<>=:`); placeholders (`null`, `${VAR}`,
  `***`) are none;
- `Authorization:` header values, and `Bearer <token>` anywhere (a token with a digit);
- the password (4 characters or more) in a URL's `user:password@`.
A credential is found only where it starts at a token boundary: `xghp_...` is none.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from itertools import chain
from typing import Any

from gateway.guardrails.builtin_text import Path, argument_strings, lowered, shown_path
from gateway.guardrails.verdicts import GuardedCall, Guardrail, Verdict, deny, mask

MASK = "[REDACTED]"
AWS_NEIGHBOURHOOD = 320  # how far from an access key id its secret key is looked for, each side
SHOWN_PLACES = 3  # a denial names at most this many arguments
MIN_VALUE = 4  # shorter values are not taken for secrets (a hidden value is replaced wherever it is)
PLACEHOLDERS = frozenset({"null", "none", "nil", "true", "false", "undefined", "string", "password", "secret",
                          "token", "redacted", "changeme", "example", "xxxx", "****"})
MAX_FOUND = 256  # credentials told apart in one text (see credentials())
EVERYWHERE_VALUES = 16  # at most this many values found are replaced wherever else they are
SECRET_KEY_WORDS = ("api", "access", "private", "secret", "signing", "encryption", "master", "account")


@dataclass(frozen=True)
class Credential:
    """A credential found in a text: its kind ("a GitHub token"), the span to mask, its value."""

    kind: str
    start: int
    end: int
    value: str


Classify = Callable[[re.Match[str], str], str | None]


@dataclass(frozen=True)
class Pattern:
    """One kind of credential: `regex` (made by _token) finds it, read in the text with A-Z
    lowered when `lowered`; `classify`, when set, names its kind from the match and the text (or
    None: not a credential), else it is `kind`. The first of `groups` that took part is the
    credential, the whole match when none did."""

    kind: str
    regex: re.Pattern[str]
    groups: tuple[int | str, ...] = (0,)
    lowered: bool = False
    classify: Classify | None = None


def _token(literal: str, rest: str, boundary: str = "A-Za-z0-9") -> re.Pattern[str]:
    """The regex of a credential that starts with `literal`, where the character before it is
    none of the class `boundary`. The regex starts with the literal, so that a scan is a fast
    search for it, and checks the character before only then; its runs of characters are
    possessive (they never give back), so a failed attempt costs at most one run."""
    guard = f"(?<![{boundary}]{re.escape(literal)})" if boundary else ""
    return re.compile(re.escape(literal) + guard + rest)


def _mixed(value: str) -> bool:
    return value.lower() != value and value.upper() != value


def _digits(value: str) -> int:
    return sum(map(value.count, "0123456789"))


def _sk(match: re.Match[str], text: str) -> str | None:
    """sk_live_ is Stripe's, sk-ant- Anthropic's; any other sk- is OpenAI's when it looks random
    (mixed case, digits), so that `sk-learn-estimators-2024` is none."""
    value = text[match.start():match.end()]
    if value.startswith("sk_"):
        return "a Stripe key"
    if value.startswith("sk-ant-"):
        return "an Anthropic key"
    return "an OpenAI key" if _mixed(value) and _digits(value) >= 3 else None


def _bearer(match: re.Match[str], text: str) -> str | None:
    return "a bearer token" if _digits(match.group(1)) else None


def _assigned(match: re.Match[str], text: str) -> str | None:
    """A value assigned to a secret-named key, unless it is a placeholder, a template or (after a
    colon, unquoted, letters only) a word of prose."""
    value = next(found for found in match.group("dq", "sq", "bare") if found is not None)
    if (value in PLACEHOLDERS or MASK.lower() in value or value[0] in "$<%" or value.startswith("{{")
            or not value.strip("*x.#-_ ")):
        return None
    if match.group("bare") is not None and ":" in match.group("sep") and value.isalpha():
        return None
    return "an assigned password or key (password=..., api_key=...)"


def _key_assigned(match: re.Match[str], text: str) -> str | None:
    """`key` counts only as api_key, access-key, privateKey ... (`key` alone names anything)."""
    before = text[max(0, match.start() - 12):match.start()].lower().rstrip("_-")
    if not before.endswith(SECRET_KEY_WORDS):
        return None
    return _assigned(match, text)


def _url_password(match: re.Match[str], text: str) -> str | None:
    value = match.group(1)
    return None if value.lower() in PLACEHOLDERS or MASK in value else "a password in a URL"


_ASSIGNED = (r"[\"']?\s{0,4}(?P<sep>=>|[:=])\s{0,4}(?:\"(?P<dq>[^\"\r\n]{4,512}+)\"|'(?P<sq>[^'\r\n]{4,512}+)'"
             r"|(?P<bare>[^\s\"'`,;&<>=:]{4,512}+=*))")
_VALUE_GROUPS = ("dq", "sq", "bare")


def _assignment(literal: str, rest: str = "", classify: Classify = _assigned, boundary: str = "a-z0-9") -> Pattern:
    return Pattern("", _token(literal, rest + _ASSIGNED, boundary), _VALUE_GROUPS, True, classify)


PATTERNS: tuple[Pattern, ...] = (
    Pattern("an AWS access key id", _token("A", r"(?:KI|SI)A[A-Z0-9]{16}(?![A-Z0-9])")),
    Pattern("a GitHub token", _token("gh", r"[pousr]_[A-Za-z0-9]{30,251}+", "A-Za-z0-9_")),
    Pattern("a GitHub token", _token("github_pat_", r"[A-Za-z0-9_]{22,244}+", "A-Za-z0-9_")),
    Pattern("a GitLab token", _token("glpat-", r"[A-Za-z0-9_\-]{20,249}+", r"A-Za-z0-9_\-")),
    Pattern("a Slack token", _token("xox", r"[abceoprs]-[A-Za-z0-9\-]{10,251}+", r"A-Za-z0-9\-")),
    Pattern("a Stripe key", _token("rk_", r"(?:live|test)_[A-Za-z0-9]{16,247}+", "A-Za-z0-9_")),
    Pattern("", _token("sk", r"(?:_(?:live|test)_[A-Za-z0-9]{16,247}+|-[A-Za-z0-9_\-]{20,252}+)", r"A-Za-z0-9_\-"),
            classify=_sk),
    Pattern("a Google API key", _token("AIza", r"[A-Za-z0-9_\-]{33,40}+(?![A-Za-z0-9_\-])", r"A-Za-z0-9_\-")),
    Pattern("a JSON web token", _token(
        "eyJ", r"[A-Za-z0-9_\-]{8,4096}+\.ey[A-Za-z0-9_\-]{2,16384}+\.[A-Za-z0-9_\-]{0,4096}+", r"A-Za-z0-9_\-")),
    Pattern("", _token("://", r"[^\s/:@?#]{0,256}+:([^\s/@?#]{4,256}+)@", ""), (1,), classify=_url_password),
    _assignment("pass", "(?:word|wd|phrase)"),
    _assignment("pwd"),
    _assignment("secret"),
    _assignment("token"),
    _assignment("key", classify=_key_assigned, boundary=""),  # the words before it decide (apikey, api_key)
    Pattern("an Authorization header", _token(
        "authorization", r"[\"']?\s{0,4}[:=]\s{0,4}[\"']?(?:(?:bearer|basic|token|bot)\s{1,4})?"
        r"([a-z0-9._~+/\-]{8,4096}+=*)", "a-z0-9"), (1,), lowered=True),
    Pattern("", _token("bearer", r"\s{1,4}([a-z0-9._~+/\-]{16,4096}+=*)", "a-z0-9"), (1,), lowered=True,
            classify=_bearer),
)
_PEM_BEGIN = re.compile(r"-----BEGIN[A-Z0-9 ]{0,40} PRIVATE KEY(?: BLOCK)?-----")
_PEM_END = re.compile(r"-----END[A-Z0-9 ]{0,40} PRIVATE KEY(?: BLOCK)?-----")
_AWS_SECRET = re.compile(r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")


def _matches(text: str) -> Iterator[Credential]:
    """What PATTERNS find, overlapping matches included (a value quoted after `password="` is
    looked at even when a longer match swallowed its start)."""
    lower: str | None = None
    for pattern in PATTERNS:
        haystack = text
        if pattern.lowered:
            lower = haystack = lowered(text) if lower is None else lower
        position = 0
        while (match := pattern.regex.search(haystack, position)) is not None:
            position = match.start() + 1
            kind = pattern.kind if pattern.classify is None else pattern.classify(match, text)
            if kind:
                group = next((group for group in pattern.groups if match.group(group) is not None), 0)
                start, end = match.span(group)
                yield Credential(kind, start, end, text[start:end])


def _private_keys(text: str) -> Iterator[Credential]:
    position = 0
    while (begin := _PEM_BEGIN.search(text, position)) is not None:
        end = _PEM_END.search(text, begin.end())
        stop = end.end() if end is not None else len(text)  # a key cut short is a key still
        yield Credential("a private key", begin.start(), stop, text[begin.start():stop])
        position = stop


def _aws_secrets_near(text: str, key_ids: list[Credential]) -> Iterator[Credential]:
    """40-character keys of mixed case near an access key id; the stretches around the ids are
    merged first, so that each character is read once however many ids there are."""
    stretches: list[tuple[int, int]] = []
    for key_id in key_ids:
        start, end = max(0, key_id.start - AWS_NEIGHBOURHOOD), key_id.end + AWS_NEIGHBOURHOOD
        if stretches and start <= stretches[-1][1]:
            stretches[-1] = (stretches[-1][0], end)
        else:
            stretches.append((start, end))
    for start, end in stretches:
        for match in _AWS_SECRET.finditer(text, start, end):
            if _mixed(match.group(0)):
                yield Credential("an AWS secret access key", match.start(), match.end(), match.group(0))


def credentials(text: str) -> list[Credential]:
    """Every credential in `text`, by where it starts (spans may overlap). A text with more than
    MAX_FOUND is one credential from the first of them to its end: telling that many apart would
    cost more than a built-in may spend, and a text that dense with them is of no use to a model."""
    found: list[Credential] = []
    for item in chain(_matches(text), _private_keys(text)):
        found.append(item)
        if len(found) > MAX_FOUND:
            start = min(item.start for item in found)
            return [Credential(f"more than {MAX_FOUND} credentials", start, len(text), text[start:])]
    key_ids = [item for item in found if item.kind == "an AWS access key id"]
    found += _aws_secrets_near(text, key_ids)
    return sorted(found, key=lambda item: (item.start, -item.end))


def masked(text: str, found: list[Credential]) -> str:
    """`text` with every span of `found` (sorted by start) replaced by MASK, and then every other
    occurrence of the first EVERYWHERE_VALUES values found: a password assigned once may be
    quoted again further on."""
    pieces: list[str] = []
    position = 0
    for item in found:
        if item.end <= position:  # inside a span already masked
            continue
        if item.start >= position:
            pieces += (text[position:item.start], MASK)
        position = item.end
    pieces.append(text[position:])
    result = "".join(pieces)
    values = list(dict.fromkeys(item.value for item in found if len(item.value) >= MIN_VALUE))
    for value in sorted(values[:EVERYWHERE_VALUES], key=len, reverse=True):
        if value in result:
            result = result.replace(value, MASK)
    return result


def hidden_values(found: list[Credential]) -> tuple[str, ...]:
    """What a verdict hides: each value, and its JSON-escaped form where that differs (a private
    key's line breaks), so that a recorder writing the arguments as JSON finds it too."""
    values: dict[str, None] = {}
    for item in found:
        values[item.value] = None
        escaped = json.dumps(item.value, ensure_ascii=False)[1:-1]
        if escaped != item.value:
            values[escaped] = None
    return tuple(values)


def kinds(found: list[Credential]) -> str:
    """The kinds of `found`, each once, as a phrase: "a GitHub token and a JSON web token"."""
    names = list(dict.fromkeys(item.kind for item in found))
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _findings(arguments: Mapping[str, Any]) -> list[tuple[Path, bool, list[Credential]]]:
    """(where, is a name, what) for each string of the arguments that holds a credential. The
    strings are scanned together first, one to a line: a line break is part of no credential and
    bounds one as a string's start or end does, so whatever one string holds, the joined text
    holds too, and a call's many short strings cost one scan. Only when it finds something is each
    string scanned alone (what the joined text finds across two strings is in neither)."""
    places = list(argument_strings(arguments, keys=True))
    if not places or not credentials("\n".join(place.text for place in places)):
        return []
    return [(place.path, place.is_key, found) for place in places if (found := credentials(place.text))]


class Secrets(Guardrail):
    """Denies a call whose arguments (any string, names included) hold a credential; masks the
    credentials in a result."""

    name = "secrets"
    inline = True

    def before_execute(self, call: GuardedCall) -> Verdict | None:
        findings = _findings(call.arguments)
        if not findings:
            return None
        hidden = hidden_values([item for _, _, found in findings for item in found])
        places = [f"{'the name of ' if is_key else ''}argument '{shown_path(path, hidden)}' holds {kinds(found)}"
                  for path, is_key, found in findings[:SHOWN_PLACES]]
        more = " (and more)" if len(findings) > SHOWN_PLACES else ""
        reason = (f"{'; '.join(places)}{more}: credentials may not be passed to tools. Call again without the "
                  "credential; a tool that needs one is given its own.")
        for value in hidden:  # a name is never quoted when it holds one; this is the last word on it
            reason = reason.replace(value, MASK)
        return deny(reason, hidden=hidden)

    def after_execute(self, call: GuardedCall, result: str) -> Verdict | None:
        found = credentials(result)
        if not found:
            return None
        return mask(masked(result, found), f"credentials masked ({kinds(found)})", hidden=hidden_values(found))
