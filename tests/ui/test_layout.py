"""The pieces every /ui page shares (gateway.ui.layout): trace links."""

from __future__ import annotations

from gateway.ui.layout import trace_link

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


def test_trace_ids_link_only_when_they_are_trace_ids() -> None:
    template = "https://tempo.example/trace/{trace_id}"
    assert f'href="https://tempo.example/trace/{TRACE_ID}"' in trace_link(TRACE_ID, template)
    assert "href" not in trace_link("javascript:alert(1)", template)
    assert "href" not in trace_link(TRACE_ID, None)
