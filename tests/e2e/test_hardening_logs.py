"""Trust boundaries, logs and credentials (issue 31, items 6 and 8): a caller's path and a
provider's error text cannot write a log line of their own, credentials in a query string never
reach the access log, and the caller's own credentials stay behind when the gateway calls the
provider with its own key or keeps keys of its own."""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest
from pytest_aiohttp import AiohttpServer
from yarl import URL

from gateway.demo.model import Reply
from gateway.runtime.logs import ACCESS_LOGGER
from gateway.runtime.process import gateway
from gateway.settings.model import REDACT_KEYS, Settings
from tests.conftest import TEST_KEY, USER, GatewayFactory, Script, StackFactory, installed_formatter, log_lines
from tests.e2e.test_hardening_server import Provider

FORMATS = pytest.mark.parametrize("log_format", ["text", "json"])
# What must never reach a log line as it is: the C0 controls, DEL, C1, the line and paragraph
# separators and the bidirectional controls.
UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
FAKE_LINE = "2030-01-01 00:00:00,000 INFO toolspan.access: all is well"
REDACT_TENANT = (*REDACT_KEYS, "tenant")  # an operator's own addition to the redact list


@contextlib.asynccontextmanager
async def served(script: Script, **settings: Any) -> AsyncIterator[str]:
    """The whole gateway as `toolspan serve` runs it (its server and its access log) on `script`."""
    async with gateway(Settings(port=0, telemetry=False, trajectory_store=False, **settings), policy=script) as (
            url, _, _):
        yield url


@pytest.fixture
def logged(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """The gateway's log records, INFO and above."""
    caplog.set_level(logging.INFO, logger="toolspan")
    return caplog


def message_of(line: str, log_format: str) -> str:
    return str(json.loads(line)["message"]) if log_format == "json" else line


def gateway_records(logged: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in logged.records if r.name.startswith("toolspan")]


@FORMATS
async def test_a_path_cannot_write_a_log_line(logged: pytest.LogCaptureFixture, log_format: str) -> None:
    async with served(Script()) as url, aiohttp.ClientSession() as http:
        # A CR, an ESC (a screen clear), a C1 CSI and a right-to-left override, percent-encoded: the
        # router decodes them, and the provider's 502 is logged with the decoded path.
        relayed = URL(f"{url}/v1/responses/resp_1%0d%1b[2J%c2%9b%e2%80%aeevil", encoded=True)
        async with http.get(relayed, headers={"X-Echo-Status": "502"}) as response:
            assert response.status == 502
        forged = URL(f"{url}/v1/models%0d%0a{FAKE_LINE.replace(' ', '%20')}%1b[2J", encoded=True)
        async with http.get(forged) as response:
            assert response.status == 404
    records = gateway_records(logged)
    lines = log_lines(records, installed_formatter(log_format))
    assert len(lines) == len(records)  # one line each
    assert [line for line in lines if UNSAFE.search(line)] == []
    assert [r.name for r in records].count(ACCESS_LOGGER) == 2
    [warning] = [message_of(line, log_format) for line, r in zip(lines, records, strict=True)
                 if r.levelno == logging.WARNING]
    assert "GET /v1/responses/resp_1\\r\\u001b[2J\\u009b\\u202eevil: the provider answered 502" in warning


@FORMATS
async def test_a_provider_error_cannot_write_a_log_line(logged: pytest.LogCaptureFixture, log_format: str) -> None:
    script = Script().then(Reply(status=500, error=f"overloaded\r\n{FAKE_LINE}\x1b]0;owned\x07\u2028"))
    async with served(script) as url, openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-caller",
                                                         max_retries=0) as client:
        with pytest.raises(openai.APIStatusError) as failed:
            await client.chat.completions.create(model="test-model", messages=USER)  # type: ignore[arg-type]
    assert failed.value.status_code == 502
    records = gateway_records(logged)
    lines = log_lines(records, installed_formatter(log_format))
    assert len(lines) == len(records)
    assert [line for line in lines if UNSAFE.search(line)] == []
    [warning] = [message_of(line, log_format) for line, r in zip(lines, records, strict=True)
                 if r.levelno == logging.WARNING]
    assert f"overloaded\\r\\n{FAKE_LINE}\\u001b]0;owned\\u0007\\u2028" in warning


# Each a credential by its name, or (tenant_id) by the operator's redact list; `limit` is none.
QUERY_SECRETS = {"api_key": "qs-secret-1", "API-KEY": "qs-secret-2", "Key": "qs-secret-3", "token": "qs-secret-4",
                 "sig": "qs-secret-5", "access_token": "qs-secret-6", "tenant_id": "qs-secret-7"}


@FORMATS
@pytest.mark.parametrize("refused", [False, True], ids=["accepted", "refused"])
async def test_query_credentials_are_masked_in_the_access_log(logged: pytest.LogCaptureFixture, log_format: str,
                                                               refused: bool) -> None:
    keys = {"keys": {"app": {"key": TEST_KEY}}} if refused else {}
    query = "&".join(f"{name}={value}" for name, value in QUERY_SECRETS.items())
    async with (served(Script(), redact_keys=REDACT_TENANT, **keys) as url, aiohttp.ClientSession() as http,
                http.get(f"{url}/v1/models?{query}&limit=10") as response):
        assert response.status == (401 if refused else 200)
    records = gateway_records(logged)
    formatter = installed_formatter(log_format)
    [access] = [formatter.format(r) for r in records if r.name == ACCESS_LOGGER]
    masked = "&".join(f"{name}=[REDACTED]" for name in QUERY_SECRETS)
    assert f"/v1/models?{masked}&limit=10 HTTP/1.1" in message_of(access, log_format)
    if log_format == "json":
        assert json.loads(access)["path"] == f"/v1/models?{masked}&limit=10"
    assert [line for line in log_lines(records, formatter) if "qs-secret" in line] == []


# An Anthropic-style client's key, a token and a secret header by the redact list, and one by the
# operator's own addition to it; X-Request-Label is nobody's secret.
CALLER_SECRETS = {"x-api-key": "sk-ant-caller-1", "X-Auth-Token": "caller-token-2", "X-Secret-Thing": "caller-3",
                  "X-Tenant-Id": "caller-4"}
OWN_KEY = "sk-operator-key-0"
MODES = {"gateway-keys": {"keys": {"app": {"key": TEST_KEY}}}, "upstream-api-key": {"upstream_api_key": OWN_KEY},
         "both": {"keys": {"app": {"key": TEST_KEY}}, "upstream_api_key": OWN_KEY}}


def lower(headers: dict[str, str]) -> dict[str, str]:
    return {name.lower(): value for name, value in headers.items()}


def assert_no_caller_secret(received: dict[str, str], mode: str) -> None:
    received = lower(received)
    assert received.keys().isdisjoint(lower(CALLER_SECRETS))
    assert not set(received.values()) & set(CALLER_SECRETS.values())
    assert received["x-request-label"] == "kept"  # the caller's other headers still go on
    assert received.get("authorization") == (f"Bearer {OWN_KEY}" if "upstream_api_key" in MODES[mode] else None)


@pytest.mark.parametrize("mode", MODES)
async def test_a_callers_credentials_stay_behind_on_chat(make_stack: StackFactory, mode: str) -> None:
    stack = await make_stack(redact_keys=REDACT_TENANT, **MODES[mode])
    stack.script.then(Reply(content="hi"))
    client = stack.client.with_options(default_headers={**CALLER_SECRETS, "X-Request-Label": "kept"})
    await client.chat.completions.create(model="test-model", messages=USER)  # type: ignore[arg-type]
    [received] = stack.model.request_headers
    assert_no_caller_secret(received, mode)


@pytest.mark.parametrize("mode", MODES)
async def test_a_callers_credentials_stay_behind_on_a_pass_through_route(
        make_gateway: GatewayFactory, aiohttp_server: AiohttpServer, mode: str) -> None:
    provider = Provider()
    upstream = await aiohttp_server(provider.app())
    served_by = await make_gateway(Settings(upstream=str(upstream.make_url("/v1")), trajectory_store=False,
                                            redact_keys=REDACT_TENANT, **MODES[mode]))
    client = served_by.client.with_options(default_headers={**CALLER_SECRETS, "X-Request-Label": "kept"})
    await client.get("/models", cast_to=dict)  # type: ignore[type-var]
    [received] = provider.received
    assert_no_caller_secret(received.headers, mode)


async def test_without_keys_or_an_own_key_the_callers_credentials_go_on(make_stack: StackFactory) -> None:
    """The provider is the caller's business then: its key and its other headers reach it."""
    stack = await make_stack()
    stack.script.then(Reply(content="hi"))
    client = stack.client.with_options(default_headers=CALLER_SECRETS)
    await client.chat.completions.create(model="test-model", messages=USER)  # type: ignore[arg-type]
    [received] = stack.model.request_headers
    assert lower(received).items() >= {**lower(CALLER_SECRETS), "authorization": f"Bearer {TEST_KEY}"}.items()
