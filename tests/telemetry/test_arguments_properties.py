"""Properties of argument masking (telemetry/arguments.py): whatever a model sends, a secret's
value never reaches a span, what is not secret is kept, and the text stays bounded.

Secret values are drawn with a `Q` in them and nothing else ever holds one (keys and plain values
come from lower-case alphabets without `q`; the mask and the truncation marker have none), so
"no `Q` in the output" means "no secret value, nor any part of one, in the output"."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from hypothesis import given, note, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from gateway.settings.model import REDACT_KEYS
from gateway.tools import Rejection, Tool, ToolContext
from telemetry.arguments import MASK, mask_message, render_arguments, was_cut, was_masked

PLAIN = "abcdefghijklmnoprstuvwxyz0123456789 _-./"  # no q, no Q
secret_value = st.text(max_size=30).map(lambda s: f"Q{s}")
plain_text = st.text(alphabet=PLAIN, max_size=12)
plain_key = st.text(alphabet="abcdefghijklmnoprstuvwxyz_", min_size=1, max_size=10)


def _respell(name: str, upper: bool, dash: bool) -> str:
    name = name.replace("_", "-") if dash else name
    return name.upper() if upper else name


secret_key = st.builds(lambda head, name, tail, upper, dash: head + _respell(name, upper, dash) + tail,
                       st.sampled_from(["", "x_", "x-", "my", "user_"]), st.sampled_from(REDACT_KEYS),
                       st.sampled_from(["", "_1", "-hash", "s"]), st.booleans(), st.booleans())

plain_scalar = st.one_of(plain_text, st.integers(), st.booleans(), st.none())
secret_tree = st.recursive(secret_value | st.integers(min_value=10**9).map(lambda n: f"Q{n}"),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(plain_key, inner, max_size=3),
                           max_leaves=6)


def _object(children: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """An object whose members are plain (any depth) or secret-named (a secret tree)."""
    member = st.one_of(st.tuples(plain_key, children), st.tuples(secret_key, secret_tree))
    return st.lists(member, max_size=5).map(dict)


json_value = st.recursive(plain_scalar, lambda inner: st.lists(inner, max_size=4) | _object(inner), max_leaves=25)
json_arguments = _object(json_value)


def _expected(value: Any) -> Any:
    """The reference: every value under a key containing a redact key (`-` as `_`) is the mask."""
    if isinstance(value, dict):
        return {k: MASK if any(r in k.lower().replace("-", "_") for r in REDACT_KEYS) else _expected(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_expected(v) for v in value]
    return value


@settings(max_examples=300, deadline=None)
@given(json_arguments, st.booleans())
def test_json_arguments_never_show_a_secret_value_and_keep_the_rest(arguments: dict[str, Any],
                                                                     spaced: bool) -> None:
    raw = json.dumps(arguments, indent=2 if spaced else None)
    rendered = render_arguments(raw, 1 << 20, REDACT_KEYS)
    assert "Q" not in rendered
    assert json.loads(rendered) == _expected(arguments)


@settings(max_examples=300, deadline=None)
@given(json_arguments, st.integers(min_value=64, max_value=400))
def test_json_arguments_cut_short_never_show_a_secret_value(arguments: dict[str, Any], max_chars: int) -> None:
    raw = json.dumps(arguments)
    assert "Q" not in render_arguments(raw, max_chars, REDACT_KEYS)
    assert "Q" not in render_arguments(raw + " x", max_chars, REDACT_KEYS)  # no longer JSON: the text path


@settings(max_examples=300, deadline=None)
@given(json_arguments, st.integers(min_value=64, max_value=400))
def test_a_replay_tells_arguments_cut_short_and_masked(arguments: dict[str, Any], max_chars: int) -> None:
    """What a replay (gateway.improve.replay) reads off the recorded text: cut when the rendering is
    longer than the limit (the start of the arguments, then the marker), masked when a secret key
    is there."""
    rendered = render_arguments(json.dumps(arguments), max_chars, REDACT_KEYS)
    assert was_cut(rendered) == (len(rendered) > max_chars)
    if not was_cut(rendered):
        assert was_masked(rendered) == (_expected(arguments) != arguments or MASK in json.dumps(arguments))


# --- text that is not JSON -----------------------------------------------------------------------------

def _quoted(text: str, quote: str) -> str:
    return quote + text.replace("\\", "\\\\").replace(quote, "\\" + quote) + quote


@st.composite
def pair(draw: st.DrawFn) -> tuple[str, bool]:
    """One `key: value` pair as a model might write it outside JSON, and whether it is secret."""
    secret = draw(st.booleans())
    key = draw(secret_key if secret else plain_key)
    key_quote = draw(st.sampled_from(["'", '"']))
    style = draw(st.sampled_from(["'", '"', "bare"]))
    if secret:
        value = draw(secret_value if style != "bare" else st.text(alphabet=PLAIN.replace(" ", ""), max_size=8)
                     .map(lambda s: f"Q{s}"))
    else:
        value = draw(plain_text if style != "bare" else st.text(alphabet="abc123", min_size=1, max_size=8))
    shown = value if style == "bare" else _quoted(value, style)
    return f"{key_quote}{key}{key_quote}: {shown}", secret


@settings(max_examples=300, deadline=None)
@given(st.lists(pair(), min_size=1, max_size=6), st.sampled_from([", ", ",", " ,\n "]), st.booleans())
def test_quoted_pairs_in_text_that_is_not_json_are_masked(pairs: list[tuple[str, bool]], separator: str,
                                                          unclosed: bool) -> None:
    raw = "{" + separator.join(text for text, _ in pairs) + ("" if unclosed else "}")
    rendered = render_arguments(raw, 1 << 20, REDACT_KEYS)
    note(f"raw={raw!r} rendered={rendered!r}")
    assert "Q" not in rendered
    assert MASK in rendered or not any(secret for _, secret in pairs)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=3000) | json_arguments.map(json.dumps), st.integers(min_value=64, max_value=1024))
def test_the_output_is_bounded(raw: str, max_chars: int) -> None:
    rendered = render_arguments(raw, max_chars, REDACT_KEYS)
    assert len(rendered) <= max_chars + len(f"...[truncated; {len(raw)} chars sent]")


# --- the span's status description of a rejection -------------------------------------------------------

class Secrets(BaseModel):
    user: str = Field(max_length=8)
    password: str = Field(min_length=200)
    api_key: int
    nested: dict[str, int] = Field(default_factory=dict)


SECRETS_TOOL = Tool(name="login", args_model=Secrets, function=lambda args: "ok")


@settings(max_examples=150, deadline=None)
@given(password=secret_value, api_key=secret_value, token=secret_value)
def test_a_rejection_message_on_a_span_never_quotes_a_secret(password: str, api_key: str, token: str) -> None:
    raw = json.dumps({"user": "a-long-user-name", "password": password, "api_key": api_key,
                      "nested": {"token": token}})
    parsed = asyncio.run(SECRETS_TOOL.parse_arguments(raw, ToolContext(tool_call_id="c")))
    assert isinstance(parsed, Rejection)
    assert "Q" in parsed.message  # the model's copy quotes what it sent
    masked = mask_message(parsed.message, raw, REDACT_KEYS, 2048)
    assert "Q" not in masked
    assert '(got "a-long-user-name")' in masked


def test_a_string_that_ends_just_before_a_secret_pair_is_no_key_of_its_own() -> None:
    """Found by the property above: the closing quote of `'\\\\'` once opened a "key" that ran to
    the quote inside the bare secret, and the secret went out as it was."""
    raw = """{'_': '\\\\', "password": Q'=abc}"""
    assert render_arguments(raw, 1 << 20, REDACT_KEYS) == """{'_': '\\\\', "password": [REDACTED]}"""
