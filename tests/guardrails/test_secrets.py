"""The `secrets` built-in: each kind of credential found and masked in a result, a call carrying
one denied without the reason quoting it, and ordinary text (git SHAs, UUIDs, base64 images,
prose about passwords) left alone."""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from typing import Any

import pytest

from gateway.guardrails import GuardedCall
from gateway.guardrails.builtin_secrets import MASK, Secrets, credentials

# Made-up credentials of each kind, in the shape each issuer gives them.
AWS_KEY_ID = "AKIAZ7Q2X4MPLE3KT9RW"
AWS_SECRET = "kq8Rm2Zx/Tv4Lp9Nw+Hc7Ys3Bd6Fg1Jh5Ue0Wa2X"
GITHUB = "ghp_" + "R8vK2mQ9xZ4tL7wN1pC5sD3fG6hJ0kB2aE4y"
GITHUB_PAT = "github_pat_11AB2CD3E0" + "x9Yz8Wv7Ut6Sr5Qp4On3Ml2Kj1Ih0Gf9Ed8Cb7Aa6Zz5Yy4Xx3Ww2Vv1Uu0Tt9Ss8Rr7"
GITLAB = "glpat-" + "Xy7Kp2Rm9Qw4Zt1Lv8Nc"
SLACK = "xoxb-" + "2741958306-5829301746285-Q7mX2kR9vL4pZ8wN1cT6yB3f"
STRIPE = "sk_live_" + "51Hq7ZpK2mX9vR4tL8wN1cQ6yB3fJ0dG"
STRIPE_RESTRICTED = "rk_live_" + "51Hq7ZpK2mX9vR4tL8wN1cQ6yB3fJ0dG"
GOOGLE = "AIza" + "SyD4k9Xq2Rm7Zt1Lv8Nc3Wp6Yb0Hf5Ju2Ke"
OPENAI = "sk-proj-" + "Q7mX2kR9vL4pZ8wN1cT6yB3fJ0dG5hS2aE7uK9rM4xW1qZ6tL3vN8pC0bY5"
OPENAI_LEGACY = "sk-" + "Z4q8R2mX7vK1pL9wN3cT6yB0fJ5dG2hS8aE4uK7r"
ANTHROPIC = "sk-ant-api03-" + "Q7mX2kR9vL4pZ8wN1cT6yB3fJ0dG5hS2aE7uK9rM4xW1qZ6tL3vN8pC0bY5-Ab1CdAA"
JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJ1c2VyLTQyIiwiaWF0IjoxNzAwMDAwMDAwfQ."
       "Xq7Lp2Rm9Zt4Kw1Nv8Bc3Yd6Hf0Ju5Ge2Sa7Ti9Ox")
PRIVATE_KEY = ("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAq7Lp2Rm9Zt4Kw1Nv8Bc3Yd6Hf0Ju5Ge2Sa7Ti9Ox\n"
               "Rm9Zt4Kw1Nv8Bc3Yd6Hf0Ju5Ge2Sa7Ti9OxQ7mX2kR9vL4pZ8wN1cT6yB3f\n-----END RSA PRIVATE KEY-----")


def call(arguments: dict[str, Any], tool: str = "fetch") -> GuardedCall:
    return GuardedCall(tool, "call_1", arguments)


def after(text: str) -> tuple[str | None, str | None, tuple[str, ...]]:
    """The masked text, the reason and the hidden values of `secrets` on a result (None, None, () when allowed)."""
    verdict = Secrets().after_execute(call({}), text)
    if verdict is None:
        return None, None, ()
    assert verdict.decision == "mask"
    return verdict.result, verdict.reason, verdict.hidden


RESULTS = [
    (f"aws_access_key_id = {AWS_KEY_ID}", AWS_KEY_ID, "an AWS access key id"),
    (f"aws_secret_access_key = {AWS_SECRET}", AWS_SECRET, "assigned password or key"),
    (f"[default]\nkey {AWS_KEY_ID}\nsecret {AWS_SECRET}\n", AWS_SECRET, "an AWS secret access key"),
    (f"token: {GITHUB}", GITHUB, "a GitHub token"),
    (f"use {GITHUB_PAT} to push", GITHUB_PAT, "a GitHub token"),
    (f"CI_TOKEN {GITLAB}", GITLAB, "a GitLab token"),
    (f"slack {SLACK}", SLACK, "a Slack token"),
    (f"stripe.api_key = '{STRIPE}'", STRIPE, "a Stripe key"),
    (f"restricted {STRIPE_RESTRICTED}", STRIPE_RESTRICTED, "a Stripe key"),
    (f"maps key {GOOGLE} here", GOOGLE, "a Google API key"),
    (f"OPENAI_API_KEY={OPENAI}", OPENAI, "an OpenAI key"),
    (f"legacy {OPENAI_LEGACY}.", OPENAI_LEGACY, "an OpenAI key"),
    (f"x-api-key: {ANTHROPIC}", ANTHROPIC, "an Anthropic key"),
    (f"the session is {JWT}", JWT, "a JSON web token"),
    (f"key file:\n{PRIVATE_KEY}\nend", PRIVATE_KEY, "a private key"),
    (f"key cut short:\n{PRIVATE_KEY[:120]}", PRIVATE_KEY[:120], "a private key"),
    ('{"user": "ada", "password": "correct horse battery"}', "correct horse battery", "assigned password or key"),
    ("DB_PASSWORD=Tr0ub4dor&3", "Tr0ub4dor", "assigned password or key"),
    ("client_secret: 9f8e7d6c5b4a", "9f8e7d6c5b4a", "assigned password or key"),
    ("Authorization: Basic YWRhOmxvdmVsYWNl", "YWRhOmxvdmVsYWNl", "an Authorization header"),
    ("curl -H 'Authorization: Bearer Q7mX2kR9vL4pZ8wN1cT6'", "Q7mX2kR9vL4pZ8wN1cT6", "an Authorization header"),
    ("send it with bearer Q7mX2kR9vL4pZ8wN1cT6yB3f", "Q7mX2kR9vL4pZ8wN1cT6yB3f", "a bearer token"),
    ("clone https://ada:s3cr3t-pass@git.example.com/repo.git", "s3cr3t-pass", "a password in a URL"),
]


@pytest.mark.parametrize(("text", "secret", "kind"), RESULTS, ids=[kind + str(i) for i, (_, _, kind) in
                                                                      enumerate(RESULTS)])
def test_a_credential_in_a_result_is_masked_and_named(text: str, secret: str, kind: str) -> None:
    masked, reason, hidden = after(text)
    assert masked is not None, f"not found in {text!r}"
    assert reason is not None
    assert secret not in masked
    assert MASK in masked
    assert kind in reason
    assert secret not in reason
    assert secret in hidden


def test_masking_keeps_the_text_around_the_credential() -> None:
    masked, _, _ = after(f"clone https://ada:s3cr3t-pass@git.example.com/repo.git with {GITHUB}, then push")
    assert masked == f"clone https://ada:{MASK}@git.example.com/repo.git with {MASK}, then push"


def test_an_assigned_password_is_masked_wherever_it_comes_again() -> None:
    masked, _, _ = after("password=Hunter2isGreat\n...\nlog in as ada with Hunter2isGreat")
    assert masked == f"password={MASK}\n...\nlog in as ada with {MASK}"


def test_overlapping_findings_make_one_mask() -> None:
    masked, reason, _ = after(f"Authorization: Bearer {JWT}")
    assert masked == f"Authorization: Bearer {MASK}"
    assert reason is not None
    assert "a JSON web token" in reason
    assert "an Authorization header" in reason


def test_a_private_keys_line_breaks_are_hidden_as_json_writes_them_too() -> None:
    _, _, hidden = after(PRIVATE_KEY)
    assert PRIVATE_KEY in hidden
    assert json.dumps(PRIVATE_KEY)[1:-1] in hidden


ORDINARY = [
    "commit " + hashlib.sha1(b"toolspan").hexdigest() + " fixed the parser",
    "sha256 " + hashlib.sha256(b"toolspan").hexdigest(),
    "request " + str(uuid.UUID(int=0x12345678123456781234567812345678)),
    "data:image/png;base64," + base64.b64encode(bytes(range(256)) * 3).decode(),
    "The password reset link was sent. Your password: click the link to choose one.",
    '{"max_tokens": 1024, "usage": {"input_tokens": 12, "output_tokens": 40}, "token_count": 7}',
    '{"key": "user_id", "value": "42", "keyboard": "qwerty"}',
    "pip install scikit-learn; see sk-learn-estimators-2024-guide and task-scheduler-for-the-backend",
    'password: null, secret: "${DB_SECRET}", token: "****", api_key: "{{ api_key }}"',
    "Bearer tokens are described in RFC 6750; the bearer of bad news",
    "ssh ada@example.com and https://example.com:8443/path?x=1 and mailto:ada@example.com",
    "AKIA is the prefix of an access key id; ASIA of a temporary one.",
    "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n-----END CERTIFICATE-----",
    "eyJ alone is the start of a JSON object in base64",
    "https://user:ab@example.com (a password of two characters is too short to tell)",
]


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert credentials(text) == []
    assert Secrets().after_execute(call({}), text) is None


def test_a_token_glued_to_a_word_is_not_taken_for_one() -> None:
    assert credentials("x" + GITHUB) == []
    assert credentials("task" + OPENAI_LEGACY) == []


# --- arguments --------------------------------------------------------------------------------------


def before(arguments: dict[str, Any]) -> tuple[str | None, tuple[str, ...]]:
    verdict = Secrets().before_execute(call(arguments))
    if verdict is None:
        return None, ()
    assert verdict.decision == "deny"
    return verdict.reason, verdict.hidden


def test_a_call_carrying_a_credential_is_denied_naming_the_argument_not_the_value() -> None:
    reason, hidden = before({"url": "https://api.github.com/user", "headers": {"Authorization": f"token {GITHUB}"}})
    assert reason is not None
    assert "argument 'headers.Authorization' holds" in reason
    assert "a GitHub token" in reason
    assert "credentials may not be passed to tools" in reason
    assert GITHUB not in reason
    assert GITHUB in hidden


def test_credentials_deep_in_lists_are_found_with_their_place() -> None:
    reason, hidden = before({"steps": [{"run": "echo hi"}, {"run": f"git push https://ada:{GITHUB}@github.com/x"}]})
    assert reason is not None
    assert "argument 'steps[1].run'" in reason
    assert GITHUB in hidden
    assert GITHUB not in reason


def test_a_credential_as_an_arguments_name_is_found_and_not_quoted() -> None:
    reason, hidden = before({"env": {GITHUB: "value"}})
    assert reason is not None
    assert "the name of argument 'env.[REDACTED]'" in reason
    assert GITHUB not in reason
    assert GITHUB in hidden


def test_every_argument_holding_a_credential_is_hidden_and_a_few_are_named() -> None:
    arguments = {f"a{i}": f"key {secret}" for i, secret in enumerate((GITHUB, SLACK, STRIPE, GOOGLE, JWT))}
    reason, hidden = before(arguments)
    assert reason is not None
    assert "(and more)" in reason
    assert "'a0'" in reason
    assert "'a2'" in reason
    assert "'a3'" not in reason
    for secret in (GITHUB, SLACK, STRIPE, GOOGLE, JWT):
        assert secret in hidden
        assert secret not in reason


def test_a_call_without_credentials_is_allowed() -> None:
    assert before({"url": "https://example.com", "count": 3, "flags": [True, None, 2.5],
                   "query": "how do I rotate a password?", "sha": hashlib.sha1(b"x").hexdigest()}) == (None, ())


def test_two_strings_that_only_make_a_credential_together_are_not_one() -> None:
    assert before({"first": "password", "second": "=hunter2hunter2"}) == (None, ())


def test_a_text_dense_with_credentials_is_masked_from_the_first_on() -> None:
    tokens = [f"ghp_{i:036d}" for i in range(300)]
    masked, reason, hidden = after("intro kept\n" + "\n".join(tokens))
    assert masked == f"intro kept\n{MASK}"
    assert reason == "credentials masked (more than 256 credentials)"
    assert "\n".join(tokens) in hidden
