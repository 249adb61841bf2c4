"""The provider client's SSE reading (gateway.provider.client.sse_events), as a property: however a
provider's stream is cut, the gateway assembles the same answer.

The bytes of the SSE stream are split into network reads anywhere (inside an event, a line ending
or a multi-byte character) and reach the SSE reader one read at a time, as the provider's
connection delivers them. (An answer cut into deltas anywhere: tests/apis/*/test_answer.py.)"""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import _assembled, _feed

CORPUS = Path(__file__).parents[1] / "corpus"
RECORDINGS = sorted(path for path in CORPUS.glob("*.sse") if "error" not in path.stem)  # streams that complete


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({cut % (len(data) + 1) for cut in cuts})
    return [data[start:end] for start, end in zip([0, *points], [*points, len(data)], strict=True)]


@settings(max_examples=60, deadline=None)
@given(recording=st.sampled_from(RECORDINGS), cuts=st.lists(st.integers(min_value=0), max_size=40))
def test_any_split_of_a_recorded_stream_into_reads_assembles_the_same(recording: Path, cuts: list[int]) -> None:
    data = recording.read_bytes()
    whole_shown, whole_turn = _assembled(_feed([data]))
    shown, turn = _assembled(_feed(_split(data, cuts)))
    assert shown == whole_shown
    assert turn.body == whole_turn.body
    assert turn.calls == whole_turn.calls


@settings(max_examples=30, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0), max_size=12))
def test_every_byte_of_a_stream_read_alone_assembles_the_same(cuts: list[int]) -> None:
    data = (CORPUS / "vllm_reasoning.sse").read_bytes().replace(b"9.11", "9.11 é ✓ 𝄞".encode())
    one_by_one = [data[i:i + 1] for i in range(len(data))]
    assert _assembled(_feed(one_by_one))[1].body == _assembled(_feed(_split(data, cuts)))[1].body
    assert "𝄞" in str(_assembled(_feed(one_by_one))[1].body)

