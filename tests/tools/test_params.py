"""Param -> JSON schema, declaration checks, and the did-you-mean machinery."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.tools import NameCheck, Param, ToolDeclarationError, suggest
from gateway.tools.params import check_names, describe_names, jaro, parameters_schema, without_titles
from gateway.tools.strict import strict_schema

# --- Param -> JSON schema ---------------------------------------------------------------------


@pytest.mark.parametrize("json_type", ["string", "integer", "number", "boolean"])
def test_scalar_param_schema_is_just_its_type(json_type: str) -> None:
    assert Param("x", json_type).schema() == {"type": json_type}


@pytest.mark.parametrize(
    ("param", "expected"),
    [
        pytest.param(Param("city", "string", description="Where"), {"type": "string", "description": "Where"},
                     id="description"),
        pytest.param(Param("unit", "string", enum=["c", "f"]), {"type": "string", "enum": ["c", "f"]}, id="enum"),
        pytest.param(Param("n", "integer", enum=(1, 2)), {"type": "integer", "enum": [1, 2]}, id="integer-enum"),
        pytest.param(Param("tags", "array", item_type="string"), {"type": "array", "items": {"type": "string"}},
                     id="array-of-strings"),
        pytest.param(Param("tags", "array"), {"type": "array"}, id="array-without-item-type"),
        pytest.param(
            Param("rows", "array", item_type="object",
                  properties=[Param("id", "integer", required=True), Param("label", "string")]),
            {"type": "array", "items": {
                "type": "object",
                "properties": {"id": {"type": "integer"}, "label": {"type": "string"}},
                "required": ["id"],
            }},
            id="array-of-objects",
        ),
        pytest.param(
            Param("data", "object", properties=[
                Param("auto_complete_email", "boolean"),
                Param("paging", "object", required=True, properties=[Param("size", "integer", required=True)]),
            ]),
            {"type": "object",
             "properties": {
                 "auto_complete_email": {"type": "boolean"},
                 "paging": {"type": "object", "properties": {"size": {"type": "integer"}}, "required": ["size"]},
             },
             "required": ["paging"]},
            id="nested-objects",
        ),
    ],
)
def test_param_schema(param: Param, expected: dict[str, object]) -> None:
    assert param.schema() == expected


def test_required_is_listed_on_the_enclosing_object_not_the_property() -> None:
    schema = parameters_schema([Param("path", "string", required=True), Param("offset", "integer")])
    assert schema == {
        "type": "object",
        "properties": {"path": {"type": "string"}, "offset": {"type": "integer"}},
        "required": ["path"],
    }


def test_strict_closes_every_object_level() -> None:
    params = [  # required, so that strict mode does not wrap them in a nullable anyOf
        Param("data", "object", required=True,
              properties=[Param("inner", "object", required=True, properties=[Param("x", "string")])]),
        Param("rows", "array", item_type="object", required=True, properties=[Param("id", "integer")]),
    ]
    schema = strict_schema("t", parameters_schema(params), validated=False)
    data = schema["properties"]["data"]
    assert schema["additionalProperties"] is False
    assert data["additionalProperties"] is False
    assert data["properties"]["inner"]["additionalProperties"] is False
    assert schema["properties"]["rows"]["items"]["additionalProperties"] is False
    assert "additionalProperties" not in parameters_schema(params)


def test_param_freezes_caller_lists() -> None:
    enum = ["a", "b"]
    props = [Param("x", "string")]
    param = Param("p", "object", enum=enum, properties=props)
    enum.append("c")
    props.append(Param("y", "string"))
    assert param.enum == ("a", "b")
    assert [p.name for p in param.properties] == ["x"]


# --- Param.check --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("param", "message"),
    [
        (Param("", "string"), "here: a parameter has an empty or non-string name"),
        (Param("x", "str"), "here: parameter 'x' has type 'str'; use one of"),
        (Param("x", "string", item_type="string"), "here: parameter 'x' sets item_type but is not an array"),
        (Param("x", "array", item_type="thing"), "here: parameter 'x' has item_type 'thing'"),
        (Param("x", "string", properties=[Param("y", "string")]), "here: parameter 'x' has properties but holds no"),
        (Param("x", "array", item_type="string", properties=[Param("y", "string")]), "has properties but holds no"),
        (Param("x", "string", enum=[]), "here: parameter 'x' has an empty enum"),
        (Param("x", "object", properties=[Param("y", "string"), Param("y", "integer")]),
         "here: parameter 'x' declares a nested property twice"),
        (Param("outer", "object", properties=[Param("inner", "nope")]), "here.outer: parameter 'inner' has type"),
    ],
)
def test_check_rejects_malformed_params(param: Param, message: str) -> None:
    with pytest.raises(ToolDeclarationError) as info:
        param.check("here")
    assert message in str(info.value)


def test_check_accepts_every_well_formed_shape() -> None:
    Param("rows", "array", item_type="object", enum=[[]], properties=[
        Param("meta", "object", properties=[Param("k", "string", enum=["a"])]),
    ]).check("here")  # must not raise


# --- suggest ------------------------------------------------------------------------------------

ACCEPTED = ["path", "offset", "limit"]


@pytest.mark.parametrize(
    ("sent", "accepted", "expected"),
    [
        pytest.param("PATH", ACCEPTED, "path", id="case-insensitive"),
        pytest.param("Offset", ACCEPTED, "offset", id="case-insensitive-mixed"),
        pytest.param("file_path", ACCEPTED, "path", id="sent-contains-accepted"),
        pytest.param("lim", ACCEPTED, "limit", id="accepted-contains-sent"),
        pytest.param("file_path", ["path", "file_path_x"], "file_path_x", id="longest-containment-wins"),
        pytest.param("ofset", ACCEPTED, "offset", id="jaro-typo"),
        pytest.param("pth", ACCEPTED, "path", id="jaro-missing-letter"),
        pytest.param("colour", ACCEPTED, None, id="nothing-close"),
        pytest.param("zzz", ACCEPTED, None, id="no-shared-letters"),
        pytest.param("anything", [], None, id="nothing-accepted"),
        pytest.param("video_id", ["id", "video"], "video", id="longest-containment-over-two-letter-word"),
        pytest.param("user_id", ["id"], "id", id="two-letter-name-as-a-whole-word"),
        pytest.param("userId", ["id"], "id", id="two-letter-name-as-a-camel-word"),
        pytest.param("video_width", ["id"], None, id="two-letter-overlap-is-accidental"),
        pytest.param("width", ["id"], None, id="two-letter-overlap-inside-one-word"),
        pytest.param("video_width", ["id", "path"], None, id="two-letter-overlap-among-others"),
    ],
)
def test_suggest(sent: str, accepted: list[str], expected: str | None) -> None:
    assert suggest(sent, accepted) == expected


def test_suggest_threshold_is_strictly_above() -> None:
    score = jaro("ab", "ac")  # 2/3
    assert suggest("ab", ["ac"], threshold=score) is None
    assert suggest("ab", ["ac"], threshold=score - 0.01) == "ac"


@given(sent=st.text(max_size=12), accepted=st.lists(st.text(min_size=1, max_size=12), max_size=5))
def test_suggest_only_ever_returns_an_accepted_name(sent: str, accepted: list[str]) -> None:
    hint = suggest(sent, accepted)
    assert hint is None or hint in accepted


_NAMES = st.text(alphabet="abcB_", min_size=1, max_size=8)  # few letters: names that overlap


@given(sent=st.lists(_NAMES, max_size=6), accepted=st.lists(_NAMES, max_size=6))
def test_a_hint_names_an_accepted_parameter_not_sent(sent: list[str], accepted: list[str]) -> None:
    check = check_names(sent, required=accepted[:2], accepted=accepted)
    for name, hint in check.suggestions:
        assert name in check.unrecognized
        assert hint in accepted
        assert hint not in sent


# --- jaro ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("MARTHA", "MARHTA", 0.944444),
        ("DIXON", "DICKSONX", 0.766667),
        ("JELLYFISH", "SMELLYFISH", 0.896296),
        ("CRATE", "TRACE", 0.733333),
        ("abc", "abc", 1.0),
        ("", "", 1.0),
        ("", "a", 0.0),
        ("abc", "xyz", 0.0),
    ],
)
def test_jaro_known_values(a: str, b: str, expected: float) -> None:
    assert jaro(a, b) == pytest.approx(expected, abs=1e-6)


@given(st.text(max_size=10), st.text(max_size=10))
def test_jaro_is_a_symmetric_similarity(a: str, b: str) -> None:
    score = jaro(a, b)
    assert 0.0 <= score <= 1.0
    assert score == pytest.approx(jaro(b, a))
    assert jaro(a, a) == 1.0


# --- check_names / describe_names ---------------------------------------------------------------


def test_check_names_reports_missing_unrecognized_and_hints_in_order() -> None:
    check = check_names(["file_path", "colour", "offset"], required=["path", "offset"],
                        accepted=["path", "offset", "limit"])
    assert check == NameCheck(
        required=("path", "offset"),
        accepted=("path", "offset", "limit"),
        missing=("path",),
        unrecognized=("file_path", "colour"),
        suggestions=(("file_path", "path"),),
    )


@pytest.mark.parametrize(
    ("sent", "accepted", "expected"),
    [
        pytest.param("fromTimezone", ["time", "from_timezone", "to_timezone"], "from_timezone", id="camel-of-snake"),
        pytest.param("diceNumber", ["number", "dice_number", "sides"], "dice_number", id="camel-of-snake-word"),
        pytest.param("year1Revenue", ["year1", "year1_revenue", "year2_revenue"], "year1_revenue", id="digit-word"),
        pytest.param("page-size", ["page", "page_size"], "page_size", id="kebab-of-snake"),
        pytest.param("max_results", ["max", "maxResults"], "maxResults", id="snake-of-camel"),
        pytest.param("PageSize", ["page", "page_size"], "page_size", id="pascal-of-snake"),
    ],
)
def test_a_respelling_is_matched_before_a_shorter_name_inside_it(sent: str, accepted: list[str],
                                                                 expected: str) -> None:
    assert suggest(sent, accepted) == expected


@pytest.mark.parametrize(
    ("sent", "accepted", "expected"),
    [
        pytest.param("id", ["include_images", "identifier", "query"], None, id="two-letter"),
        pytest.param("to", ["token", "topic"], None, id="two-letter-prefix"),
        pytest.param("versionsOrigin", ["version", "origin"], "origin", id="inside-a-word"),
        pytest.param("travel", ["number_of_travelers", "travel_date"], "travel_date", id="whole-word-first"),
    ],
)
def test_a_name_inside_another_word_is_not_suggested(sent: str, accepted: list[str], expected: str | None) -> None:
    assert suggest(sent, accepted) == expected


def test_a_name_already_sent_is_never_suggested() -> None:
    check = check_names(["location", "start_location"], required=["start_location", "end_location"],
                        accepted=["start_location", "end_location", "mode"])
    assert check.missing == ("end_location",)
    assert check.suggestions == (("location", "end_location"),)


def test_a_missing_required_name_is_suggested_before_an_optional_one() -> None:
    check = check_names(["id"], required=["template_id"], accepted=["credential_id", "template_id"])
    assert check.suggestions == (("id", "template_id"),)


def test_of_names_equally_likely_none_is_named_unless_one_is_missing() -> None:
    assert suggest("age", ["min_age", "max_age"]) is None
    assert suggest("strt", ["sort", "start"]) is None
    check = check_names(["age"], required=["max_age"], accepted=["min_age", "max_age"])
    assert check.suggestions == (("age", "max_age"),)


def test_a_name_sharing_a_word_is_suggested_before_one_merely_spelled_alike() -> None:
    assert suggest("person_id", ["reason", "user_id"]) == "user_id"
    assert suggest("begin_date", ["start_date", "end_date"]) is None  # both share "date"


def test_a_typo_of_a_longer_name_beats_a_word_it_still_contains() -> None:
    assert suggest("photo_ormat", ["photo", "photo_format"]) == "photo_format"
    assert suggest("webisteId", ["website", "websiteId"]) == "websiteId"


def test_check_names_with_unknown_accepted_names_flags_nothing_as_unrecognized() -> None:
    check = check_names(["whatever"], required=["path"], accepted=[])
    assert check.missing == ("path",)
    assert check.unrecognized == ()
    assert check.suggestions == ()


def test_check_names_all_present() -> None:
    check = check_names(["path"], required=["path"], accepted=["path", "offset"])
    assert (check.missing, check.unrecognized) == ((), ())


def test_describe_names_lists_everything_a_model_needs() -> None:
    check = check_names(["file_path", "colour"], required=["path"], accepted=["path", "offset"])
    assert describe_names("read_file", check, "required arguments are missing.").splitlines() == [
        "Tool 'read_file': required arguments are missing.",
        "Required parameters: path",
        "Missing: path",
        "Unrecognized: file_path (did you mean 'path'?), colour",
        "Accepted parameters: path, offset",
        "Call 'read_file' again, passing every required parameter under its accepted name.",
    ]


def test_describe_names_without_required_or_known_names() -> None:
    check = check_names(["x"], required=[], accepted=[])
    assert describe_names("t", check, "headline").splitlines() == [
        "Tool 't': headline",
        "Required parameters: (none)",
        "Call 't' again, passing every required parameter under its accepted name.",
    ]


# --- without_titles -----------------------------------------------------------------------------


def test_without_titles_drops_title_keys_everywhere_but_keeps_a_property_named_title() -> None:
    schema = {
        "title": "Book",
        "type": "object",
        "properties": {
            "title": {"title": "Title", "type": "string"},
            "tags": {"title": "Tags", "type": "array", "items": {"title": "Tag", "type": "string"}},
            "isbn": {"title": "Isbn", "anyOf": [{"type": "string", "title": "S"}, {"type": "null"}]},
        },
        "required": ["title"],
        "$defs": {"Author": {"title": "Author", "type": "object",
                             "properties": {"title": {"title": "Title", "type": "string"}}}},
    }
    assert without_titles(schema) == {
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "isbn": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        },
        "required": ["title"],
        "$defs": {"Author": {"type": "object", "properties": {"title": {"type": "string"}}}},
    }
    assert schema["title"] == "Book"  # the input is left alone
