"""Helpers of the page's tests: reading its tables back."""

from __future__ import annotations

from html.parser import HTMLParser


class _Rows(HTMLParser):
    """The cells' text of each row of the table with a given id."""

    def __init__(self, table_id: str) -> None:
        super().__init__()
        self.table_id = table_id
        self.rows: list[list[str]] = []
        self._inside = False
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self._inside = dict(attrs).get("id") == self.table_id
        elif self._inside and tag == "tr":
            self.rows.append([])
        elif self._inside and tag == "td":
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._inside = False
        elif tag == "td" and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def table_rows(page: str, table_id: str) -> list[list[str]]:
    """The cells' text of each row of the page's table with id `table_id` (its header row left out)."""
    parser = _Rows(table_id)
    parser.feed(page)
    return [row for row in parser.rows if row]  # the header row has no cells
