"""Properties of `secrets`: a generated credential of any kind, set in arbitrary text (apart from
it by a separator, as a credential in real text is), never survives the mask of a result, and
never appears in the reason of a call denied for carrying it, wherever in the arguments it is."""

from __future__ import annotations

import json
import string
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.guardrails import GuardedCall
from gateway.guardrails.builtin_secrets import MASK, PLACEHOLDERS, Secrets

ALNUM = string.ascii_letters + string.digits
UPPER_DIGITS = string.ascii_uppercase + string.digits
URLSAFE = ALNUM + "_-"
B64 = ALNUM + "+/"
# Characters a credential in real text sits between: none is part of any credential's own alphabet.
SEPARATORS = st.sampled_from([" ", "\n", "\t", '"', "'", ",", ";", "(", ")", "<", ">", "[", "]", "{", "}", "|"])


def run(alphabet: str, low: int, high: int) -> st.SearchStrategy[str]:
    return st.text(alphabet, min_size=low, max_size=high)


@st.composite
def random_looking(draw: st.DrawFn, alphabet: str, low: int, high: int) -> str:
    """A run that looks random, as issued keys do: mixed case and three digits at drawn places."""
    body = list(draw(run(alphabet, low, high)))
    for char in ("a", "Z", "3", "7", "9"):
        body.insert(draw(st.integers(0, len(body))), char)
    return "".join(body)


def value(alphabet: str) -> st.SearchStrategy[str]:
    """A password as someone may choose it: not a placeholder, not a template."""
    return run(alphabet, 4, 40).filter(lambda text: text.lower() not in PLACEHOLDERS and text[0] not in "$<%{"
                                       and bool(text.strip("*x.#-_ ")))


# (the text that carries the credential, the credential) for each kind
def kinds() -> st.SearchStrategy[tuple[str, str]]:
    def same(secret: st.SearchStrategy[str]) -> st.SearchStrategy[tuple[str, str]]:
        return secret.map(lambda text: (text, text))

    pem_body = st.lists(run(B64, 16, 64), min_size=1, max_size=4).map("\n".join)
    password = value(ALNUM + "!#%*+-./?@^_~")
    return st.one_of(
        same(st.tuples(st.sampled_from(["AKIA", "ASIA"]), run(UPPER_DIGITS, 16, 16)).map("".join)),
        same(st.tuples(st.sampled_from(["ghp_", "gho_", "ghu_", "ghs_", "ghr_"]), run(ALNUM, 36, 36)).map("".join)),
        same(run(ALNUM + "_", 22, 82).map("github_pat_".__add__)),
        same(run(URLSAFE, 20, 20).map("glpat-".__add__)),
        same(st.tuples(st.sampled_from(["xoxb-", "xoxp-", "xoxa-"]), run(ALNUM + "-", 10, 60)).map("".join)),
        same(st.tuples(st.sampled_from(["sk_live_", "rk_live_", "sk_test_"]), run(ALNUM, 24, 99)).map("".join)),
        same(run(URLSAFE, 35, 35).map("AIza".__add__)),
        same(st.tuples(st.sampled_from(["sk-", "sk-proj-", "sk-svcacct-"]), random_looking(URLSAFE, 20, 120))
             .map("".join)),
        same(run(URLSAFE, 20, 95).map("sk-ant-api03-".__add__)),
        same(st.tuples(run(URLSAFE, 8, 60), run(URLSAFE, 2, 80), run(URLSAFE, 0, 60))
             .map(lambda parts: f"eyJ{parts[0]}.ey{parts[1]}.{parts[2]}")),
        same(st.tuples(st.sampled_from(["RSA ", "EC ", "OPENSSH ", ""]), pem_body).map(
            lambda parts: f"-----BEGIN {parts[0]}PRIVATE KEY-----\n{parts[1]}\n-----END {parts[0]}PRIVATE KEY-----")),
        st.tuples(st.sampled_from(["password", "DB_PASSWORD", "api_key", "client_secret", "access_token"]),
                  st.sampled_from(['="{}"', "='{}'", '": "{}"', " = '{}'"]), password)
        .map(lambda parts: (parts[0] + parts[1].format(parts[2]), parts[2])),
        st.tuples(run(ALNUM, 1, 12), value(ALNUM + "!$%*+-._~"))
        .map(lambda parts: (f"https://{parts[0]}:{parts[1]}@git.example.com/r", parts[1])),
        random_looking(ALNUM + "._~-", 16, 60).map(lambda token: (f"Authorization: Bearer {token}", token)),
    )


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(before=st.text(max_size=80), carrier=kinds(), after=st.text(max_size=80), left=SEPARATORS, right=SEPARATORS)
def test_a_masked_result_never_holds_the_credential(before: str, carrier: tuple[str, str], after: str,
                                                      left: str, right: str) -> None:
    text, secret = carrier
    result = before + left + text + right + after
    verdict = Secrets().after_execute(GuardedCall("t", "c", {}), result)
    assert verdict is not None
    assert verdict.decision == "mask"
    assert verdict.result is not None
    assert secret not in verdict.result
    assert MASK in verdict.result
    assert secret in verdict.hidden
    assert secret not in (verdict.reason or "")


arguments_shapes = st.recursive(st.just("SLOT"), lambda inner: st.one_of(
    st.lists(inner, min_size=1, max_size=3), st.dictionaries(st.text(max_size=10), inner, min_size=1, max_size=3)),
    max_leaves=4)


def place(shape: Any, text: str) -> Any:
    """`shape` with its first SLOT holding `text` and the others some ordinary text."""
    placed = [False]

    def fill(node: Any) -> Any:
        if isinstance(node, list):
            return [fill(item) for item in node]
        if isinstance(node, dict):
            return {key: fill(item) for key, item in node.items()}
        if placed[0]:
            return "ordinary text"
        placed[0] = True
        return text
    return fill(shape)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.text(max_size=20), shape=arguments_shapes, carrier=kinds(), before=st.text(max_size=40),
       left=SEPARATORS, as_name=st.booleans())
def test_a_denied_calls_reason_never_holds_the_credential(name: str, shape: Any, carrier: tuple[str, str],
                                                          before: str, left: str, as_name: bool) -> None:
    text, secret = carrier
    carried = before + left + text
    arguments = {carried: "value"} if as_name else {name: place(shape, carried)}
    verdict = Secrets().before_execute(GuardedCall("t", "c", arguments))
    assert verdict is not None
    assert verdict.decision == "deny"
    assert verdict.reason is not None
    assert secret not in verdict.reason
    assert secret in verdict.hidden
    assert json.dumps(secret)[1:-1] in verdict.hidden  # as a recorder writing JSON would write it
