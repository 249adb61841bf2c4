"""/mcp sessions are bounded per gateway key as well as in all, and end when idle: a key that holds
as many sessions as it may is refused another (429, OpenAI-shaped, with Retry-After) while its own
sessions still answer and other keys open theirs; the SDK's bound on all sessions still holds.
Raw initialize requests open sessions (each one is a session, as a client that never ends its
sessions would leave them); the official `mcp` client is the other key's."""

from __future__ import annotations

import asyncio
import logging
import re
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator

import pytest
from aiohttp import ClientResponse

from gateway.settings.model import Settings
from tests.conftest import Gateway, GatewayFactory
from tests.e2e.test_mcp_server import (
    ADMIN_KEY,
    INITIALIZE,
    KEYS,
    MCP_HEADERS,
    READER_KEY,
    STATELESS,
    mcp_client,
    registry,
)

NOWHERE = "http://127.0.0.1:9/v1"  # no provider: nothing here asks a model
PER_KEY_DEFAULT = 100  # mcp_max_sessions_per_key's default, as docs/limits-and-tenancy.md gives it
IDLE_DEFAULT = 900  # mcp_session_idle_seconds's default
LISTING = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}


async def open_session(gateway: Gateway, key: str | None) -> ClientResponse:
    auth = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return await gateway.http.post("/mcp", json=INITIALIZE, headers={**MCP_HEADERS, **auth})


def in_session(key: str, session: str) -> dict[str, str]:
    return {**MCP_HEADERS, "Authorization": f"Bearer {key}", "Mcp-Session-Id": session,
            "Mcp-Protocol-Version": "2025-06-18"}


async def listing_status(gateway: Gateway, key: str, session: str) -> int:
    return (await gateway.http.post("/mcp", json=LISTING, headers=in_session(key, session))).status


async def opened(gateway: Gateway, key: str) -> str:
    response = await open_session(gateway, key)
    assert response.status == 200, await response.text()
    return response.headers["Mcp-Session-Id"]


async def assert_refused(response: ClientResponse, longest_wait: float) -> None:
    """The per-key refusal: a 429 in OpenAI's shape, saying when to try again."""
    assert response.status == 429, await response.text()
    error = (await response.json())["error"]
    assert (error["type"], error["code"], error["param"]) == ("rate_limit_error", "too_many_sessions", None)
    assert "mcp_max_sessions_per_key" in error["message"]
    assert 1 <= int(response.headers["Retry-After"]) <= longest_wait


@pytest.fixture
def idle_ends(caplog: pytest.LogCaptureFixture) -> Iterator[Callable[[str], Awaitable[None]]]:
    """`await idle_ends(session)` returns once the SDK has ended `session` for being idle (it logs
    each such end, at info)."""
    logger = logging.getLogger("mcp.server.streamable_http_manager")
    ended: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)

    class Ends(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if found := re.fullmatch(r"Session (\S+) idle timeout", record.getMessage()):
                ended[found[1]].set()

    caplog.set_level(logging.INFO, logger=logger.name)
    handler = Ends()
    logger.addHandler(handler)

    async def wait(session: str) -> None:
        await asyncio.wait_for(ended[session].wait(), timeout=10)

    yield wait
    logger.removeHandler(handler)


async def test_a_key_at_its_bound_is_refused_while_its_sessions_answer_and_another_key_opens_one(
        make_gateway: GatewayFactory) -> None:
    """With the defaults: the restricted key opens its 100 sessions and no more."""
    gateway = await make_gateway(Settings(port=0, upstream=NOWHERE, keys=KEYS), registry())
    sessions = [await opened(gateway, READER_KEY) for _ in range(PER_KEY_DEFAULT)]
    await assert_refused(await open_session(gateway, READER_KEY), IDLE_DEFAULT)

    async with mcp_client(gateway, ADMIN_KEY) as (client, seen):  # the other key, unaffected
        assert [t.name for t in (await client.list_tools()).tools] == registry().names()
    assert seen.header("mcp-session-id")
    assert [await listing_status(gateway, READER_KEY, s) for s in (sessions[0], sessions[-1])] == [200, 200]
    await assert_refused(await open_session(gateway, READER_KEY), IDLE_DEFAULT)  # still at its bound


async def test_ending_a_session_frees_its_place(make_gateway: GatewayFactory) -> None:
    gateway = await make_gateway(Settings(port=0, upstream=NOWHERE, keys=KEYS, mcp_max_sessions_per_key=2),
                                 registry())
    first, second = [await opened(gateway, READER_KEY) for _ in range(2)]
    await assert_refused(await open_session(gateway, READER_KEY), IDLE_DEFAULT)
    # The 2026 revision has no sessions: a key at its bound still speaks it.
    async with mcp_client(gateway, READER_KEY, mode=STATELESS) as (client, _):
        assert (await client.call_tool("add", {"a": 1, "b": 2})).content

    ended = await gateway.http.delete("/mcp", headers=in_session(READER_KEY, first))
    assert ended.status == 200
    assert await listing_status(gateway, READER_KEY, first) == 404
    third = await opened(gateway, READER_KEY)
    await assert_refused(await open_session(gateway, READER_KEY), IDLE_DEFAULT)
    assert [await listing_status(gateway, READER_KEY, s) for s in (second, third)] == [200, 200]


async def test_sessions_opened_at_once_cannot_pass_the_bound(make_gateway: GatewayFactory) -> None:
    gateway = await make_gateway(Settings(port=0, upstream=NOWHERE, keys=KEYS, mcp_max_sessions_per_key=3),
                                 registry())
    answers = await asyncio.gather(*(open_session(gateway, READER_KEY) for _ in range(10)))
    assert sorted(r.status for r in answers) == [200] * 3 + [429] * 7


async def test_another_keys_session_id_neither_counts_nor_frees(make_gateway: GatewayFactory) -> None:
    """A key that sends (or ends) a session id of another key's gets the SDK's 404, and the count
    of neither key moves."""
    gateway = await make_gateway(Settings(port=0, upstream=NOWHERE, keys=KEYS, mcp_max_sessions_per_key=1),
                                 registry())
    readers = await opened(gateway, READER_KEY)
    admins = await opened(gateway, ADMIN_KEY)
    foreign = await gateway.http.delete("/mcp", headers=in_session(ADMIN_KEY, readers))
    assert foreign.status == 404
    assert await listing_status(gateway, READER_KEY, readers) == 200
    await assert_refused(await open_session(gateway, READER_KEY), IDLE_DEFAULT)
    await assert_refused(await open_session(gateway, ADMIN_KEY), IDLE_DEFAULT)
    assert await listing_status(gateway, ADMIN_KEY, admins) == 200


async def test_an_idle_session_ends_and_frees_its_place(make_gateway: GatewayFactory,
                                                        idle_ends: Callable[[str], Awaitable[None]]) -> None:
    gateway = await make_gateway(Settings(port=0, upstream=NOWHERE, keys=KEYS, mcp_max_sessions_per_key=1,
                                          mcp_session_idle_seconds=0.2), registry())
    idle = await opened(gateway, READER_KEY)
    await assert_refused(await open_session(gateway, READER_KEY), 1)
    await idle_ends(idle)
    fresh = await opened(gateway, READER_KEY)  # the ended session counts no more
    assert await listing_status(gateway, READER_KEY, idle) == 404
    assert await listing_status(gateway, READER_KEY, fresh) == 200


async def test_the_bound_on_all_sessions_holds_for_every_key(make_gateway: GatewayFactory) -> None:
    gateway = await make_gateway(Settings(port=0, upstream=NOWHERE, keys=KEYS, mcp_max_sessions=2,
                                          mcp_max_sessions_per_key=2), registry())
    await opened(gateway, READER_KEY)
    admins = await opened(gateway, ADMIN_KEY)
    refused = await open_session(gateway, READER_KEY)  # under its own bound, but none are left
    assert refused.status == 503  # the SDK's refusal
    assert (await gateway.http.delete("/mcp", headers=in_session(ADMIN_KEY, admins))).status == 200
    await opened(gateway, READER_KEY)  # the refused attempt kept no place of the reader's
    await assert_refused(await open_session(gateway, READER_KEY), IDLE_DEFAULT)


async def test_a_key_within_its_fair_share_is_never_refused_for_another_keys_sessions(
        make_gateway: GatewayFactory) -> None:
    """Issue 53: every session taken (4), each key's bound at its default (100, above it), the
    admin holding all four: the reader's session ends the admin's least recently used, then again
    while the admin holds the most; past its fair share the reader is refused (the SDK's 503)."""
    gateway = await make_gateway(Settings(port=0, upstream=NOWHERE, keys=KEYS, mcp_max_sessions=4), registry())
    admins = [await opened(gateway, ADMIN_KEY) for _ in range(4)]
    readers = [await opened(gateway, READER_KEY)]
    assert [await listing_status(gateway, ADMIN_KEY, s) for s in admins] == [404, 200, 200, 200]
    readers.append(await opened(gateway, READER_KEY))  # admin 3, reader 2 with it: the admin's oldest goes
    assert [await listing_status(gateway, ADMIN_KEY, s) for s in admins] == [404, 404, 200, 200]
    assert (await open_session(gateway, READER_KEY)).status == 503  # reader 3, admin 2: the reader's own
    assert (await open_session(gateway, ADMIN_KEY)).status == 503  # admin 3 with it, reader 2: the admin's own
    assert [await listing_status(gateway, READER_KEY, s) for s in readers] == [200, 200]
    assert [await listing_status(gateway, ADMIN_KEY, s) for s in admins[2:]] == [200, 200]


async def test_without_keys_only_the_bound_on_all_sessions_applies(make_gateway: GatewayFactory) -> None:
    gateway = await make_gateway(Settings(port=0, upstream=NOWHERE, mcp_max_sessions=3, mcp_max_sessions_per_key=1),
                                 registry())
    answers = [await open_session(gateway, None) for _ in range(4)]
    assert [r.status for r in answers] == [200, 200, 200, 503]
