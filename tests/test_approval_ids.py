"""approval_id / split_approval_id (gateway.state.base): the id of a client's approval of a held
call names the turn, the call and the arguments approved, and reads back to exactly those."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.state.base import approval_id, split_approval_id

DIGEST = hashlib.sha256(b"arguments").hexdigest()
_TOKENS = st.from_regex(r"[0-9a-f]{1,16}", fullmatch=True)  # as the state makes them (secrets.token_hex)
_CALL_IDS = st.text(st.characters(codec="ascii", exclude_characters="\x00"), min_size=1, max_size=40)
_DIGESTS = st.binary(max_size=16).map(lambda data: hashlib.sha256(data).hexdigest())


@given(_TOKENS, _CALL_IDS, _DIGESTS)
def test_an_approval_id_reads_back_to_its_turn_call_and_digest(token: str, call_id: str, digest: str) -> None:
    made = approval_id(token, call_id, digest)
    assert made.startswith("mcpr_tspan_")
    assert split_approval_id(made) == (token, call_id, digest[:32])


@given(_TOKENS, st.lists(st.sampled_from(["_", "call", "x_y", "__", "9"]), min_size=1, max_size=6).map("".join))
def test_call_ids_full_of_underscores_read_back(token: str, call_id: str) -> None:
    assert split_approval_id(approval_id(token, call_id, DIGEST)) == (token, call_id, DIGEST[:32])


@pytest.mark.parametrize("value", [
    None, 7, "", "mcpr_", "mcp_tspan_ab_" + DIGEST[:32] + "_call_1", "mcpr_tspan_ab", f"mcpr_tspan_ab_{DIGEST[:32]}",
    f"mcpr_tspan_ab_{DIGEST[:32]}_", f"mcpr_tspan_ab_{DIGEST[:31]}_call_1", f"mcpr_tspan_ab_{DIGEST[:32].upper()}_c",
    f"mcpr_tspan__{DIGEST[:32]}_call_1", f"mcpr_tspan_ab_{'g' * 32}_call_1", "call_1",
])
def test_anything_else_is_no_approval_id(value: object) -> None:
    assert split_approval_id(value) is None
