"""Raw tool arguments made safe to put on a span: secrets masked, length bounded."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

MASK = "[REDACTED]"


def _secret(key: str, keys: Sequence[str]) -> bool:
    low = key.lower()
    return any(k in low for k in keys)


def _mask(value: Any, keys: Sequence[str]) -> Any:
    if isinstance(value, dict):
        return {k: MASK if _secret(str(k), keys) else _mask(v, keys) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask(v, keys) for v in value]
    return value


def _mask_text(raw: str, keys: Sequence[str]) -> str:
    """Best effort for text that is not JSON: mask `"secret_key": value` pairs we can see."""
    if not keys:
        return raw
    alternatives = "|".join(re.escape(k) for k in keys)
    pattern = re.compile(
        rf'("[^"]*(?:{alternatives})[^"]*"\s*:\s*)("(?:[^"\\]|\\.)*"?|[^,}}\]\s]+)', re.IGNORECASE)
    return pattern.sub(lambda m: f'{m.group(1)}"{MASK}"', raw)


def render_arguments(raw: str, max_chars: int, redact_keys: Sequence[str]) -> str:
    """`raw` with values under keys containing any of `redact_keys` masked, cut to `max_chars`."""
    keys = [k.lower() for k in redact_keys]
    if len(raw) > 16 * max_chars:
        text = _mask_text(raw[: 2 * max_chars], keys)  # too long to decode on every rejection
    else:
        try:
            decoded = json.loads(raw)
            masked = keys and isinstance(decoded, dict | list)
            text = json.dumps(_mask(decoded, keys), ensure_ascii=False) if masked else raw
        except (ValueError, RecursionError):
            text = _mask_text(raw, keys)
    if len(text) > max_chars:
        return text[:max_chars] + f"...[truncated; {len(raw)} chars sent]"
    return text
