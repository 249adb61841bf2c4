"""Checking the fields of a request the gateway relies on, for every API: pydantic types that
check without copying what the gateway passes on as it came, and one way to say what is wrong."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, Field, PlainValidator, TypeAdapter, ValidationError
from pydantic_core import PydanticCustomError

from gateway.errors import BadRequest

M = TypeVar("M", bound=BaseModel)


def _json_object(value: Any) -> dict[str, Any]:
    if type(value) is not dict:  # orjson decodes a JSON object as exactly a dict
        raise PydanticCustomError("dict_type", "Input should be a valid dictionary")
    return value


# A JSON object of a request that the gateway passes on as it came: checked to be an object, not
# copied key by key as a `dict[str, Any]` field is (less than half the time); the error names the
# same place with the same words.
JsonObject = Annotated[dict[str, Any], PlainValidator(_json_object)]


def _json_objects(detailed: TypeAdapter[list[dict[str, Any]]]) -> PlainValidator:
    """A list of JSON objects checked at once, by type, when all is well; else by `detailed`, whose
    error names the item and the rule it breaks."""
    def check(value: Any) -> list[dict[str, Any]]:
        if type(value) is list and value and all(type(item) is dict for item in value):
            return value
        return detailed.validate_python(value)

    return PlainValidator(check)


JsonObjects = Annotated[list[dict[str, Any]], _json_objects(TypeAdapter(list[JsonObject]))]
NonEmptyJsonObjects = Annotated[list[dict[str, Any]],
                                _json_objects(TypeAdapter(Annotated[list[JsonObject], Field(min_length=1)]))]


def checked_first_by(passes: Callable[[Any], bool], detailed: TypeAdapter[Any]) -> PlainValidator:
    """A field that plain Python checks (`passes`, which must pass nothing `detailed` refuses) and
    keeps as it came; what it does not pass goes to the pydantic `detailed`, whose error names the
    item and the rule it breaks. For the request's `tools`, where pydantic made a model of each tool
    only to be thrown away (the figure: docs/benchmarks.md)."""
    def check(value: Any) -> Any:
        if not passes(value):
            detailed.validate_python(value)  # its error; or, should it pass after all, the value as it came
        return value

    return PlainValidator(check)


def validate(model: type[M], body: dict[str, Any], what: str) -> M:
    """`body` checked against the pydantic `model` of a request, or a 400 naming the field."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise BadRequest(f"not {what}: {where}: {first['msg']}",
                         param=str(first["loc"][0]) if first["loc"] else None) from exc


