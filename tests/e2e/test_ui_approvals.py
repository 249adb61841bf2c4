"""The approvals page (/ui/approvals): a chat request through the openai client waits on a tool
that needs approval, and a reviewer decides it on the page, in the real headless Chromium (approve,
deny) and through aiohttp's client (an Interrupt's output, who may see and decide what). Posts the
page did not make are refused and decide nothing: from another origin, without the form's token,
signed out."""

from __future__ import annotations

import json
import re
from typing import Any

from playwright.async_api import Browser, Page, expect
from pydantic import SecretStr

from gateway.demo.model import Reply
from gateway.settings.parts import GatewayKey
from gateway.tools.approvals import arguments_digest
from gateway.ui.approvals import token_for
from gateway.ui.auth import SESSION_COOKIE, session_token
from tests.conftest import (
    PAID,
    USER,
    Stack,
    StackFactory,
    approval_registry,
    decide,
    first_pending,
    pending,
    until,
    while_asking,
)

PAGE = "/ui/approvals"
HOSTILE = "<img src=x onerror=window.pwned=1>"
AGENT, BOSS, PEER = "sk-agent-01", "sk-boss-001", "sk-peer-001"
KEYS = {"agent": GatewayKey(key=SecretStr(AGENT)), "boss": GatewayKey(key=SecretStr(BOSS), operator=True),
        "peer": GatewayKey(key=SecretStr(PEER), approver=True)}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def session(key: str) -> dict[str, str]:
    """The cookie a browser has once signed in with `key` (ui_auth)."""
    return {SESSION_COOKIE: session_token(key)}


async def _page(browser: Browser, stack: Stack) -> Page:
    page = await (await browser.new_context(viewport={"width": 1400, "height": 900})).new_page()
    shown = await page.goto(f"{stack.url}{PAGE}")
    assert shown is not None
    assert shown.status == 200, await page.content()
    return page


async def _click(page: Page, button: str) -> None:
    """Clicks a decision's button; the post answers with a redirect back to the page."""
    async with page.expect_navigation() as navigation:
        await page.locator("section.approval").get_by_role("button", name=button).click()
    back = await navigation.value
    assert back is not None
    assert back.status == 200
    assert f"{PAGE}?done=" in page.url


async def test_a_reviewer_approves_in_the_browser_and_the_client_gets_its_answer(make_stack: StackFactory,
                                                                                  browser: Browser) -> None:
    stack = await make_stack(registry=approval_registry())
    PAID.clear()
    arguments = {"to": f"ACME {HOSTILE}", "amount": 12.5}
    stack.script.then(Reply(tool_calls=[("pay", arguments)]), Reply(content="Paid."))
    pages: list[Page] = []

    async def reviewer() -> None:
        approval = await first_pending(stack)
        page = await _page(browser, stack)
        pages.append(page)
        card = page.locator("section.approval")
        await expect(card).to_have_count(1)
        await expect(card.locator("code.tool")).to_have_text("pay")
        await expect(card.locator("h2 .tag")).to_have_text("before_run")
        await expect(card.locator("pre.arguments")).to_have_text(json.dumps(arguments, indent=2, ensure_ascii=False))
        assert await card.get_attribute("data-id") == approval["id"]
        link = card.get_by_role("link", name=approval["trajectory_id"])
        assert await link.get_attribute("href") == f"/ui/trajectories/{approval['trajectory_id']}"
        await expect(card.locator("time")).to_have_count(2)  # asked, expires
        assert await card.locator("textarea[name=output]").count() == 0  # an output is an Interrupt's only
        assert PAID == []
        await _click(page, "Approve")

    answer = await while_asking(lambda: stack.ask(False, messages=USER), reviewer)
    assert (answer.content, answer.finish_reason, answer.tool_calls) == ("Paid.", "stop", [])
    assert [arguments] == PAID
    [page] = pages
    await expect(page.locator("p.hint")).to_contain_text("Approved")
    await expect(page.locator("section.approval")).to_have_count(0)
    await expect(page.locator("main")).to_contain_text("No approval is pending.")
    await page.reload()
    await expect(page.locator("main")).to_contain_text("No approval is pending.")
    assert await page.evaluate("window.pwned") is None  # the model's arguments were text, never markup
    assert await pending(stack) == []


async def test_a_reviewer_denies_in_the_browser_with_a_reason(make_stack: StackFactory, browser: Browser) -> None:
    stack = await make_stack(registry=approval_registry(), keepalive_seconds=0.05)
    PAID.clear()
    stack.script.then(Reply(tool_calls=[("pay", {"to": "ACME", "amount": 900})]), Reply(content="I could not pay."))

    async def reviewer() -> None:
        await first_pending(stack)
        page = await _page(browser, stack)
        await page.locator("section.approval").get_by_label("Reason").fill("over the limit")
        await _click(page, "Deny")
        await expect(page.locator("p.hint")).to_contain_text("Denied")

    answer = await while_asking(lambda: stack.ask(True, messages=USER), reviewer)
    assert answer.content == "I could not pay."
    assert PAID == []
    [told] = [m["content"] for m in stack.upstream_requests[-1]["messages"] if m["role"] == "tool"]
    assert told == "denied by the reviewer: over the limit"


# --- without a browser: the form's post as aiohttp sends it -------------------------------------------

def token_on(page: str, approval_id: str) -> str:
    """The token of the form that decides `approval_id`, as the page wrote it."""
    found = re.search(rf'action="{PAGE}/{approval_id}"><input type="hidden" name="token" value="([0-9a-f]{{64}})"',
                      page)
    assert found is not None, page
    return found.group(1)


async def shown(stack: Stack, **request: Any) -> str:
    response = await stack.http.get(PAGE, **request)
    assert response.status == 200, await response.text()
    return await response.text()


async def test_an_interrupts_output_is_given_on_the_page(make_stack: StackFactory) -> None:
    stack = await make_stack(registry=approval_registry())
    stack.script.then(Reply(tool_calls=[("refund", {"order": "A-17"})]), Reply(content="Refunded A-17."))

    async def reviewer() -> None:
        approval = await first_pending(stack)
        page = await shown(stack)
        assert "a manager must confirm the refund" in page
        assert 'name="output"' in page
        assert "&quot;api_key&quot;: &quot;[REDACTED]&quot;" in page  # the data, its secrets masked
        form = {"token": token_on(page, approval["id"]), "decision": "approve", "output": '{"refunded": true}'}
        decided = await stack.http.post(f"{PAGE}/{approval['id']}", data=form, headers={"Origin": stack.url},
                                        allow_redirects=False)
        assert (decided.status, decided.headers["Location"]) == (303, f"{PAGE}?done=approved&id={approval['id']}")

    answer = await while_asking(lambda: stack.ask(False, messages=USER), reviewer)
    assert answer.content == "Refunded A-17."
    assert [m["content"] for m in stack.upstream_requests[-1]["messages"] if m["role"] == "tool"] == [
        '{"refunded": true}']


async def test_posts_the_page_did_not_make_are_refused_and_decide_nothing(make_stack: StackFactory) -> None:
    """Another site's page (refused by the gateway's Origin check; and, with that site in
    allowed_origins, by the page's own), a post without the form's token, with the token of another
    approval, and with a guessed one."""
    stack = await make_stack(registry=approval_registry(), allowed_origins=["https://app.example.com"])
    PAID.clear()
    stack.script.then(Reply(tool_calls=[("pay", {"to": "ACME", "amount": 5})]), Reply(content="Paid."))

    async def attacker() -> None:
        approval = await first_pending(stack)
        path, token = f"{PAGE}/{approval['id']}", token_on(await shown(stack), approval["id"])
        refused = await stack.http.post(path, data={"token": token, "decision": "approve"},
                                        headers={"Origin": "https://evil.example"}, allow_redirects=False)
        assert (refused.status, (await refused.json())["error"]["code"]) == (403, "origin_not_allowed")
        refused = await stack.http.post(path, data={"token": token, "decision": "approve"},
                                        headers={"Origin": "https://app.example.com"}, allow_redirects=False)
        assert refused.status == 403
        assert "only taken from this gateway&#x27;s own page" in await refused.text()
        for forged in ({}, {"token": token_for(b"x" * 32, approval["id"])},
                       {"token": token[:-1] + ("1" if token.endswith("0") else "0")}):
            refused = await stack.http.post(path, data={**forged, "decision": "approve"},
                                            headers={"Origin": stack.url}, allow_redirects=False)
            assert refused.status == 403
            assert "did not come from this gateway&#x27;s page" in await refused.text()
        assert [a["status"] for a in await pending(stack)] == ["pending"]  # nothing was decided
        assert PAID == []
        assert (await decide(stack, approval["id"], decision="deny", reason="test over"))[0] == 200

    answer = await while_asking(lambda: stack.ask(False, messages=USER), attacker)
    assert answer.content == "Paid."  # the scripted model's words; the call itself was denied
    assert PAID == []


async def test_a_token_is_for_one_approval_only(make_stack: StackFactory) -> None:
    """Two calls of one turn wait one after the other: the first's token does not decide the second."""
    stack = await make_stack(registry=approval_registry())
    PAID.clear()
    stack.script.then(Reply(tool_calls=[("pay", {"to": "A", "amount": 1}), ("pay", {"to": "B", "amount": 2})]),
                      Reply(content="Done."))

    async def reviewer() -> None:
        first = await first_pending(stack)
        token = token_on(await shown(stack), first["id"])
        assert (await decide(stack, first["id"], decision="deny"))[0] == 200

        async def next_one() -> list[dict[str, Any]]:
            return [a for a in await pending(stack) if a["id"] != first["id"]]

        [second] = await until(stack, next_one)
        refused = await stack.http.post(f"{PAGE}/{second['id']}", data={"token": token, "decision": "approve"},
                                        allow_redirects=False)
        assert refused.status == 403
        assert [a["id"] for a in await pending(stack)] == [second["id"]]
        assert (await decide(stack, second["id"], decision="deny"))[0] == 200

    await while_asking(lambda: stack.ask(False, messages=USER), reviewer)
    assert PAID == []


async def test_with_keys_a_signed_out_visitor_sees_nothing_and_decides_nothing(make_stack: StackFactory) -> None:
    stack = await make_stack(registry=approval_registry(), keys=KEYS)
    stack.client.api_key = AGENT
    PAID.clear()
    stack.script.then(Reply(tool_calls=[("pay", {"to": "ACME", "amount": 5})]), Reply(content="Paid."))

    async def visitor() -> None:
        approval = await first_pending(stack, bearer(BOSS))
        for cookies in ({}, {SESSION_COOKIE: "0" * 64}):
            page = await stack.http.get(PAGE, cookies=cookies)
            assert page.status == 401
            text = await page.text()
            assert "Gateway key" in text  # the sign-in form, and nothing of the approval
            assert approval["id"] not in text
            assert "ACME" not in text
            token = token_for(session_token(BOSS).encode(), approval["id"])  # even a stolen token
            refused = await stack.http.post(f"{PAGE}/{approval['id']}", data={"token": token, "decision": "approve"},
                                            cookies=cookies, allow_redirects=False)
            assert refused.status == 401
        assert [a["status"] for a in await pending(stack, bearer(BOSS))] == ["pending"]
        assert PAID == []
        assert (await decide(stack, approval["id"], bearer(BOSS), decision="deny"))[0] == 200

    await while_asking(lambda: stack.ask(False, messages=USER), visitor)


async def test_keys_see_their_own_and_only_approvers_decide(make_stack: StackFactory) -> None:
    """The key that asked sees its approval, and a clear refusal in place of the buttons; another
    approver key sees nothing of it; the operator sees every key's, links the trajectory by the
    store's id for it, and decides."""
    stack = await make_stack(registry=approval_registry(), keys=KEYS)
    stack.client.api_key = AGENT
    PAID.clear()
    stack.script.then(Reply(tool_calls=[("pay", {"to": "ACME", "amount": 5})]), Reply(content="Paid."))

    async def reviewers() -> None:
        approval = await first_pending(stack, bearer(AGENT))
        own = await shown(stack, cookies=session(AGENT))
        assert approval["id"] in own
        assert "ACME" in own
        assert "may not decide approvals" in own
        assert "<form class=\"filters decide\"" not in own
        token = token_for(session_token(AGENT).encode(), approval["id"])
        refused = await stack.http.post(f"{PAGE}/{approval['id']}", data={"token": token, "decision": "approve"},
                                        cookies=session(AGENT), headers={"Origin": stack.url}, allow_redirects=False)
        assert refused.status == 403
        assert "may not decide approvals" in await refused.text()
        peer = await shown(stack, cookies=session(PEER))
        assert approval["id"] not in peer
        assert "No approval is pending." in peer
        assert "may not decide" not in peer  # an approver: it would have buttons
        boss = await shown(stack, cookies=session(BOSS))
        assert "gateway key agent" in boss
        assert f'href="/ui/trajectories/agent~{approval["trajectory_id"]}"' in boss
        decided = await stack.http.post(f"{PAGE}/{approval['id']}", cookies=session(BOSS), allow_redirects=False,
                                        data={"token": token_on(boss, approval["id"]), "decision": "approve"})
        assert decided.status == 303
        again = await stack.http.post(f"{PAGE}/{approval['id']}", cookies=session(BOSS), allow_redirects=False,
                                      data={"token": token_on(boss, approval["id"]), "decision": "deny"})
        assert again.headers["Location"] in {f"{PAGE}?missed=approval_decided&id={approval['id']}",
                                             f"{PAGE}?missed=approval_not_found&id={approval['id']}"}
        told = await shown(stack, cookies=session(BOSS), params={"missed": "approval_decided", "id": approval["id"]})
        assert "decided already" in told

    answer = await while_asking(lambda: stack.ask(False, messages=USER), reviewers)
    assert answer.content == "Paid."
    assert PAID == [{"to": "ACME", "amount": 5}]


async def test_the_page_is_in_the_navigation_and_says_only_its_own_notices(stack: Stack) -> None:
    page = await shown(stack, params={"done": f"{HOSTILE}", "missed": "x", "id": HOSTILE})
    assert '<a href="/ui/approvals" aria-current="page">Approvals</a>' in page
    assert HOSTILE not in page
    assert "onerror" not in page
    assert "No approval is pending." in page
    report = await stack.http.get("/ui")
    assert '<a href="/ui/approvals">Approvals</a>' in await report.text()


async def test_the_page_shows_the_arguments_digest_and_its_form_decides_only_those_arguments(
        make_stack: StackFactory) -> None:
    """The form posts the digest the page showed; a post naming other arguments decides nothing and
    comes back with a notice, and a value that is no digest is refused."""
    stack = await make_stack(registry=approval_registry())
    PAID.clear()
    stack.script.then(Reply(tool_calls=[("pay", {"to": "ACME", "amount": 8})]), Reply(content="Paid."))

    async def reviewer() -> None:
        approval = await first_pending(stack)
        digest = arguments_digest("pay", {"to": "ACME", "amount": 8})
        page = await shown(stack)
        assert f'<code class="digest">{digest}</code>' in page
        assert f'<input type="hidden" name="arguments_sha256" value="{digest}">' in page
        path, token = f"{PAGE}/{approval['id']}", token_on(page, approval["id"])
        other = arguments_digest("pay", {"to": "ACME", "amount": 800})
        moved = await stack.http.post(path, data={"token": token, "decision": "approve", "arguments_sha256": other},
                                      headers={"Origin": stack.url}, allow_redirects=False)
        assert (moved.status, moved.headers["Location"]) == (
            303, f"{PAGE}?missed=arguments_changed&id={approval['id']}")
        assert "other arguments than the ones you decided on" in await shown(
            stack, params={"missed": "arguments_changed", "id": approval["id"]})
        refused = await stack.http.post(path, data={"token": token, "decision": "approve", "arguments_sha256": "x1"},
                                        headers={"Origin": stack.url}, allow_redirects=False)
        assert refused.status == 400
        assert "not a SHA-256" in await refused.text()
        assert [a["status"] for a in await pending(stack)] == ["pending"]
        assert PAID == []
        decided = await stack.http.post(path, data={"token": token, "decision": "approve", "arguments_sha256": digest},
                                        headers={"Origin": stack.url}, allow_redirects=False)
        assert (decided.status, decided.headers["Location"]) == (303, f"{PAGE}?done=approved&id={approval['id']}")

    answer = await while_asking(lambda: stack.ask(False, messages=USER), reviewer)
    assert answer.content == "Paid."
    assert PAID == [{"to": "ACME", "amount": 8}]
