"""What the commands that talk to a running gateway share (`toolspan approvals`, `toolspan keys`):
the --url and --key options, one request over the gateway's HTTP API, and its failure as one line
with the gateway's own message (exit 1)."""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from gateway.settings.load import client_key

DEFAULT_URL = "http://127.0.0.1:8080"
KEY_VARIABLE = "TOOLSPAN_API_KEY"  # the client's key, as the openai client reads OPENAI_API_KEY
TIMEOUT_SECONDS = 30.0


class CommandFailed(Exception):
    """What went wrong, for one line on stderr (exit 1)."""


def gateway_options(key_help: str) -> argparse.ArgumentParser:
    """--url and --key, as a parent of each subcommand's parser."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=DEFAULT_URL, help=f"the gateway (default {DEFAULT_URL})")
    common.add_argument("--key", help=f"a gateway key (default: ${KEY_VARIABLE}){key_help}")
    return common


def call(options: argparse.Namespace, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
    """One request to the gateway; its JSON answer, or CommandFailed with its error's message."""
    url = options.url.rstrip("/") + path
    headers = {"Accept": "application/json"}
    key = options.key if options.key is not None else client_key(KEY_VARIABLE)
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = None
    if body is not None:
        data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise CommandFailed(f"{exc.code}: {_message(exc.read())}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise CommandFailed(f"cannot reach the gateway at {options.url}: {reason}") from None
    except ValueError:
        raise CommandFailed(f"{url} did not answer with JSON: is it a toolspan gateway?") from None


def _message(body: bytes) -> str:
    """The gateway's error message (OpenAI's shape), else the start of whatever came."""
    try:
        error = json.loads(body)["error"]
        return f"{error['message']}" + (f" ({error['code']})" if error.get("code") else "")
    except (ValueError, KeyError, TypeError):
        return body[:200].decode("utf-8", "replace") or "(no body)"
