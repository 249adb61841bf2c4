"""docs/upstreams.md keeps its promises: its config file and its TOOLSPAN_UPSTREAMS JSON load into
the same settings, route every model the way its table of routes says, print the routing table it
shows, and refuse the bad tables with the lines it shows."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gateway.errors import BadRequest, GatewayError
from gateway.provider.cooldowns import CooldownRule, MemoryCooldowns
from gateway.provider.routing import (
    Balancer,
    Route,
    Target,
)
from gateway.provider.upstreams import Upstreams
from gateway.settings.load import load_settings
from gateway.settings.model import Settings
from gateway.settings.text import SettingsInvalid
from gateway.settings.upstreams import DEFAULT_NAME

PAGE = (Path(__file__).resolve().parents[2] / "docs" / "upstreams.md").read_text(encoding="utf-8")
KEY_VARIABLES = {"OPENAI_API_KEY", "AZURE_EAST_API_KEY", "AZURE_WEST_API_KEY", "ANTHROPIC_API_KEY"}


def blocks(language: str) -> list[str]:
    """The page's fenced blocks in `language` ("" for those that name none), in order."""
    found: list[str] = []
    fence: tuple[str, list[str]] | None = None
    for line in PAGE.splitlines():
        if fence is None and line.startswith("```"):
            fence = line.removeprefix("```"), []
        elif fence is not None and line == "```":
            if fence[0] == language:
                found.append("".join(f"{kept}\n" for kept in fence[1]))
            fence = None
        elif fence is not None:
            fence[1].append(line)
    return found


def upstreams_of(settings: Settings) -> Upstreams:
    """The routing over the table with no client: enough to ask where a model goes."""
    rule = CooldownRule(settings.cooldown_failures, settings.cooldown_window_seconds, settings.cooldown_seconds)
    return Upstreams(settings.routing_table(), {}, {}, MemoryCooldowns(rule), Balancer(settings.load_balancing))


@pytest.fixture
def key_variables(clean_env: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in KEY_VARIABLES:
        clean_env.setenv(name, f"dummy-{name.lower()}")
    return clean_env


def from_toml(tmp_path: Path, text: str) -> Settings:
    path = tmp_path / "gateway.toml"
    path.write_text(text, encoding="utf-8")
    return load_settings(config=path)


def the_complete_example_from_toml(tmp_path: Path) -> Settings:
    complete = [block for block in blocks("toml") if "[upstreams.azure-west]" in block]
    assert len(complete) == 1
    return from_toml(tmp_path, complete[0])


def the_complete_example_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> Settings:
    shell = blocks("sh")[0]
    variables = {name: value.strip("'") for name, value in re.findall(r"\b(TOOLSPAN_[A-Z_]+)=('[^']*'|\S+)", shell)}
    assert sorted(variables) == ["TOOLSPAN_COOLDOWN_FAILURES", "TOOLSPAN_COOLDOWN_SECONDS",
                                 "TOOLSPAN_COOLDOWN_WINDOW_SECONDS", "TOOLSPAN_UPSTREAMS"]
    assert isinstance(json.loads(variables["TOOLSPAN_UPSTREAMS"]), dict)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    return load_settings()


def test_the_config_file_and_the_variables_give_the_same_upstreams(key_variables: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    from_file = the_complete_example_from_toml(tmp_path)
    from_environment = the_complete_example_from_the_environment(key_variables)
    provider_fields = ["upstream", "upstreams", "default_upstream", "load_balancing", "cooldown_failures",
                       "cooldown_window_seconds", "cooldown_seconds"]
    assert from_file.model_dump(include=set(provider_fields)) == from_environment.model_dump(
        include=set(provider_fields))
    assert list(from_file.upstreams) == list(from_environment.upstreams) == [
        "openai", "azure-east", "azure-west", "anthropic", "local"]
    assert (from_file.cooldown_failures, from_file.cooldown_window_seconds, from_file.cooldown_seconds) == (3, 30, 60)
    assert from_file.upstream is None
    assert from_file.default_upstream is None


def test_the_example_reads_each_key_from_its_variable(key_variables: pytest.MonkeyPatch, tmp_path: Path) -> None:
    settings = the_complete_example_from_toml(tmp_path)
    keys = {name: entry.key() for name, entry in settings.upstreams.items()}
    assert {name: key.get_secret_value() for name, key in keys.items() if key is not None} == {
        "openai": "dummy-openai_api_key", "azure-east": "dummy-azure_east_api_key",
        "azure-west": "dummy-azure_west_api_key", "anthropic": "dummy-anthropic_api_key"}
    assert keys["local"] is None
    key_variables.delenv("ANTHROPIC_API_KEY")
    with pytest.raises(ValueError, match="api_key_env names ANTHROPIC_API_KEY, which is not set"):
        settings.upstreams["anthropic"].key()


def the_routes_said() -> list[list[str]]:
    """The rows of the page's table of routes: asked for, found by, goes to, falls back to."""
    start = PAGE.index("| the client asks for |")
    rows = []
    for line in PAGE[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def targets_said(cell: str) -> list[Target]:
    return [Target(upstream, model or "") for upstream, model in re.findall(r"`([^`]+)`(?: as `([^`]+)`)?", cell)]


def with_model(targets: list[Target], model: str) -> list[Target]:
    return [t._replace(model=t.model or model) for t in targets]


@pytest.mark.parametrize("form", ["toml", "json"])
def test_every_model_of_the_page_routes_as_its_table_says(key_variables: pytest.MonkeyPatch, tmp_path: Path,
                                                          form: str) -> None:
    settings = (the_complete_example_from_toml(tmp_path) if form == "toml"
                else the_complete_example_from_the_environment(key_variables))
    table = settings.routing_table()
    rows = the_routes_said()
    assert len(rows) == 10
    for asked, found_by, goes_to, falls_back_to in rows:
        model = asked.strip("`")
        route = table.route(model)
        if found_by == "nothing":
            assert route is None, model
            continue
        assert route == Route(tuple(with_model(targets_said(goes_to), model)),
                              tuple(with_model(targets_said(falls_back_to), model)),
                              found_by.split()[0]), model
        if found_by.startswith("pattern"):
            pattern = found_by.split("`")[1]
            assert all(pattern in table.upstreams[t.upstream].models for t in route.primary)


async def test_the_page_shows_the_404_the_gateway_gives(key_variables: pytest.MonkeyPatch, tmp_path: Path) -> None:
    upstreams = upstreams_of(the_complete_example_from_toml(tmp_path))
    with pytest.raises(GatewayError) as refused:
        await upstreams.targets("llama3", "chat")
    shown = json.loads(next(block for block in blocks("json") if "model_not_found" in block))
    assert (refused.value.status, refused.value.body()) == (404, shown)


async def test_a_key_limited_to_models_hears_only_of_those(key_variables: pytest.MonkeyPatch,
                                                           tmp_path: Path) -> None:
    key_variables.setenv("TOOLSPAN_KEYS", re.findall(r"TOOLSPAN_KEYS='([^']*)'", PAGE)[0])
    settings = the_complete_example_from_toml(tmp_path)
    allowed = tuple(settings.keys["support-bot"].models or ())
    upstreams = upstreams_of(settings)
    assert [t.upstream for t in await upstreams.targets("claude-opus-4-1", "messages", allowed)] == ["anthropic"]
    assert [t.model for t in await upstreams.targets("fast", "chat", allowed)] == ["gpt-4.1-mini"]
    with pytest.raises(GatewayError) as refused:
        await upstreams.targets("gpt-4o", "chat", allowed)
    assert refused.value.code == "model_not_found"
    assert refused.value.message.endswith("the models you may use: claude, fast")
    assert "`the models you may use: claude, fast`" in PAGE


async def test_each_upstream_is_asked_only_for_the_apis_the_page_says(key_variables: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    settings = the_complete_example_from_toml(tmp_path)
    assert {name: entry.served_apis() for name, entry in settings.upstreams.items()} == {
        "openai": ("chat", "responses"), "azure-east": ("chat", "responses"), "azure-west": ("chat", "responses"),
        "anthropic": ("messages",), "local": ("chat", "responses")}
    upstreams = upstreams_of(settings)
    for model, api in (("claude", "chat"), ("local", "messages")):
        with pytest.raises(BadRequest) as refused:
            await upstreams.targets(model, api)
        assert refused.value.code == "api_not_served"
    assert [t.upstream for t in await upstreams.targets("gpt-4o-mini", "responses")] == [
        "azure-east", "azure-west", "openai"]


async def test_deployments_of_one_model_take_its_calls_in_turn(key_variables: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    upstreams = upstreams_of(the_complete_example_from_toml(tmp_path))
    firsts = [(await upstreams.targets("gpt-4o", "chat"))[0].upstream for _ in range(4)]
    assert firsts == ["azure-east", "azure-west", "azure-east", "azure-west"]


def test_serve_prints_the_routing_table_the_page_shows(key_variables: pytest.MonkeyPatch, tmp_path: Path) -> None:
    shown = next(block for block in blocks("text") if "falls back to" in block)
    assert the_complete_example_from_toml(tmp_path).routing_table().describe() == shown.rstrip("\n").split("\n")


def test_a_table_beside_the_one_upstream_leaves_it_the_default(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    beside = [block for block in blocks("toml") if block.startswith("upstream = ")]
    assert len(beside) == 1
    clean_env.setenv("ANTHROPIC_API_KEY", "dummy")
    table = from_toml(tmp_path, beside[0]).routing_table()
    assert list(table.upstreams) == [DEFAULT_NAME, "anthropic"]
    assert table.default == DEFAULT_NAME
    assert table.route("claude-sonnet-4-5") == Route((Target("anthropic", "claude-sonnet-4-5"),), (), "pattern")
    assert table.route("gpt-4.1") == Route((Target(DEFAULT_NAME, "gpt-4.1"),), (), "default")


def test_the_bad_tables_are_refused_in_the_lines_the_page_shows(clean_env: pytest.MonkeyPatch, tmp_path: Path,
                                                                ) -> None:
    shown = [line.removeprefix("toolspan: ") for line in blocks("")[-1].splitlines()]
    assert len(shown) == 3
    clean_env.chdir(tmp_path)
    for line, field in zip(shown, ['url = "contoso-eastus2.openai.azure.com"',
                                   'url = "https://contoso-eastus2.openai.azure.com"\nkind = "azur"',
                                   'url = "https://contoso-eastus2.openai.azure.com"\nmodles = ["gpt-4o"]'],
                           strict=True):
        Path("gw.toml").write_text(f"[upstreams.azure-east]\n{field}\n", encoding="utf-8")
        with pytest.raises(SettingsInvalid) as refused:
            load_settings(config=Path("gw.toml"))
        assert str(refused.value) == line
