"""Which entry goes when a table bounded per gateway key is full: the rule every such table keeps
(held turns, response owners, links, sent calls, replays, pending approvals, /mcp sessions), in
memory here and in Redis as one piece of Lua (gateway.state.redis_fair).

The whole table full, the entry to go is the oldest of the owner holding the most, counting the
entry being added; among owners holding as many, the one whose oldest entry is oldest. So an owner
holding no more than its fair share (the capacity over the owners holding any) never loses an entry
to another's: the owner chosen holds more than the one adding, or is the one adding. An owner is a
gateway key's name, or None without keys (then there is one owner, and the rule is least recently
used)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

Owner = TypeVar("Owner")


def fair_victim(counts: Mapping[Owner, int], oldest: Callable[[Owner], float]) -> Owner:
    """The owner whose oldest entry goes: of those in `counts` (how many each holds, the entry being
    added counted) holding the most, the one whose `oldest` (when its oldest entry was last used,
    or when it ends) is earliest. `counts` must not be empty."""
    most = max(counts.values())
    tied = [owner for owner, count in counts.items() if count == most]
    return tied[0] if len(tied) == 1 else min(tied, key=oldest)
