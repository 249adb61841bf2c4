"""Chains of guardrails (gateway.guardrails.chain) and which guardrails apply where
(gateway.guardrails.catalog): the order, what a rewrite and a mask hand on, what a deny and a block
end, where sync and async guardrails run, timeouts and the failure rule, answers of the wrong type,
each guardrail once in a chain, names resolved at start-up, and nothing made when none is named."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.guardrails import (
    Chains,
    GuardedCall,
    Guardrail,
    Guardrails,
    Verdict,
    allow,
    ask,
    block,
    deny,
    flag,
    mask,
    rewrite,
)
from gateway.guardrails.chain import INLINE_MAX_CHARS, Guard, guard_of
from gateway.settings.model import Settings
from gateway.tools import Tool, ToolRegistry
from gateway.tools.results import ToolOrigin

CALL = GuardedCall("deploy", "call_1", {"host": "a.example.com"})
AWS_KEY = "AKIA" + "Q7RZ2M4XW9KD3HPL"


class Seen:
    """What each guardrail of a test saw, in the order they ran."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def before(self, name: str, answer: Verdict | None = None) -> Guard:
        def check(call: GuardedCall) -> Verdict | None:
            self.calls.append((name, dict(call.arguments)))
            return answer
        return Guard(name, check, None)

    def after(self, name: str, answer: Verdict | None = None) -> Guard:
        def check(call: GuardedCall, result: str) -> Verdict | None:
            self.calls.append((name, result))
            return answer
        return Guard(name, None, check)


@pytest.fixture(autouse=True)
def _settings_of_the_test_only(clean_env: pytest.MonkeyPatch) -> None:
    """No TOOLSPAN_* variable of the machine reaches the Settings made here."""


@pytest.fixture
def chains() -> Iterator[Chains]:
    made = Chains(timeout=5.0)
    yield made
    made.close()


# --- order, and what a chain hands on ----------------------------------------------------------------------

async def test_guardrails_run_in_order_and_each_decision_is_recorded(chains: Chains) -> None:
    seen = Seen()
    before = await chains.before([seen.before("one"), seen.before("two", flag("noted")), seen.before("three")], CALL)
    assert [name for name, _ in seen.calls] == ["one", "two", "three"]
    assert (before.decision, before.arguments, before.message) == ("allow", None, None)
    assert [(r.guardrail, r.moment, r.decision, r.reason) for r in before.records] == [
        ("one", "before", "allow", None), ("two", "before", "flag", "noted"), ("three", "before", "allow", None)]


async def test_a_rewrite_is_handed_to_the_next_guardrail_and_to_the_call(chains: Chains) -> None:
    seen = Seen()
    chain = [seen.before("staging", rewrite({"host": "b.example.com"})), seen.before("next")]
    before = await chains.before(chain, CALL)
    assert seen.calls == [("staging", {"host": "a.example.com"}), ("next", {"host": "b.example.com"})]
    assert (before.decision, before.arguments) == ("allow", {"host": "b.example.com"})


async def test_a_deny_ends_the_chain_with_words_the_model_can_act_on(chains: Chains) -> None:
    seen = Seen()
    chain = [seen.before("hosts", deny("a.example.com is production", hidden=(AWS_KEY,))), seen.before("later")]
    before = await chains.before(chain, CALL)
    assert [name for name, _ in seen.calls] == ["hosts"]  # the rest never ran
    assert before.decision == "deny"
    assert before.message == ("Tool 'deploy' was not run: guardrail 'hosts' denied the call. a.example.com is "
                              "production. Change the arguments and call 'deploy' again, or go on without it.")
    assert [r.decision for r in before.records] == ["deny"]
    assert before.hidden == (AWS_KEY,)


async def test_an_ask_waits_for_the_whole_chain_and_tells_the_reviewer_who_asked_and_why(chains: Chains) -> None:
    seen = Seen()
    chain = [seen.before("ask_first", ask("production needs a person")), seen.before("ask_too", ask("me too")),
             seen.before("rewrites", rewrite({"host": "c.example.com"}))]
    before = await chains.before(chain, CALL)
    assert [name for name, _ in seen.calls] == ["ask_first", "ask_too", "rewrites"]
    assert (before.decision, before.arguments) == ("ask", {"host": "c.example.com"})
    assert before.message == "Guardrail 'ask_first' asks for a reviewer: production needs a person."
    unexplained = await chains.before([seen.before("terse", ask())], CALL)
    assert unexplained.message == "Guardrail 'terse' asks for a reviewer."


async def test_a_deny_after_an_ask_denies(chains: Chains) -> None:
    seen = Seen()
    before = await chains.before([seen.before("asks", ask("why not")), seen.before("denies", deny("no"))], CALL)
    assert before.decision == "deny"


async def test_a_mask_is_handed_to_the_next_guardrail_and_to_the_model(chains: Chains) -> None:
    seen = Seen()
    chain = [seen.after("first", mask("masked once")), seen.after("second", mask("masked twice")),
             seen.after("third")]
    after = await chains.after(chain, CALL, "the result")
    assert seen.calls == [("first", "the result"), ("second", "masked once"), ("third", "masked twice")]
    assert (after.decision, after.result) == ("mask", "masked twice")


async def test_a_block_ends_the_chain_and_says_why(chains: Chains) -> None:
    seen = Seen()
    chain = [seen.after("masks", mask("masked")), seen.after("blocks", block("it holds instructions")),
             seen.after("later")]
    after = await chains.after(chain, CALL, "the result")
    assert [name for name, _ in seen.calls] == ["masks", "blocks"]
    assert (after.decision, after.result) == ("block", None)
    assert after.message == "The result of tool 'deploy' was withheld by guardrail 'blocks'. it holds instructions."
    assert [r.decision for r in after.records] == ["mask", "block"]


async def test_a_guardrail_with_nothing_to_say_at_a_moment_is_not_run_then(chains: Chains) -> None:
    class OnlyAfter(Guardrail):
        def after_execute(self, call: GuardedCall, result: str) -> Verdict:
            return mask(result.upper())

    guard = guard_of(OnlyAfter(), "only_after")
    assert (guard.name, guard.before) == ("only_after", None)
    assert (await chains.before([guard], CALL)).records == ()
    assert (await chains.after([guard], CALL, "quiet")).result == "QUIET"


# --- where guardrails run ----------------------------------------------------------------------------------

async def test_a_sync_guardrail_runs_on_a_thread_and_the_event_loop_goes_on(chains: Chains) -> None:
    """The guardrail waits for an event that only the event loop sets: on the loop's own thread it
    would wait in vain."""
    released = threading.Event()
    threads: list[int] = []

    def waits(call: GuardedCall) -> Verdict:
        threads.append(threading.get_ident())
        return allow() if released.wait(4) else deny("the event loop was blocked")

    async def release() -> None:
        released.set()

    before, _ = await asyncio.gather(chains.before([Guard("waits", waits, None)], CALL), release())
    assert before.decision == "allow", before.message
    assert threads != [threading.get_ident()]


async def test_an_async_guardrail_runs_on_the_event_loop(chains: Chains) -> None:
    threads: list[int] = []

    class Remote(Guardrail):
        async def before_execute(self, call: GuardedCall) -> Verdict:
            await asyncio.sleep(0)
            threads.append(threading.get_ident())
            return deny("the policy service said no")

    before = await chains.before([guard_of(Remote(), "remote")], CALL)
    assert before.decision == "deny"
    assert threads == [threading.get_ident()]


async def test_a_built_in_reads_a_short_text_on_the_loop_and_a_long_one_on_a_thread(chains: Chains) -> None:
    threads: list[int] = []

    def reads(call: GuardedCall, result: str) -> None:
        threads.append(threading.get_ident())

    inline = Guard("inline", None, reads, inline=True)
    await chains.after([inline], CALL, "short")
    await chains.after([inline], CALL, "x" * (INLINE_MAX_CHARS + 1))
    assert threads[0] == threading.get_ident()
    assert threads[1] != threading.get_ident()


# --- failures: timeouts, raises, wrong answers --------------------------------------------------------------

def stalls_async() -> Guard:
    async def stalls(call: GuardedCall) -> None:
        await asyncio.Event().wait()
    return Guard("stalls", stalls, None)


async def test_an_async_guardrail_that_stalls_times_out_and_the_rule_denies() -> None:
    chains = Chains(timeout=0.05, failure="deny")
    before = await chains.before([stalls_async()], CALL)
    assert before.decision == "deny"
    assert before.message == ("Tool 'deploy' was not run: guardrail 'stalls' could not check the call, and a call "
                              "it cannot check is denied. Try again, or go on without it.")
    [record] = before.records
    assert (record.decision, record.failed, record.reason) == (
        "deny", "timeout", "the guardrail timed out after 0.05 s; guardrail_failure is deny")


async def test_a_sync_guardrail_that_stalls_times_out_without_holding_the_loop() -> None:
    chains = Chains(timeout=0.05, failure="allow")
    released = threading.Event()

    def stalls(call: GuardedCall) -> None:
        released.wait(30)

    try:
        before = await chains.before([Guard("stalls", stalls, None)], CALL)
    finally:
        released.set()  # its thread cannot be stopped: let it end
        chains.close()
    assert before.decision == "allow"
    [record] = before.records
    assert (record.decision, record.failed) == ("allow", "timeout")


@pytest.mark.parametrize(("failure", "moment", "decision"), [
    ("deny", "before", "deny"), ("deny", "after", "block"), ("allow", "before", "allow"), ("allow", "after", "allow")])
async def test_a_guardrail_that_raises_gets_the_failure_rules_decision(failure: str, moment: str,
                                                                      decision: str) -> None:
    def raises(*args: Any) -> None:
        raise ConnectionError("the policy service is down")

    chains = Chains(timeout=1.0, failure=failure)  # type: ignore[arg-type]
    guard = Guard("policy", raises, None) if moment == "before" else Guard("policy", None, raises)
    try:
        answer = await (chains.before([guard], CALL) if moment == "before" else chains.after([guard], CALL, "text"))
    finally:
        chains.close()
    assert answer.decision == decision
    [record] = answer.records
    assert (record.decision, record.failed) == (decision, "ConnectionError")
    assert record.reason == f"the guardrail raised ConnectionError; guardrail_failure is {failure}"
    if decision == "block":
        assert answer.message == ("The result of tool 'deploy' was withheld: guardrail 'policy' could not check it, "
                                  "and a result it cannot check is withheld.")


async def test_a_guardrails_own_timeout_error_is_an_error_not_the_chains_timeout(chains: Chains) -> None:
    """A guardrail whose own client timed out raised at once: it is not said to have run out of time."""
    def gives_up(call: GuardedCall) -> None:
        raise TimeoutError("the policy service did not answer")

    [record] = (await chains.before([Guard("impatient", gives_up, None)], CALL)).records
    assert (record.failed, record.reason) == ("TimeoutError",
                                              "the guardrail raised TimeoutError; guardrail_failure is deny")


@pytest.mark.parametrize("answer", ["allow", {"decision": "allow"}, block("a block is for results"),
                                    Verdict("rewrite"), Verdict("mask")],
                         ids=["a-string", "a-dict", "block-before", "rewrite-without-arguments", "mask-before"])
async def test_a_wrong_answer_before_the_call_is_a_failure(chains: Chains, answer: object) -> None:
    before = await chains.before([Guard("odd", lambda call: answer, None)], CALL)
    assert before.decision == "deny"
    assert before.records[0].failed == "TypeError"


@pytest.mark.parametrize("answer", [deny("a deny is for calls"), Verdict("mask"), 42],
                         ids=["deny-after", "mask-without-text", "a-number"])
async def test_a_wrong_answer_on_a_result_is_a_failure(chains: Chains, answer: object) -> None:
    after = await chains.after([Guard("odd", None, lambda call, result: answer)], CALL, "text")
    assert after.decision == "block"
    assert after.records[0].failed == "TypeError"


async def test_hidden_values_are_kept_whole_and_empty_ones_dropped(chains: Chains) -> None:
    """A guardrail that hands one value as `hidden` rather than a tuple of them hides that value,
    not each of its characters; an empty value (nothing to hide, but it is in every text) is dropped."""
    one = Verdict("deny", "a credential", hidden=AWS_KEY)  # type: ignore[arg-type]
    before = await chains.before([Guard("one", lambda call: one, None)], CALL)
    assert before.hidden == (AWS_KEY,)
    several = mask("masked", hidden=(AWS_KEY, ""))
    after = await chains.after([Guard("several", None, lambda call, result: several)], CALL, "text")
    assert after.hidden == (AWS_KEY,)
    wrong = Verdict("deny", "a credential", hidden=(AWS_KEY, 42))  # type: ignore[arg-type]
    failed = await chains.before([Guard("wrong", lambda call: wrong, None)], CALL)
    assert failed.records[0].failed == "TypeError"


# --- which guardrails apply: the catalog ----------------------------------------------------------------------

def body(args: dict[str, Any]) -> str:
    return "ok"


def guardrails(settings: Settings, *tools: Tool) -> Guardrails:
    made = Guardrails.from_settings(settings, ToolRegistry(tools))
    assert made is not None
    return made


def names(chain: tuple[Guard, ...]) -> list[str]:
    return [guard.name for guard in chain]


class Named(Guardrail):
    def __init__(self, name: str) -> None:
        self.name = name

    def before_execute(self, call: GuardedCall) -> None:
        return None


def test_with_no_guardrail_named_anywhere_there_is_nothing() -> None:
    registry = ToolRegistry([Tool(name="plain", function=body)])
    assert Guardrails.from_settings(Settings(), registry) is None
    assert Guardrails.from_settings(Settings(keys={"alice": {"key": "sk-alice-0001"}},
                                             mcp_servers={"fs": {"url": "http://127.0.0.1:9/mcp"}}), registry) is None


@pytest.mark.parametrize("where", [
    {"guardrails": ["secrets"]}, {"tool_guardrails": {"fs__*": ["secrets"]}},
    {"keys": {"alice": {"key": "sk-alice-0001", "guardrails": ["secrets"]}}},
    {"mcp_servers": {"fs": {"url": "http://127.0.0.1:9/mcp", "guardrails": ["secrets"]}}}],
    ids=["gateway", "tool-glob", "key", "mcp-server"])
def test_a_guardrail_named_in_any_one_place_makes_them(where: dict[str, Any]) -> None:
    assert Guardrails.from_settings(Settings(**where), ToolRegistry([Tool(name="plain", function=body)])) is not None


def test_a_guardrail_declared_on_a_tool_or_a_registry_makes_them() -> None:
    assert Guardrails.from_settings(Settings(), ToolRegistry([Tool(name="t", function=body,
                                                                   guardrails=["secrets"])])) is not None
    assert Guardrails.from_settings(Settings(), ToolRegistry([Tool(name="t", function=body)],
                                                             guardrails=["secrets"])) is not None


def test_a_chain_goes_gateway_tool_server_glob_key_and_names_each_guardrail_once() -> None:
    settings = Settings(guardrails=["secrets", "tests.e2e.guards:no_prod_hosts"],
                        tool_guardrails={"fs__*": ["tests.e2e.guards:StagingInstead", "secrets"]},
                        keys={"alice": {"key": "sk-alice-0001", "guardrails": ["tests.e2e.guards:AskForProd",
                                                                               "tests.e2e.guards:StagingInstead"]}},
                        mcp_servers={"fs": {"url": "http://127.0.0.1:9/mcp",
                                            "guardrails": ["tests.e2e.guards:Raises"]}})
    mcp_tool = Tool(name="fs__read", function=body, guardrails=[Named("own"), "tests.e2e.guards:no_prod_hosts"],
                    origin=ToolOrigin("mcp", "fs", "tools/call", "read", "pipe"))
    made = guardrails(settings, mcp_tool)
    assert names(made.for_tool(mcp_tool, "alice")) == [
        "secrets", "no_prod_hosts", "own", "raises", "staging_instead", "ask_for_prod"]
    assert names(made.for_tool(mcp_tool, None)) == ["secrets", "no_prod_hosts", "own", "raises", "staging_instead"]
    other = Tool(name="other", function=body)
    assert names(made.for_tool(other, "bob")) == ["secrets", "no_prod_hosts"]  # no key, no glob, no server
    assert names(made.for_client("alice")) == ["secrets", "no_prod_hosts", "ask_for_prod", "staging_instead"]


def test_a_name_is_resolved_once_however_many_lists_name_it() -> None:
    settings = Settings(guardrails=["tests.e2e.guards:Raises"],
                        keys={"alice": {"key": "sk-alice-0001", "guardrails": ["tests.e2e.guards:Raises"]}})
    made = guardrails(settings)
    [gateway_guard] = made.for_client(None)
    [alice_guard] = made.for_client("alice")
    assert gateway_guard is alice_guard


@pytest.mark.parametrize(("name", "said"), [
    ("nope", "guardrail 'nope': no such built-in (there are secrets, "),
    ("nosuch_guards_module:x", "guardrail 'nosuch_guards_module:x': cannot import 'nosuch_guards_module'"),
    ("tests.e2e.guards:missing", "guardrail 'tests.e2e.guards:missing': module 'tests.e2e.guards' has no "
                                 "attribute 'missing'"),
    ("tests.e2e.guards:AWS_KEY", "guardrail 'tests.e2e.guards:AWS_KEY': str has neither before_execute nor "
                                 "after_execute"),
    ("tests.e2e.guards:deploy_registry", "guardrail 'tests.e2e.guards:deploy_registry': calling deploy_registry "
                                         "failed"),
    (":x", "guardrail ':x': expected a built-in")])
def test_a_name_that_cannot_be_resolved_is_refused_when_made(name: str, said: str) -> None:
    with pytest.raises(ValueError, match=r"^guardrail ") as refused:
        Guardrails.from_settings(Settings(guardrails=[name]), ToolRegistry())
    assert str(refused.value).startswith(said)


def test_a_tools_own_unknown_guardrail_is_refused_at_start_up_not_at_its_first_call() -> None:
    with pytest.raises(ValueError, match="guardrail 'secret': no such built-in"):
        Guardrails.from_settings(Settings(), ToolRegistry([Tool(name="t", function=body, guardrails=["secret"])]))


def test_a_guardrail_module_that_fails_at_import_is_refused_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "failing_guards_59.py").write_text('import os\n\nPOLICY_URL = os.environ["POLICY_URL_59"]\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "failing_guards_59", raising=False)
    with pytest.raises(ValueError, match="failing_guards_59") as refused:
        Guardrails.from_settings(Settings(guardrails=["failing_guards_59:x"]), ToolRegistry())
    assert str(refused.value) == (f"guardrail 'failing_guards_59:x': importing 'failing_guards_59' failed: KeyError: "
                                  f"'POLICY_URL_59' (at {tmp_path / 'failing_guards_59.py'}, line 3)")
