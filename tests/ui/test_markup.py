"""HTML built the autoescaping way (gateway.ui.markup): values escaped, markup kept."""

from __future__ import annotations

from gateway.ui.markup import Html, render


def test_values_are_escaped_and_markup_is_not() -> None:
    shown = render("<td title={quoted}>{text}{markup}</td>", quoted='"x" onclick="y"', text="<b>&</b>",
                   markup=Html("<br>"))
    assert shown == "<td title=&quot;x&quot; onclick=&quot;y&quot;>&lt;b&gt;&amp;&lt;/b&gt;<br></td>"
