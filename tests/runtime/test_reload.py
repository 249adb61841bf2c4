"""The limits read again without a restart (gateway.runtime.reload, what SIGHUP does in `toolspan
serve`): the settings file's new limits apply to the next request, what the keys used stays
counted, what changed is logged, and a file with a mistake keeps the limits as they were."""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import openai
import pytest

from gateway.demo.model import Reply
from gateway.http.keys import LOOP
from gateway.runtime.reload import LimitsReload, reload_limits
from gateway.settings.load import load_settings
from gateway.settings.model import Settings
from tests.conftest import TEST_KEY, USER, Stack, StackFactory

KEYS = {"alice": {"key": TEST_KEY, "requests_per_minute": 3}}


def settings_file(path: Path, alice: str, more: str = "") -> Path:
    path.write_text(f'{more}\n[keys.alice]\nkey = "{TEST_KEY}"\n{alice}\n', encoding="utf-8")
    return path


def reload(stack: Stack, path: Path) -> None:
    reload_limits(stack.http.server.app, functools.partial(load_settings, {}, path))


@pytest.fixture
def logged(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="toolspan")
    return caplog


async def test_a_lower_limit_refuses_the_next_request_and_what_was_used_stays(
        make_stack: StackFactory, tmp_path: Path, logged: pytest.LogCaptureFixture) -> None:
    stack = await make_stack(keys=KEYS, default_limits={"max_concurrent_requests": 5})
    stack.script.then(Reply(content="one"), Reply(content="two"))
    await stack.ask(False, messages=USER)
    await stack.ask(False, messages=USER)  # 2 of 3
    path = settings_file(tmp_path / "toolspan.toml", "requests_per_minute = 2",
                         '[default_limits]\nmax_concurrent_requests = 5\ntokens_per_day = 100\n'
                         '[prices."gpt-*"]\ninput = 1.0\noutput = 2.0')
    reload(stack, path)
    with pytest.raises(openai.RateLimitError) as refused:  # 2 of 2: the count kept, under the new bound
        await stack.ask(False, messages=USER)
    assert "requests_per_minute (2 of 2 used)" in refused.value.message
    [said] = [r.getMessage() for r in logged.records if r.getMessage().startswith("SIGHUP")]
    assert said == ("SIGHUP: limits read again: default_limits: tokens_per_day unset -> 100; key alice: "
                    "requests_per_minute 3 -> 2, tokens_per_day unset -> 100; prices: added gpt-*")


async def test_a_file_with_a_mistake_keeps_the_limits_as_they_were(
        make_stack: StackFactory, tmp_path: Path, logged: pytest.LogCaptureFixture) -> None:
    stack = await make_stack(keys=KEYS)
    before = stack.http.server.app[LOOP].limiter
    assert before is not None
    limits = before.resolved()
    path = settings_file(tmp_path / "toolspan.toml", "requests_per_minute = 0")
    reload(stack, path)
    assert before.resolved() == limits
    [record] = [r for r in logged.records if r.getMessage().startswith("SIGHUP")]
    assert record.levelno == logging.ERROR
    assert record.getMessage().startswith("SIGHUP: the settings could not be read again, so the limits stay as "
                                          "they were: ")
    assert "requests_per_minute" in record.getMessage()
    (tmp_path / "broken.toml").write_text("[keys.alice\n", encoding="utf-8")
    reload(stack, tmp_path / "broken.toml")
    reload(stack, tmp_path / "gone.toml")
    errors = [r.getMessage() for r in logged.records if r.levelno == logging.ERROR]
    assert len(errors) == 3
    assert "not valid TOML" in errors[1]
    assert "does not exist" in errors[2]
    assert before.resolved() == limits


async def test_limits_set_only_now_wait_for_a_restart(make_stack: StackFactory, tmp_path: Path,
                                                      logged: pytest.LogCaptureFixture) -> None:
    stack = await make_stack(keys={"alice": {"key": TEST_KEY}})
    reload(stack, settings_file(tmp_path / "toolspan.toml", "requests_per_minute = 1",
                                '[keys.bob]\nkey = "sk-bob-000001"'))
    said = [r.getMessage() for r in logged.records if r.levelno == logging.WARNING]
    assert said == ["SIGHUP: gateway keys added or removed (bob) take effect at a restart only; the keys that were "
                    "there at start keep working",
                    "SIGHUP: the settings set limits now, but none was set at start: a gateway started without "
                    "limits enforces none until it is restarted"]
    stack.script.then(Reply(content="one"), Reply(content="two"))
    await stack.ask(False, messages=USER)
    await stack.ask(False, messages=USER)


async def test_a_sighup_while_starting_reloads_nothing(logged: pytest.LogCaptureFixture) -> None:
    def load() -> Settings:
        raise AssertionError("not read while starting")

    LimitsReload(load)()
    assert [r.getMessage() for r in logged.records] == [
        "SIGHUP while starting: the settings being used are the ones just read; nothing reloaded"]
