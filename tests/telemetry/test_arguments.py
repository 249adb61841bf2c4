"""Tool arguments, and messages about them, made safe for a span (telemetry.arguments): secrets kept
off spans however a model writes them, what is not secret kept (issue 10's hardening)."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any

import pytest
from pydantic import BaseModel

from gateway.settings.model import Settings
from telemetry.arguments import MASK, TOO_DEEP, mask_message, masked, masked_schema, render_arguments
from telemetry.instrument import ArgumentCapture


def test_the_redact_list_is_one_list() -> None:
    assert tuple(ArgumentCapture().redact_keys) == tuple(Settings().redact_keys)
    for key in ("api-key", "x-api-key", "passwd", "X_API_KEY", "Private-Key", "cookie"):
        assert MASK in render_arguments(f'{{"{key}": "s3cr3t"}}', 2048, Settings().redact_keys), key


@pytest.mark.parametrize(("raw", "secret"), [
    ("{'password': 'hunter2', 'path': 'a'}", "hunter2"),
    ("{'password': \"hunter2\"}", "hunter2"),
    ("{'token': 12345678}", "12345678"),
    ('{"password": "hunter2"', "hunter2"),
    ("{password: hunter2, path: a}", "hunter2"),
    ("password=hunter2&user=bob", "hunter2"),
    ('"{\\"password\\": \\"hunter2\\"}"', "hunter2"),  # JSON text inside a JSON string
], ids=["single", "mixed-quotes", "number", "cut-short", "bare", "form", "double-encoded"])
def test_secret_pairs_in_text_that_is_not_a_json_object_are_masked(raw: str, secret: str) -> None:
    rendered = render_arguments(raw, 2048, Settings().redact_keys)
    assert secret not in rendered
    assert MASK in rendered


def test_masking_keeps_what_is_not_secret() -> None:
    rendered = render_arguments("{'password': 'hunter2', 'path': '/etc/hosts'}", 2048, ("password",))
    assert "'path': '/etc/hosts'" in rendered


def test_a_violation_line_of_a_secret_field_loses_its_value() -> None:
    message = "\n".join([
        "Tool 'login': 3 arguments do not fit the declared parameters.",
        '- password: String should have at least 12 characters (got "hunter2 (got x)")',
        '- auth.0.api_key: String should match pattern \'^sk-\' (got "leaky")',
        '- retries: Input should be a valid integer (got "many")',
        "Fix every problem listed and call 'login' again."])
    masked = mask_message(message, "", Settings().redact_keys, 2048)
    assert "hunter2" not in masked
    assert "leaky" not in masked
    assert f"- password: String should have at least 12 characters (got {MASK})" in masked
    assert f"- auth.0.api_key: String should match pattern '^sk-' (got {MASK})" in masked
    assert '- retries: Input should be a valid integer (got "many")' in masked


def test_secret_values_of_the_arguments_are_masked_wherever_a_message_quotes_them() -> None:
    raw = '{"user": "bob", "auth": [{"password": "hunter2\\"quoted"}], "token": 987654321}'
    message = 'refused: hunter2"quoted, escaped "hunter2\\"quoted", id 987654321, user bob'
    masked = mask_message(message, raw, Settings().redact_keys, 2048)
    assert "hunter2" not in masked
    assert "987654321" not in masked
    assert "user bob" in masked


def test_short_secret_values_are_not_hunted_through_the_message() -> None:
    # A one-letter secret would mask every "a" of the message; the pairs still go.
    masked = mask_message("- a: bad (got 1)", '{"token": "a"}', Settings().redact_keys, 2048)
    assert masked == "- a: bad (got 1)"




DEEP = '{"password": "hunter2", "a": ' + "[" * 600 + "]" * 600 + "}"  # past MAX_ARGUMENT_DEPTH, within json's reach


def test_arguments_nested_too_deep_are_masked_as_text() -> None:
    """A call refused for nesting too deep is recorded as sent: its secrets masked in the text, with
    no recursive walk of the value (the interpreter's stack would not take it)."""
    keys = Settings().redact_keys
    expected = DEEP.replace("hunter2", MASK)
    assert render_arguments(DEEP, 4096, keys) == expected
    assert masked(json.loads(DEEP), keys) == expected  # a captured answer's decoded arguments
    assert masked(json.loads(DEEP), ()) == DEEP
    assert "hunter2" not in mask_message("Tool 'x': nested too deep. You sent hunter2.", DEEP, keys, 4096)
    beyond: list[Any] = []
    for _ in range(100_000):  # built, not decoded: deeper than json can write
        beyond = [beyond]
    assert masked(beyond, keys) == TOO_DEEP


SECRET_VALUE = "sk-live-0123456789"


def test_every_value_a_secret_property_gives_is_masked_however_deep() -> None:
    """A secret property's default, const, enum and examples are masked wherever its schema holds
    them (its anyOf, oneOf, allOf, items, properties ...), its structure kept; another property's
    values are kept."""
    secret = {"anyOf": [{"type": "string", "enum": [SECRET_VALUE]}, {"type": "null", "const": SECRET_VALUE}],
              "oneOf": [{"allOf": [{"default": SECRET_VALUE}]}],
              "items": {"examples": [SECRET_VALUE], "properties": {"inner": {"default": SECRET_VALUE}}},
              "$defs": {"key": {"example": SECRET_VALUE}}, "default": SECRET_VALUE}
    schema = {"type": "object", "properties": {
        "api_key": secret, "unit": {"type": "string", "enum": ["c", "f"], "default": "c"},
        "nested": {"type": "object", "properties": {"password": {"anyOf": [{"const": SECRET_VALUE}]}}}}}
    found = masked_schema(schema, Settings().redact_keys)
    assert SECRET_VALUE not in json.dumps(found)
    assert found["properties"]["unit"] == schema["properties"]["unit"]
    shown = found["properties"]["api_key"]
    assert shown["anyOf"] == [{"type": "string", "enum": MASK}, {"type": "null", "const": MASK}]
    assert shown["items"]["properties"]["inner"] == {"default": MASK}
    assert found["properties"]["nested"]["properties"]["password"] == {"anyOf": [{"const": MASK}]}


class Token(StrEnum):  # what a secret field may be: its values are secrets too
    LIVE = SECRET_VALUE


class Unit(StrEnum):
    C = "c"


class Pin(StrEnum):  # referred to by Vault alone
    FIRST = f"{SECRET_VALUE}-pin"


class Vault(BaseModel):  # no secret name of its own: what it holds is secret where a secret field is one
    current: Pin


class Login(BaseModel):
    user: str
    unit: Unit = Unit.C
    token: Token
    api_key: Token | None = Token.LIVE
    password: Vault


def test_the_definitions_a_secret_property_refers_to_are_masked() -> None:
    """pydantic declares an enum once, in the root's `$defs`, and refers to it: the values of the
    definitions a secret property refers to, and of those they refer to, are masked; another
    property's definitions are kept, and every reference stays."""
    schema = Login.model_json_schema()
    found = masked_schema(schema, Settings().redact_keys)
    assert SECRET_VALUE not in json.dumps(found)
    assert found["$defs"]["Token"] == {**schema["$defs"]["Token"], "enum": MASK}
    assert found["$defs"]["Vault"] == schema["$defs"]["Vault"]  # it refers to Pin: no value of its own
    assert found["$defs"]["Pin"] == {**schema["$defs"]["Pin"], "enum": MASK}
    assert found["$defs"]["Unit"] == schema["$defs"]["Unit"]
    assert found["properties"]["unit"] == schema["properties"]["unit"]
    assert found["properties"]["token"] == {"$ref": "#/$defs/Token"}
    assert found["properties"]["api_key"] == {**schema["properties"]["api_key"], "default": MASK}
    older = {"properties": {"secret_key": {"$ref": "#/definitions/a~1b"}, "plain": {"$ref": "#/definitions/c"}},
             "definitions": {"a/b": {"const": SECRET_VALUE}, "c": {"const": "c"}}}
    assert masked_schema(older, Settings().redact_keys)["definitions"] == {"a/b": {"const": MASK}, "c": {"const": "c"}}


def test_a_schema_is_walked_to_a_bounded_depth() -> None:
    """Deeper than any declaration needs, a subschema is masked whole: no walk past the stack."""
    deep: dict[str, Any] = {"default": SECRET_VALUE}
    for _ in range(5_000):
        deep = {"items": deep}
    found = masked_schema({"properties": {"token": deep, "deep": deep}}, Settings().redact_keys)
    assert SECRET_VALUE not in json.dumps(found)
