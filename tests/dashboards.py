"""Reading the Grafana dashboards as Grafana lays them out and shows them, for the tests that check
them (tests/test_deploy.py against the files, tests/e2e/test_prometheus.py against a real
Prometheus)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DASHBOARD_DIR = Path(__file__).resolve().parents[1] / "dashboards"
NO_DATA = "No data"  # what Grafana shows for a panel without data, unless the panel says otherwise


def load_dashboard(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def all_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    panels = []
    for panel in dashboard.get("panels", []):
        panels.append(panel)
        panels.extend(panel.get("panels", []))  # collapsed rows hold their panels
    return panels


def row_members(dashboard: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Each row's title and the panels Grafana puts under it: a collapsed row's own `panels`; for an
    open row, the panels below it down to the next row (by position on the grid, which is how
    Grafana reads them). Panels above the first row are under the title ""."""
    members: dict[str, list[dict[str, Any]]] = {"": []}
    current = ""
    placed = sorted(dashboard.get("panels", []), key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"]))
    for panel in placed:
        if panel.get("type") == "row":
            current = panel["title"]
            assert current not in members, f"two rows titled {current!r}"
            members[current] = list(panel.get("panels", []))
        else:
            members[current].append(panel)
    if not members[""]:
        del members[""]
    return members


def panel_querying(dashboard: dict[str, Any], expr: str) -> dict[str, Any]:
    """The one panel with a query that is exactly `expr`."""
    [found] = [p for p in all_panels(dashboard) if any(t.get("expr") == expr for t in p.get("targets", []))]
    return found


def shown(panel: dict[str, Any], value: float | None) -> str:
    """The text a single-value panel shows for `value` (None: the query returned nothing): its
    value mappings, else its `noValue` text for nothing, else the number."""
    defaults = panel.get("fieldConfig", {}).get("defaults", {})
    key = "null" if value is None else format(value, "g")
    for mapping in defaults.get("mappings", []):
        if mapping["type"] == "value" and value is not None and key in mapping["options"]:
            return str(mapping["options"][key]["text"])
        if mapping["type"] == "special" and value is None and mapping["options"]["match"] in ("null", "null+nan"):
            return str(mapping["options"]["result"]["text"])
    if value is None:
        return str(defaults.get("noValue", NO_DATA))
    return key
